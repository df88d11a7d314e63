-- The queue of workflow executions shared by every server: one row a run, from its
-- enqueueing to its end. A server claims a queued run, or a running one whose lease ran
-- out (its server stopped renewing), and holds it by a lease on the database's clock;
-- every claim raises the epoch, so an earlier holder's renewals and finish do nothing.
CREATE TABLE execution_queue (
    id TEXT PRIMARY KEY,
    tenant TEXT NOT NULL,
    state TEXT NOT NULL CHECK (state IN ('queued', 'running', 'finished')),
    owner TEXT,
    attempts BIGINT NOT NULL DEFAULT 0,
    epoch BIGINT NOT NULL DEFAULT 0,
    request TEXT NOT NULL,
    enqueued_at BIGINT NOT NULL,
    started_at BIGINT,
    lease_until BIGINT,
    finished_at BIGINT,
    outcome TEXT
);
-- What a claim looks at: the unfinished runs, oldest first.
CREATE INDEX execution_queue_open ON execution_queue (enqueued_at, id) WHERE state <> 'finished';
