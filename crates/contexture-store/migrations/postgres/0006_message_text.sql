-- A thread's message bytes count the messages of every message event (message_appended,
-- step_message, context_replaced, merged), each message serialized on its own: an
-- execution's text is its step messages. Recomputed for every thread, fork prefixes included.
-- (`json`, unlike `jsonb`, keeps each value's text as stored.)
CREATE TEMP TABLE message_text ON COMMIT DROP AS
SELECT thread_id, seq,
       CASE kind
           WHEN 'message_appended' THEN octet_length(body)
           WHEN 'step_message' THEN octet_length((body::json -> 'message')::text)
           WHEN 'context_replaced' THEN (
               SELECT COALESCE(SUM(octet_length(value::text)), 0)
               FROM json_array_elements(body::json -> 'replacement') AS value)
           WHEN 'merged' THEN (
               SELECT COALESCE(SUM(octet_length(value::text)), 0)
               FROM json_array_elements(COALESCE(body::json -> 'messages', '[]'::json)) AS value)
       END::BIGINT AS bytes
FROM events
WHERE kind IN ('message_appended', 'step_message', 'context_replaced', 'merged');

UPDATE threads SET message_bytes = COALESCE(
    (SELECT SUM(bytes) FROM message_text WHERE message_text.thread_id = threads.id), 0);

WITH RECURSIVE chain (fork, ancestor, shared) AS (
    SELECT id, parent_id, fork_seq FROM threads WHERE parent_id IS NOT NULL
    UNION ALL
    SELECT chain.fork, parent.parent_id, LEAST(chain.shared, parent.fork_seq)
    FROM chain JOIN threads AS parent ON parent.id = chain.ancestor
    WHERE parent.parent_id IS NOT NULL
),
prefix (fork, bytes) AS (
    SELECT chain.fork, COALESCE(SUM(message_text.bytes), 0)
    FROM chain JOIN message_text
        ON message_text.thread_id = chain.ancestor AND message_text.seq <= chain.shared
    GROUP BY chain.fork
)
UPDATE threads SET message_bytes = threads.message_bytes + prefix.bytes
FROM prefix WHERE prefix.fork = threads.id;
