-- The bytes of the event bodies each thread holds, its fork prefix included: what a read of
-- the whole thread loads, kept up to date by every append and fork so that a limit on it
-- costs no scan.
ALTER TABLE threads ADD COLUMN bytes BIGINT NOT NULL DEFAULT 0;

UPDATE threads SET bytes = own.bytes
FROM (SELECT thread_id, SUM(octet_length(body)) AS bytes FROM events GROUP BY thread_id) AS own
WHERE own.thread_id = threads.id;

-- A fork's shared prefix: every ancestor's own events up to the seq the chain shares.
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
    GROUP BY chain.fork
)
UPDATE threads SET bytes = threads.bytes + prefix.bytes
FROM prefix WHERE prefix.fork = threads.id;
