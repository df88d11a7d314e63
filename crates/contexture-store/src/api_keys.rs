//! API keys of the HTTP server: each bound to a tenant, stored by the hash of the key (the
//! key itself is never stored). Both stores implement [`ApiKeyStore`] (SQLite migration
//! 0003, PostgreSQL migration 0002).
//!
//! Guarantees, the same for both stores and checked by the conformance suite:
//! - creating a key never overwrites one: a key whose id or hash is already stored, even by a
//!   revoked key, is refused with [`StoreError::KeyExists`] and nothing is written;
//! - a revoked key keeps its row (listed, with `revoked_at_ms`) but is no longer found by its
//!   hash;
//! - keys are listed oldest first (keys created in the same millisecond in insertion order).

use std::future::Future;

use crate::StoreError;

/// One stored API key (never the key itself: only its hash is stored).
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct ApiKeyRecord {
    /// The key's public id, chosen by the caller (for example `ck_3f9a1b2c`).
    pub id: String,
    /// The tenant the key acts for.
    pub tenant: String,
    /// A human-readable name.
    pub name: String,
    /// When it was created, in milliseconds since the Unix epoch.
    pub created_at_ms: i64,
    /// When it was revoked, in milliseconds since the Unix epoch; `None` while it is active.
    pub revoked_at_ms: Option<i64>,
}

/// Storage of API keys, by the hash of the key.
pub trait ApiKeyStore: Send + Sync {
    /// Stores a new key; a duplicate id or hash is an error ([`StoreError::KeyExists`]),
    /// never an overwrite.
    fn create_api_key(
        &self,
        id: &str,
        tenant: &str,
        name: &str,
        key_hash: &str,
    ) -> impl Future<Output = Result<ApiKeyRecord, StoreError>> + Send;

    /// The active (not revoked) key with this hash.
    fn api_key_by_hash(
        &self,
        key_hash: &str,
    ) -> impl Future<Output = Result<Option<ApiKeyRecord>, StoreError>> + Send;

    /// Keys, oldest first; only the tenant's when given. Revoked ones included (with
    /// `revoked_at_ms`).
    fn list_api_keys(
        &self,
        tenant: Option<&str>,
    ) -> impl Future<Output = Result<Vec<ApiKeyRecord>, StoreError>> + Send;

    /// Revokes the key with this id; false when there is no active key with that id.
    fn revoke_api_key(&self, id: &str) -> impl Future<Output = Result<bool, StoreError>> + Send;
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn records_serialize_with_their_field_names() {
        let record = ApiKeyRecord {
            id: "ck_3f9a1b2c".into(),
            tenant: "acme".into(),
            name: "ci".into(),
            created_at_ms: 1_700_000_000_000,
            revoked_at_ms: None,
        };
        assert_eq!(
            serde_json::to_value(&record).unwrap(),
            serde_json::json!({
                "id": "ck_3f9a1b2c",
                "tenant": "acme",
                "name": "ci",
                "created_at_ms": 1_700_000_000_000_i64,
                "revoked_at_ms": null,
            })
        );
    }
}
