-- How many times a run's holder gave it up on a database error while the database still
-- answered (the error is the run's own, not an outage): past the server's cap, the run is
-- ended as failed instead of being taken up again forever.
ALTER TABLE execution_queue ADD COLUMN failures INTEGER NOT NULL DEFAULT 0;
