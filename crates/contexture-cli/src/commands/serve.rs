//! `contexture serve`: the HTTP API (see the server crate), configured by a TOML file and
//! environment variables; with neither it serves on 127.0.0.1:8080 over `contexture.db`.

use std::io::IsTerminal;
use std::path::PathBuf;

use super::runtime;
use anyhow::{Context, Result};
use clap::{Args, ValueEnum};
use contexture_server::redacted_database;
use contexture_server::{AppState, ServerConfig, bind, serve, shutdown_signal};

/// Arguments of `contexture serve`.
#[derive(Debug, Args)]
pub struct ServeArgs {
    /// The configuration file (TOML; see docs/server.md). Environment variables override it.
    #[arg(long, env = "CONTEXTURE_CONFIG")]
    config: Option<PathBuf>,
    /// The address to listen on (over the file and $CONTEXTURE_BIND).
    #[arg(long)]
    bind: Option<std::net::SocketAddr>,
    /// The store (over the file and $CONTEXTURE_DB).
    #[arg(long)]
    db: Option<String>,
    /// Log lines as JSON objects (for log collectors) or as text.
    #[arg(long, value_enum, default_value_t = LogFormat::Text)]
    log_format: LogFormat,
}

/// How log lines look.
#[derive(Debug, Clone, Copy, ValueEnum)]
enum LogFormat {
    Text,
    Json,
}

/// Runs `contexture serve` until SIGINT or SIGTERM.
pub fn run(args: ServeArgs) -> Result<()> {
    let filter = tracing_subscriber::EnvFilter::try_from_env("CONTEXTURE_LOG")
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info"));
    // Colours only on a terminal: a log sent to a file or a collector stays plain text.
    let subscriber = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_ansi(std::io::stderr().is_terminal())
        .with_writer(std::io::stderr);
    match args.log_format {
        LogFormat::Json => subscriber.json().init(),
        LogFormat::Text => subscriber.init(),
    }
    let mut config = ServerConfig::load(args.config.as_deref(), |name| std::env::var(name).ok())?;
    if let Some(bind) = args.bind {
        config.bind = bind;
    }
    if let Some(db) = args.db {
        config.database = db;
    }
    if config.executions.template_worker.is_none() {
        // Clients' templates render in this binary's own worker command.
        let program = std::env::current_exe()
            .context("cannot find this program, to start template workers")?;
        config.executions.template_worker = Some(vec![
            program.display().to_string(),
            "template-worker".to_owned(),
        ]);
    }
    keep_memory_in_small_pages();
    runtime::on_worker_threads(None, async move {
        let listener = bind(&config).await?;
        let address = listener
            .local_addr()
            .context("cannot read the bound address")?;
        let database = redacted_database(&config.database);
        let rate_limit_redis = config
            .limits
            .rate_limit_redis
            .as_deref()
            .map_or_else(|| "none".to_owned(), redacted_database);
        let upstream = config.upstream.base_url().to_owned();
        let routed_upstreams = config.upstreams.len();
        let state = AppState::new(config).await?;
        tracing::info!(
            %address,
            %database,
            %rate_limit_redis,
            %upstream,
            routed_upstreams,
            "contexture serve listening"
        );
        // The line a supervisor (or a test) waits for: the store is open, requests are served.
        eprintln!("listening on http://{address}");
        serve(state, listener, shutdown_signal())
            .await
            .context("the server stopped with an error")?;
        tracing::info!("stopped");
        Ok(())
    })
}

/// Asks the kernel not to back the server's memory with transparent huge pages (its
/// template workers inherit the setting). The allocator reserves large aligned regions;
/// backed by 2 MiB pages, a region of which a few pages are in use is resident whole.
/// Measured under a chat load of thousands of threads: 134 MB resident with huge pages,
/// 95 MB without, at the same CPU per turn.
fn keep_memory_in_small_pages() {
    #[cfg(target_os = "linux")]
    {
        // SAFETY: PR_SET_THP_DISABLE takes integers only and touches no memory of ours.
        let status = unsafe { libc::prctl(libc::PR_SET_THP_DISABLE, 1, 0, 0, 0) };
        if status != 0 {
            // Kernels before 3.15 lack it: the server runs as before, with more memory.
            tracing::debug!(
                error = %std::io::Error::last_os_error(),
                "cannot turn transparent huge pages off for the server"
            );
        }
    }
}
