-- Threads newest first (the inspector's list: by last append, then id in byte order, under a
-- prefix), read from an index in that order, a page at a time from a cursor, instead of
-- sorted whole. It serves every read `threads_updated` served (pruning's `updated_at < $1`),
-- so that one goes: each append rewrites the thread's `updated_at`, and one index of it is
-- enough to keep.
CREATE INDEX threads_recent ON threads (updated_at, id COLLATE "C");
DROP INDEX threads_updated;

-- A thread's forks oldest first (by creation, then id in byte order), read from an index in
-- that order. It serves every read `threads_parent` served (a thread's forks, the parent
-- key's checks), so that one goes.
CREATE INDEX threads_forks ON threads (parent_id, created_at, id COLLATE "C");
DROP INDEX threads_parent;
