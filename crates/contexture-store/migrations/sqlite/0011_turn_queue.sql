-- The queue of chat turns on each thread: one row a turn that waits for its thread or holds
-- it, the lowest ticket of a thread holding it. A row whose heartbeat is older than the
-- lease belongs to a server that stopped, and the next turn to renew its own removes it.
-- Bounded: a row lives as long as its turn.
CREATE TABLE turn_queue (
    ticket INTEGER PRIMARY KEY AUTOINCREMENT,
    thread_id TEXT NOT NULL,
    heartbeat_at INTEGER NOT NULL
);
CREATE INDEX turn_queue_by_thread ON turn_queue (thread_id, ticket);
