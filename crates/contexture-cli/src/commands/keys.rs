//! `contexture keys`: API keys of `contexture serve`, each bound to a tenant. Only a key's
//! hash is stored; `create` prints the key once.

use anyhow::{Context, Result};
use clap::{Args, Subcommand};
use contexture_server::issue_key;
use contexture_store::ApiKeyStore;

use super::runtime;
use super::store_args::StoreArgs;

/// Arguments of `contexture keys`.
#[derive(Debug, Args)]
pub struct KeysArgs {
    #[command(flatten)]
    store: StoreArgs,
    #[command(subcommand)]
    command: KeysCommand,
}

/// The `keys` subcommands.
#[derive(Debug, Subcommand)]
pub enum KeysCommand {
    /// Make a key for a tenant and print it (it cannot be shown again).
    Create {
        /// The tenant (letters, digits, `-`, `_`, `.`).
        #[arg(long)]
        tenant: String,
        /// A name to recognise the key by.
        #[arg(long, default_value = "")]
        name: String,
    },
    /// List keys (never the keys themselves): id, tenant, name, created, revoked.
    List {
        /// Only this tenant's.
        #[arg(long)]
        tenant: Option<String>,
    },
    /// Revoke a key by its id (`ck_...`); requests with it are refused from then on.
    Revoke {
        /// The key's id.
        id: String,
    },
}

/// Runs a `keys` command.
pub fn run(args: KeysArgs) -> Result<()> {
    runtime::on_current_thread(async {
        let store = args.store.open().await?;
        match args.command {
            KeysCommand::Create { tenant, name } => {
                let issued = issue_key(&store, &tenant, &name)
                    .await
                    .with_context(|| format!("cannot make a key for tenant {tenant}"))?;
                println!("{}", issued.key);
                eprintln!(
                    "key {} for tenant {}: keep it now, it is stored only as a hash",
                    issued.record.id, issued.record.tenant
                );
            }
            KeysCommand::List { tenant } => {
                for key in store.list_api_keys(tenant.as_deref()).await? {
                    println!(
                        "{}\t{}\t{}\tcreated {}\t{}",
                        key.id,
                        key.tenant,
                        key.name,
                        key.created_at_ms,
                        key.revoked_at_ms
                            .map_or_else(|| "active".to_owned(), |at| format!("revoked {at}"))
                    );
                }
            }
            KeysCommand::Revoke { id } => {
                if store.revoke_api_key(&id).await? {
                    println!("revoked {id}");
                } else {
                    anyhow::bail!("no active key {id}");
                }
            }
        }
        Ok(())
    })
}
