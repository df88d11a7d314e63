-- Marks ordinary (non-system) message events, so that loading a thread's projection can skip
-- the bodies of the messages its last context replace covers without reading them.
-- 1: a message event whose role is not system or developer; NULL: any other event.
ALTER TABLE events ADD COLUMN ordinary_message INTEGER;

-- Rows written before this migration: the storage form writes `role` first.
UPDATE events SET ordinary_message = 1
WHERE kind = 'message_appended'
  AND substr(body, 1, 16) <> '{"role":"system"'
  AND substr(body, 1, 19) <> '{"role":"developer"';

-- The other events (few: context operations, requests, store changes, system prompts), found
-- without scanning the messages.
CREATE INDEX events_special ON events (thread_id, seq) WHERE ordinary_message IS NULL;
