-- The queue of workflow executions: one row a run, from its enqueueing to its end. The
-- server claims a queued run, or a running one whose lease ran out (a server that stopped
-- or restarted), and holds it by a lease; every claim raises the epoch, so an earlier
-- holder's renewals and finish do nothing.
CREATE TABLE execution_queue (
    id TEXT PRIMARY KEY,
    tenant TEXT NOT NULL,
    state TEXT NOT NULL CHECK (state IN ('queued', 'running', 'finished')),
    owner TEXT,
    attempts INTEGER NOT NULL DEFAULT 0,
    epoch INTEGER NOT NULL DEFAULT 0,
    request TEXT NOT NULL,
    enqueued_at INTEGER NOT NULL,
    started_at INTEGER,
    lease_until INTEGER,
    finished_at INTEGER,
    outcome TEXT
);
-- What a claim looks at: the unfinished runs, oldest first.
CREATE INDEX execution_queue_open ON execution_queue (enqueued_at, id) WHERE state <> 'finished';
