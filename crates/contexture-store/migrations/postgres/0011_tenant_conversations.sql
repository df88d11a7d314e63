-- Conversation threads move under their tenant. They were stored as
-- `conversation:TENANT:USER:WORKFLOW[:CHAT]`, outside every tenant's ids, so no tenant could
-- list, read or delete them; a tenant's threads are `TENANT/ID`, and a conversation's id as
-- its tenant knows it is `conversation:USER:WORKFLOW[:CHAT]`. The new id has the old one's
-- length, so the stored sizes stay right. A thread the tenant itself already keeps under the
-- new id is left where it is.
CREATE TEMP TABLE renamed ON COMMIT DROP AS
SELECT id AS old,
       substr(id, 14, strpos(substr(id, 14), ':') - 1) || '/conversation:'
           || substr(id, 14 + strpos(substr(id, 14), ':')) AS new
FROM threads
WHERE substr(id, 1, 13) = 'conversation:' AND strpos(substr(id, 14), ':') > 1;

DELETE FROM renamed WHERE new IN (SELECT id FROM threads);

INSERT INTO threads
    (id, parent_id, fork_seq, last_seq, created_at, updated_at, bytes, message_bytes,
     retention, request_floor)
SELECT renamed.new, parent_id, fork_seq, last_seq, created_at, updated_at, bytes,
       message_bytes, retention, request_floor
FROM threads JOIN renamed ON threads.id = renamed.old;

UPDATE events SET thread_id = renamed.new FROM renamed WHERE events.thread_id = renamed.old;

UPDATE threads SET parent_id = renamed.new FROM renamed WHERE threads.parent_id = renamed.old;

UPDATE turn_queue SET thread_id = renamed.new FROM renamed
WHERE turn_queue.thread_id = renamed.old;

-- The runs that continued a conversation name its thread; the text is replaced byte for
-- byte, so the event's other fields stay as they were written.
UPDATE events SET body = replace(events.body, '"conversation":' || to_json(renamed.old)::text,
                                 '"conversation":' || to_json(renamed.new)::text)
FROM renamed
WHERE events.kind = 'run_started'
  AND strpos(events.body, '"conversation":' || to_json(renamed.old)::text) > 0;

DELETE FROM threads WHERE id IN (SELECT old FROM renamed);
