-- A thread's own retention policy for its request records (JSON, NULL: none), and where
-- pruning them starts reading: every request record of the thread below `request_floor`
-- has had its messages removed already.
ALTER TABLE threads ADD COLUMN retention TEXT;
ALTER TABLE threads ADD COLUMN request_floor INTEGER NOT NULL DEFAULT 0;
