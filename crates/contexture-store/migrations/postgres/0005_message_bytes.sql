-- The bytes of each thread's messages as stored (its message_appended events' bodies, each
-- message once), its fork prefix included: the text the thread holds, beside `bytes`, all
-- it holds. Kept up to date by every append and fork.
ALTER TABLE threads ADD COLUMN message_bytes BIGINT NOT NULL DEFAULT 0;

UPDATE threads SET message_bytes = own.bytes
FROM (SELECT thread_id, SUM(octet_length(body)) AS bytes FROM events
      WHERE kind = 'message_appended' GROUP BY thread_id) AS own
WHERE own.thread_id = threads.id;

-- A fork's shared prefix: every ancestor's own message events up to the seq the chain shares.
WITH RECURSIVE chain (fork, ancestor, shared) AS (
    SELECT id, parent_id, fork_seq FROM threads WHERE parent_id IS NOT NULL
    UNION ALL
    SELECT chain.fork, parent.parent_id, LEAST(chain.shared, parent.fork_seq)
    FROM chain JOIN threads AS parent ON parent.id = chain.ancestor
    WHERE parent.parent_id IS NOT NULL
),
prefix (fork, bytes) AS (
    SELECT chain.fork, COALESCE(SUM(octet_length(events.body)), 0)
    FROM chain JOIN events ON events.thread_id = chain.ancestor AND events.seq <= chain.shared
    WHERE events.kind = 'message_appended'
    GROUP BY chain.fork
)
UPDATE threads SET message_bytes = threads.message_bytes + prefix.bytes
FROM prefix WHERE prefix.fork = threads.id;
