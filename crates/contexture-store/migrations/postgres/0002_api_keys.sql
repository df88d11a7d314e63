-- API keys of the HTTP server, stored by the hash of the key (never the key itself), each
-- bound to a tenant. A revoked key keeps its row (with `revoked_at`), its id and its hash:
-- neither can be used again.
CREATE TABLE api_keys (
    id          TEXT PRIMARY KEY,
    -- Insertion order: orders keys created in the same millisecond.
    ord         BIGINT GENERATED ALWAYS AS IDENTITY,
    tenant      TEXT NOT NULL,
    name        TEXT NOT NULL,
    key_hash    TEXT NOT NULL UNIQUE,
    created_at  BIGINT NOT NULL,
    revoked_at  BIGINT
);
CREATE INDEX api_keys_tenant ON api_keys (tenant, created_at);
