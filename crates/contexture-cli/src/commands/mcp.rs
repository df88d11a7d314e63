//! `contexture mcp`: Contexture's thread and workflow tools as an MCP server over stdio,
//! for an MCP host (an editor, a desktop assistant) that starts it as a program. The user
//! at the terminal is the operator: the tools see the whole store (or one tenant's part of
//! it with `--tenant`), `run_workflow` reads workflow files by their path, and workflows run
//! programs and MCP servers as they declare them, as `contexture run` does.

use std::io::IsTerminal;
use std::path::PathBuf;

use super::runtime;
use anyhow::{Context, Result};
use clap::Args;
use contexture_server::mcp::{ContextureMcp, serve_stdio};
use contexture_server::{AppState, Audience, ServerConfig, Tenant};

/// Arguments of `contexture mcp`.
#[derive(Debug, Args)]
pub struct McpArgs {
    /// The store: `sqlite:PATH` or `postgres://user@host:port/db` (over the file and
    /// $CONTEXTURE_DB).
    #[arg(long)]
    db: Option<String>,
    /// A configuration file in the format of `contexture serve` (models, LLM, upstream,
    /// fitting and compaction policies, MCP servers); environment variables override it.
    #[arg(long, env = "CONTEXTURE_CONFIG")]
    config: Option<PathBuf>,
    /// The LLM of workflow runs and summaries: `auto`, `openai[:MODEL]`,
    /// `anthropic[:MODEL]` or `scripted:FILE` (over the file and $CONTEXTURE_LLM).
    #[arg(long)]
    llm: Option<String>,
    /// Act as this tenant of a server's store: only its threads, under the ids it knows.
    #[arg(long)]
    tenant: Option<String>,
}

/// Serves the tools over stdin and stdout until the host closes them.
pub fn run(args: McpArgs) -> Result<()> {
    // Standard output carries the protocol: logs go to standard error.
    let filter = tracing_subscriber::EnvFilter::try_from_env("CONTEXTURE_LOG")
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("warn"));
    tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_ansi(std::io::stderr().is_terminal())
        .with_writer(std::io::stderr)
        .init();
    let mut config = ServerConfig::load(args.config.as_deref(), |name| std::env::var(name).ok())?;
    if let Some(db) = args.db {
        config.database = db;
    }
    if let Some(llm) = args.llm {
        config.llm = llm;
    }
    let tenant = args
        .tenant
        .map(Tenant::new)
        .transpose()
        .context("--tenant")?;
    runtime::on_worker_threads(None, async move {
        let state = AppState::open(config, Audience::Operator).await?;
        let server = match tenant {
            Some(tenant) => ContextureMcp::for_tenant(state, tenant),
            None => ContextureMcp::for_operator(state),
        };
        serve_stdio(server)
            .await
            .context("the MCP connection ended with an error")
    })
}
