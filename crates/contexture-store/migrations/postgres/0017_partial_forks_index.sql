-- Forks only: an append rewrites its thread's row (its last seq, sizes and time), and the
-- index of forks by parent no longer gets an entry for each rewrite of a thread that is no
-- fork. Every query of it asks for a parent, which a thread without one never matches.
DROP INDEX threads_forks;
CREATE INDEX threads_forks ON threads (parent_id, created_at, id COLLATE "C")
    WHERE parent_id IS NOT NULL;
