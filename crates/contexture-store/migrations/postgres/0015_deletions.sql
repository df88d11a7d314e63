-- How many times threads have been deleted (by delete or prune), by any server. Threads only
-- grow otherwise, so a projection a server folded from a thread's events stays right for as
-- long as this count does not change: each server's projection cache reads it in the same
-- statement (one snapshot) as the events it adds.
CREATE TABLE deletions (
    id INTEGER PRIMARY KEY CHECK (id = 1),
    count BIGINT NOT NULL
);
INSERT INTO deletions (id, count) VALUES (1, 0);
