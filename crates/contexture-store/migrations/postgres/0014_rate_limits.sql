-- The request rate limits every server shares: one row a key, its theoretical arrival time
-- (GCRA) in microseconds of the database's clock. Unlogged: a limit's state need not
-- survive a crash (the buckets start full again), and its writes then cost no log flush.
CREATE UNLOGGED TABLE rate_limits (
    key TEXT PRIMARY KEY,
    tat_us BIGINT NOT NULL
);
