-- How many times threads have been deleted (by delete or prune), in any process. Threads
-- only grow otherwise, so a projection a reader folded from a thread's events stays right
-- for as long as this count does not change: the store's projection cache checks it in
-- the same read transaction as the events it adds.
CREATE TABLE deletions (
    id INTEGER PRIMARY KEY CHECK (id = 1),
    count INTEGER NOT NULL
);
INSERT INTO deletions (id, count) VALUES (1, 0);
