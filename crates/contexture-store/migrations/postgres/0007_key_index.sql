-- The index of idempotency keys holds only the events that have one: most have none, and
-- each entry took as much room as the primary key's.
ALTER TABLE events DROP CONSTRAINT events_thread_id_idempotency_key_key;
CREATE UNIQUE INDEX events_keys ON events (thread_id, idempotency_key)
    WHERE idempotency_key IS NOT NULL;
