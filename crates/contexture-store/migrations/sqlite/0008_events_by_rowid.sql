-- Events move to a rowid table. In the clustered (WITHOUT ROWID) table, a body longer than
-- about a quarter of a page spilled into overflow pages of its own, mostly left empty: a
-- conversation of messages of a few hundred bytes to a few kilobytes took a third more room
-- than its rows. A rowid table keeps rows of up to a page whole; the primary key becomes an
-- index. The body goes last, so that the columns before it are read without it. The index
-- of idempotency keys holds only the events that have one.
CREATE TABLE events_by_rowid (
    thread_id        TEXT NOT NULL REFERENCES threads (id),
    seq              INTEGER NOT NULL,
    kind             TEXT NOT NULL,
    tokens           TEXT,
    idempotency_key  TEXT,
    created_at       INTEGER NOT NULL,
    ordinary_message INTEGER,
    body             TEXT NOT NULL,
    PRIMARY KEY (thread_id, seq)
);

INSERT INTO events_by_rowid
    (thread_id, seq, kind, tokens, idempotency_key, created_at, ordinary_message, body)
SELECT thread_id, seq, kind, tokens, idempotency_key, created_at, ordinary_message, body
FROM events ORDER BY thread_id, seq;

DROP TABLE events;
ALTER TABLE events_by_rowid RENAME TO events;

CREATE UNIQUE INDEX events_keys ON events (thread_id, idempotency_key)
    WHERE idempotency_key IS NOT NULL;
CREATE INDEX events_special ON events (thread_id, seq) WHERE ordinary_message IS NULL;
