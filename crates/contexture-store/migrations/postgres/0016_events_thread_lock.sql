-- An event's thread is held by the thread row's lock instead of a foreign key: every write
-- of events takes that lock first (an append's upsert of the row, a fork's insert of it) and
-- every delete takes it before it deletes events (`SELECT ... FOR UPDATE`), so an append
-- either lands before a delete, which deletes it too, or waits for it and starts a new
-- thread. The key's check cost each append an extra query inside the database.
ALTER TABLE events DROP CONSTRAINT IF EXISTS events_thread_id_fkey;
