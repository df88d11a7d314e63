-- A thread's message bytes count the messages of every message event (message_appended,
-- step_message, context_replaced, merged), each message serialized on its own: an
-- execution's text is its step messages. Recomputed for every thread, fork prefixes included.
CREATE TEMP TABLE message_text AS
SELECT thread_id, seq,
       CASE kind
           WHEN 'message_appended' THEN length(CAST(body AS BLOB))
           WHEN 'step_message' THEN length(CAST(json_extract(body, '$.message') AS BLOB))
           WHEN 'context_replaced' THEN (
               SELECT COALESCE(SUM(length(CAST(value AS BLOB))), 0)
               FROM json_each(body, '$.replacement'))
           WHEN 'merged' THEN (
               SELECT COALESCE(SUM(length(CAST(value AS BLOB))), 0)
               FROM json_each(body, '$.messages'))
       END AS bytes
FROM events
WHERE kind IN ('message_appended', 'step_message', 'context_replaced', 'merged');

UPDATE threads SET message_bytes = (
    SELECT COALESCE(SUM(bytes), 0) FROM message_text WHERE message_text.thread_id = threads.id
);

WITH RECURSIVE chain (fork, ancestor, shared) AS (
    SELECT id, parent_id, fork_seq FROM threads WHERE parent_id IS NOT NULL
    UNION ALL
    SELECT chain.fork, parent.parent_id, MIN(chain.shared, parent.fork_seq)
    FROM chain JOIN threads AS parent ON parent.id = chain.ancestor
    WHERE parent.parent_id IS NOT NULL
),
prefix (fork, bytes) AS (
    SELECT chain.fork, COALESCE(SUM(message_text.bytes), 0)
    FROM chain JOIN message_text
        ON message_text.thread_id = chain.ancestor AND message_text.seq <= chain.shared
    GROUP BY chain.fork
)
UPDATE threads
SET message_bytes = message_bytes + (SELECT prefix.bytes FROM prefix WHERE prefix.fork = threads.id)
WHERE id IN (SELECT fork FROM prefix);

DROP TABLE message_text;
