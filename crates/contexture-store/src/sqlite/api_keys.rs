//! The SQLite store's API keys: [`ApiKeyStore`] over the `api_keys` table. Creating and
//! revoking a key are writes like any other (batched by the writer thread); lookups take a
//! pooled read connection.

use std::time::SystemTime;

use rusqlite::{OptionalExtension, params};

use super::SqliteStore;
use crate::error::Action;
use crate::{ApiKeyRecord, ApiKeyStore, StoreError, epoch_ms};

/// The columns [`api_key_of`] reads, in order.
const API_KEY_COLUMNS: &str = "id, tenant, name, created_at, revoked_at";

fn api_key_of(row: &rusqlite::Row<'_>) -> rusqlite::Result<ApiKeyRecord> {
    Ok(ApiKeyRecord {
        id: row.get(0)?,
        tenant: row.get(1)?,
        name: row.get(2)?,
        created_at_ms: row.get(3)?,
        revoked_at_ms: row.get(4)?,
    })
}

impl ApiKeyStore for SqliteStore {
    async fn create_api_key(
        &self,
        id: &str,
        tenant: &str,
        name: &str,
        key_hash: &str,
    ) -> Result<ApiKeyRecord, StoreError> {
        let record = ApiKeyRecord {
            id: id.to_string(),
            tenant: tenant.to_string(),
            name: name.to_string(),
            created_at_ms: epoch_ms(SystemTime::now()),
            revoked_at_ms: None,
        };
        let key_hash = key_hash.to_string();
        self.write(move |conn| {
            // Without a conflict target, DO NOTHING covers both the id and the hash.
            let created = conn
                .prepare_cached(
                    "INSERT INTO api_keys (id, tenant, name, key_hash, created_at)
                     VALUES (?1, ?2, ?3, ?4, ?5) ON CONFLICT DO NOTHING",
                )
                .doing("prepare the key insert")?
                .execute(params![
                    record.id,
                    record.tenant,
                    record.name,
                    key_hash,
                    record.created_at_ms
                ])
                .doing("create the API key")?;
            if created == 0 {
                return Err(StoreError::KeyExists { id: record.id });
            }
            Ok(record)
        })
        .await
    }

    async fn api_key_by_hash(&self, key_hash: &str) -> Result<Option<ApiKeyRecord>, StoreError> {
        let key_hash = key_hash.to_string();
        self.read(move |conn| {
            conn.prepare_cached(&format!(
                "SELECT {API_KEY_COLUMNS} FROM api_keys
                 WHERE key_hash = ?1 AND revoked_at IS NULL"
            ))
            .doing("prepare the key lookup")?
            .query_row([key_hash], api_key_of)
            .optional()
            .doing("look up the API key")
        })
        .await
    }

    async fn list_api_keys(&self, tenant: Option<&str>) -> Result<Vec<ApiKeyRecord>, StoreError> {
        let tenant = tenant.map(str::to_string);
        self.read(move |conn| {
            // Two statements, so that a tenant's keys are read through `api_keys_tenant`.
            let (filter, params) = match &tenant {
                Some(tenant) => ("WHERE tenant = ?1", vec![tenant]),
                None => ("", vec![]),
            };
            conn.prepare_cached(&format!(
                "SELECT {API_KEY_COLUMNS} FROM api_keys {filter} ORDER BY created_at, rowid"
            ))
            .doing("prepare the key list")?
            .query_map(rusqlite::params_from_iter(params), api_key_of)
            .doing("list API keys")?
            .collect::<Result<Vec<_>, _>>()
            .doing("read an API key")
        })
        .await
    }

    async fn revoke_api_key(&self, id: &str) -> Result<bool, StoreError> {
        let id = id.to_string();
        let now = epoch_ms(SystemTime::now());
        self.write(move |conn| {
            let revoked = conn
                .execute(
                    "UPDATE api_keys SET revoked_at = ?2 WHERE id = ?1 AND revoked_at IS NULL",
                    params![id, now],
                )
                .doing("revoke the API key")?;
            Ok(revoked > 0)
        })
        .await
    }
}
