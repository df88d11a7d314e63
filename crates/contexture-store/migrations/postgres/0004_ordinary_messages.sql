-- Marks ordinary (non-system) message events, so that reading a long thread's projection
-- from its end can count the newest messages' stored tokens without reading their bodies.
-- 1: a message event whose role is not system or developer; NULL: any other event.
ALTER TABLE events ADD COLUMN ordinary_message SMALLINT;

-- Rows written before this migration: the storage form writes `role` first.
UPDATE events SET ordinary_message = 1
WHERE kind = 'message_appended'
  AND left(body, 16) <> '{"role":"system"'
  AND left(body, 19) <> '{"role":"developer"';

-- The other events (few: context operations, requests, store changes, system prompts), found
-- without scanning the messages.
CREATE INDEX events_special ON events (thread_id, seq) WHERE ordinary_message IS NULL;
