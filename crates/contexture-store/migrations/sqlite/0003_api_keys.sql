-- API keys of the HTTP server, stored by the hash of the key (never the key itself), each
-- bound to a tenant. A revoked key keeps its row (with `revoked_at`), its id and its hash:
-- neither can be used again.
-- A rowid table: `rowid` orders keys created in the same millisecond by insertion.
CREATE TABLE api_keys (
    id          TEXT PRIMARY KEY,
    tenant      TEXT NOT NULL,
    name        TEXT NOT NULL,
    key_hash    TEXT NOT NULL UNIQUE,
    created_at  INTEGER NOT NULL,
    revoked_at  INTEGER
);
CREATE INDEX api_keys_tenant ON api_keys (tenant, created_at);
