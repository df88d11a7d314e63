//! `contexture cancel`: cancel an execution and all its descendants, wherever they run (the
//! cancellation goes through the store).

use std::sync::Arc;

use anyhow::{Context, Result};
use clap::Args;
use contexture_engine::executor::Executor;
use contexture_engine::llm::{FixedRouter, Router};
use contexture_llm::ScriptedProvider;

use super::runtime;
use super::store_args::StoreArgs;

/// Arguments of `contexture cancel`.
#[derive(Debug, Args)]
pub struct CancelArgs {
    /// The execution's id.
    execution_id: String,
    /// Why, recorded with the cancellation.
    #[arg(long)]
    reason: Option<String>,
    #[command(flatten)]
    store: StoreArgs,
}

/// Runs `contexture cancel`: prints each execution newly marked, the given one first.
pub fn run(args: CancelArgs) -> Result<()> {
    runtime::on_current_thread(async {
        let store = args.store.open().await?;
        // Cancelling calls no model: the executor only needs the store.
        let router: Arc<dyn Router> =
            Arc::new(FixedRouter::new(Arc::new(ScriptedProvider::texts(Vec::<
                String,
            >::new(
            )))));
        let marked = Executor::new(store, router)
            .cancel(&args.execution_id, args.reason)
            .await
            .with_context(|| format!("cannot cancel execution {}", args.execution_id))?;
        if marked.is_empty() {
            println!(
                "execution {} is already over or being cancelled; nothing to do",
                args.execution_id
            );
        }
        for id in marked {
            println!("cancel requested: {id}");
        }
        Ok(())
    })
}
