-- The bytes of each thread's messages as stored (its message_appended events' bodies, each
-- message once), its fork prefix included: the text the thread holds, beside `bytes`, all
-- it holds. Kept up to date by every append and fork.
ALTER TABLE threads ADD COLUMN message_bytes INTEGER NOT NULL DEFAULT 0;

UPDATE threads SET message_bytes = (
    SELECT COALESCE(SUM(length(CAST(body AS BLOB))), 0) FROM events
    WHERE events.thread_id = threads.id AND events.kind = 'message_appended'
);

-- A fork's shared prefix: every ancestor's own message events up to the seq the chain shares.
WITH RECURSIVE chain (fork, ancestor, shared) AS (
    SELECT id, parent_id, fork_seq FROM threads WHERE parent_id IS NOT NULL
    UNION ALL
    SELECT chain.fork, parent.parent_id, MIN(chain.shared, parent.fork_seq)
    FROM chain JOIN threads AS parent ON parent.id = chain.ancestor
    WHERE parent.parent_id IS NOT NULL
),
prefix (fork, bytes) AS (
    SELECT chain.fork, COALESCE(SUM(length(CAST(events.body AS BLOB))), 0)
    FROM chain JOIN events ON events.thread_id = chain.ancestor AND events.seq <= chain.shared
    WHERE events.kind = 'message_appended'
    GROUP BY chain.fork
)
UPDATE threads
SET message_bytes = message_bytes + (SELECT prefix.bytes FROM prefix WHERE prefix.fork = threads.id)
WHERE id IN (SELECT fork FROM prefix);
