-- Threads and their append-only event logs.
CREATE TABLE threads (
    id          TEXT PRIMARY KEY,
    -- For a fork: the parent and the parent's last seq it shares.
    parent_id   TEXT REFERENCES threads (id),
    fork_seq    INTEGER,
    -- The seq of the thread's last event (a fork's seqs continue the shared prefix).
    last_seq    INTEGER NOT NULL,
    created_at  INTEGER NOT NULL,
    updated_at  INTEGER NOT NULL
);
CREATE INDEX threads_parent ON threads (parent_id);
CREATE INDEX threads_updated ON threads (updated_at);

CREATE TABLE events (
    thread_id        TEXT NOT NULL REFERENCES threads (id),
    seq              INTEGER NOT NULL,
    kind             TEXT NOT NULL,
    body             TEXT NOT NULL,
    -- Per-message token counts: "name=count,name=count;..." (see src/record.rs).
    tokens           TEXT,
    idempotency_key  TEXT,
    created_at       INTEGER NOT NULL,
    PRIMARY KEY (thread_id, seq),
    UNIQUE (thread_id, idempotency_key)
) WITHOUT ROWID;
