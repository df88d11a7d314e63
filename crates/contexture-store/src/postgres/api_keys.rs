//! The PostgreSQL store's API keys: [`ApiKeyStore`] over the `api_keys` table, one
//! statement per call on a pooled connection.

use std::time::SystemTime;

use super::PgStore;
use crate::error::Action;
use crate::{ApiKeyRecord, ApiKeyStore, StoreError, epoch_ms};

/// The columns [`api_key_of`] reads, in order.
const API_KEY_COLUMNS: &str = "id, tenant, name, created_at, revoked_at";

fn api_key_of(row: &tokio_postgres::Row) -> ApiKeyRecord {
    ApiKeyRecord {
        id: row.get(0),
        tenant: row.get(1),
        name: row.get(2),
        created_at_ms: row.get(3),
        revoked_at_ms: row.get(4),
    }
}

impl ApiKeyStore for PgStore {
    async fn create_api_key(
        &self,
        id: &str,
        tenant: &str,
        name: &str,
        key_hash: &str,
    ) -> Result<ApiKeyRecord, StoreError> {
        let created_at_ms = epoch_ms(SystemTime::now());
        let client = self.pool.get().await?;
        // Without a conflict target, DO NOTHING covers both the id and the hash.
        let created = client
            .execute(
                "INSERT INTO api_keys (id, tenant, name, key_hash, created_at)
                 VALUES ($1, $2, $3, $4, $5) ON CONFLICT DO NOTHING",
                &[&id, &tenant, &name, &key_hash, &created_at_ms],
            )
            .await
            .doing("create the API key")?;
        if created == 0 {
            return Err(StoreError::KeyExists { id: id.to_string() });
        }
        Ok(ApiKeyRecord {
            id: id.to_string(),
            tenant: tenant.to_string(),
            name: name.to_string(),
            created_at_ms,
            revoked_at_ms: None,
        })
    }

    async fn api_key_by_hash(&self, key_hash: &str) -> Result<Option<ApiKeyRecord>, StoreError> {
        let client = self.pool.get().await?;
        let row = client
            .query_opt(
                &format!(
                    "SELECT {API_KEY_COLUMNS} FROM api_keys
                     WHERE key_hash = $1 AND revoked_at IS NULL"
                ),
                &[&key_hash],
            )
            .await
            .doing("look up the API key")?;
        Ok(row.as_ref().map(api_key_of))
    }

    async fn list_api_keys(&self, tenant: Option<&str>) -> Result<Vec<ApiKeyRecord>, StoreError> {
        let client = self.pool.get().await?;
        let rows = match tenant {
            Some(tenant) => {
                client
                    .query(
                        &format!(
                            "SELECT {API_KEY_COLUMNS} FROM api_keys WHERE tenant = $1
                             ORDER BY created_at, ord"
                        ),
                        &[&tenant],
                    )
                    .await
            }
            None => {
                client
                    .query(
                        &format!("SELECT {API_KEY_COLUMNS} FROM api_keys ORDER BY created_at, ord"),
                        &[],
                    )
                    .await
            }
        }
        .doing("list API keys")?;
        Ok(rows.iter().map(api_key_of).collect())
    }

    async fn revoke_api_key(&self, id: &str) -> Result<bool, StoreError> {
        let now = epoch_ms(SystemTime::now());
        let client = self.pool.get().await?;
        let revoked = client
            .execute(
                "UPDATE api_keys SET revoked_at = $2 WHERE id = $1 AND revoked_at IS NULL",
                &[&id, &now],
            )
            .await
            .doing("revoke the API key")?;
        Ok(revoked > 0)
    }
}
