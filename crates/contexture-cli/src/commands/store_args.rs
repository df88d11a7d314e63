//! The `--db` argument of every command that reads or writes the store, and opening it.

use anyhow::{Context, Result};
use clap::Args;
use contexture_store::{AnyStore, StoreUrl};

/// Where the store is.
#[derive(Debug, Clone, Args)]
pub struct StoreArgs {
    /// The store: `sqlite:PATH` or `postgres://user@host:port/db` (also $CONTEXTURE_DB).
    #[arg(
        long,
        global = true,
        env = "CONTEXTURE_DB",
        default_value = "sqlite:contexture.db"
    )]
    pub db: String,
}

impl StoreArgs {
    /// Opens the store (migrating it when it is new or older), saying which one failed.
    pub async fn open(&self) -> Result<AnyStore> {
        AnyStore::open(&self.db)
            .await
            .with_context(|| format!("cannot open the store {}", self.db))
    }

    /// Opens the store when it is there already (a PostgreSQL database, or an SQLite file
    /// that exists): for commands that only read what it learnt and must not leave a new
    /// file behind.
    pub async fn open_existing(&self) -> Result<Option<AnyStore>> {
        let url: StoreUrl = self
            .db
            .parse()
            .with_context(|| format!("cannot open the store {}", self.db))?;
        if let StoreUrl::Sqlite(path) = &url
            && !path.exists()
        {
            return Ok(None);
        }
        self.open().await.map(Some)
    }
}
