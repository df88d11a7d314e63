-- Conversation threads move under their tenant. They were stored as
-- `conversation:TENANT:USER:WORKFLOW[:CHAT]`, outside every tenant's ids, so no tenant could
-- list, read or delete them; a tenant's threads are `TENANT/ID`, and a conversation's id as
-- its tenant knows it is `conversation:USER:WORKFLOW[:CHAT]`. The new id has the old one's
-- length, so the stored sizes stay right. A thread the tenant itself already keeps under the
-- new id is left where it is.
CREATE TEMP TABLE renamed AS
SELECT id AS old,
       substr(id, 14, instr(substr(id, 14), ':') - 1) || '/conversation:'
           || substr(id, 14 + instr(substr(id, 14), ':')) AS new
FROM threads
WHERE substr(id, 1, 13) = 'conversation:' AND instr(substr(id, 14), ':') > 1;

DELETE FROM renamed WHERE new IN (SELECT id FROM threads);

INSERT INTO threads
    (id, parent_id, fork_seq, last_seq, created_at, updated_at, bytes, message_bytes,
     retention, request_floor)
SELECT renamed.new, parent_id, fork_seq, last_seq, created_at, updated_at, bytes,
       message_bytes, retention, request_floor
FROM threads JOIN renamed ON threads.id = renamed.old;

UPDATE events SET thread_id = (SELECT new FROM renamed WHERE old = events.thread_id)
WHERE thread_id IN (SELECT old FROM renamed);

UPDATE threads SET parent_id = (SELECT new FROM renamed WHERE old = threads.parent_id)
WHERE parent_id IN (SELECT old FROM renamed);

UPDATE turn_queue SET thread_id = (SELECT new FROM renamed WHERE old = turn_queue.thread_id)
WHERE thread_id IN (SELECT old FROM renamed);

-- The runs that continued a conversation name its thread; the text is replaced byte for
-- byte, so the event's other fields stay as they were written.
UPDATE events SET body = (
    SELECT replace(events.body, '"conversation":' || json_quote(old),
                   '"conversation":' || json_quote(new))
    FROM renamed WHERE old = json_extract(events.body, '$.conversation')
)
WHERE kind = 'run_started'
  AND json_extract(body, '$.conversation') IN (SELECT old FROM renamed);

DELETE FROM threads WHERE id IN (SELECT old FROM renamed);

DROP TABLE renamed;
