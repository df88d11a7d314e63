-- Threads and their append-only event logs.
CREATE TABLE threads (
    id          TEXT PRIMARY KEY,
    -- For a fork: the parent and the parent's last seq it shares.
    parent_id   TEXT REFERENCES threads (id),
    fork_seq    BIGINT,
    -- The seq of the thread's last event (a fork's seqs continue the shared prefix). Appends
    -- lock this row (SELECT ... FOR UPDATE) to assign gap-free seqs.
    last_seq    BIGINT NOT NULL,
    created_at  BIGINT NOT NULL,
    updated_at  BIGINT NOT NULL
);
CREATE INDEX threads_parent ON threads (parent_id);
CREATE INDEX threads_updated ON threads (updated_at);

CREATE TABLE events (
    thread_id        TEXT NOT NULL REFERENCES threads (id),
    seq              BIGINT NOT NULL,
    kind             TEXT NOT NULL,
    -- JSON kept as text, byte for byte.
    body             TEXT NOT NULL,
    -- Per-message token counts: "name=count,name=count;..." (see src/record.rs).
    tokens           TEXT,
    idempotency_key  TEXT,
    created_at       BIGINT NOT NULL,
    PRIMARY KEY (thread_id, seq),
    UNIQUE (thread_id, idempotency_key)
);
