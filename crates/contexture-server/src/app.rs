//! The application: shared state, the router, and serving with graceful shutdown.

use std::future::Future;
use std::ops::Deref;
use std::path::{Component, Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use axum::Router;
use axum::extract::DefaultBodyLimit;
use axum::routing::{MethodRouter, get, post, put};
use axum::{Extension, middleware};
use contexture_core::registry::Registry;
use contexture_engine::chat_service::{ChatLimits, ChatParts, ChatService};
use contexture_engine::compaction::Compactor;
use contexture_engine::cpu::CpuPool;
use contexture_engine::executor::Executor;
use contexture_engine::in_flight::InFlight;
use contexture_engine::llm::{HttpSettings, LlmSpec};
use contexture_engine::sources::WorkflowSource;
use contexture_engine::tenant_slots::TenantSlots;
use contexture_engine::turns::TurnQueue;
use contexture_engine::workflow::Programs;
use contexture_llm::RetryPolicy;
use contexture_store::{
    AnyStore, ExecutionQueueStore, RedisRateLimits, RetentionRules, Store, StoreError,
};
use hyper_util::rt::{TokioIo, TokioTimer};
use hyper_util::server::graceful::GracefulShutdown;
use hyper_util::service::TowerToHyperService;
use tokio::net::TcpListener;

use crate::active_runs::ActiveRuns;
use crate::auth::{KeyCache, RateLimiter, authenticate};
use crate::body::BodyTimeout;
use crate::config::{ServerConfig, UpstreamKind};
use crate::execution_worker::ExecutionWorker;
use crate::metrics::{Metrics, track};
use crate::routes::{
    chat, conversations, executions, messages, ops, responses, responses_compact, threads,
};
use crate::tenancy::Tenant;

/// Why the server could not start.
#[derive(Debug, thiserror::Error)]
pub enum StartError {
    /// The store could not be opened.
    #[error("cannot open the store {url}: {source}")]
    Store {
        /// Its URL, without a password.
        url: String,
        /// Why.
        source: StoreError,
    },
    /// The models file could not be used.
    #[error("models file {}: {message}", path.display())]
    Models {
        /// The file.
        path: PathBuf,
        /// What was wrong.
        message: String,
    },
    /// The executions' LLM could not be set up.
    #[error("llm `{spec}`: {message}")]
    Llm {
        /// The setting.
        spec: String,
        /// What was wrong.
        message: String,
    },
    /// An upstream client could not be built (the message names its setting).
    #[error("{0}")]
    Upstream(String),
    /// The configuration is invalid.
    #[error("{0}")]
    Config(String),
    /// The address could not be bound.
    #[error("cannot listen on {address}: {source}")]
    Bind {
        /// The address.
        address: std::net::SocketAddr,
        /// Why.
        source: std::io::Error,
    },
}

/// Whom a server's doors serve: what they may touch on the host follows from it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Audience {
    /// Clients over the network (`contexture serve`): every request is untrusted, acts for
    /// a tenant, names workflows under the workflows directory, and runs programs only when
    /// the operator allowed them.
    Clients,
    /// The operator at a terminal (`contexture mcp` over stdio): the whole store, workflow
    /// files by their path, programs and MCP servers as the workflows declare them, as
    /// `contexture run` does.
    Operator,
}

/// What every handler shares.
pub struct Shared {
    /// Whom the doors serve.
    pub audience: Audience,
    /// The store.
    pub store: AnyStore,
    /// The model registry.
    pub registry: Arc<Registry>,
    /// Runs workflow executions.
    pub executor: Arc<Executor<AnyStore>>,
    /// Runs compactions (its summarizer calls go through the executions' LLM).
    pub compactor: Arc<Compactor>,
    /// The chat turn operation of the chat endpoint.
    pub chat: ChatService<AnyStore>,
    /// The configuration.
    pub config: ServerConfig,
    /// Metrics.
    pub metrics: Arc<Metrics>,
    /// The per-key rate limit.
    pub rate_limiter: RateLimiter,
    /// The Redis server the rate limits are shared through, when the operator named one
    /// (`limits.rate_limit_redis`); otherwise the store's, when it shares them.
    pub redis_limits: Option<RedisRateLimits>,
    /// API keys verified lately.
    pub key_cache: KeyCache,
    /// The tenant of requests without a key, when allowed.
    pub anonymous: Option<Tenant>,
    /// Where executions' workflows are read from (canonical), when the operator set it.
    pub workflows_dir: Option<PathBuf>,
    /// Work that outlives its request (recording a streamed answer), which a shutdown
    /// waits for.
    pub in_flight: Arc<InFlight>,
    /// Each tenant's running executions.
    pub running: Arc<TenantSlots>,
    /// The executions running on this server, whose logs the thread routes do not write.
    pub active_runs: Arc<ActiveRuns>,
    /// This server's share of the execution queue.
    pub worker: ExecutionWorker,
    /// Each tenant's open event streams.
    pub streams: Arc<TenantSlots>,
    /// The queues of chat turns on each thread: one turn of a thread at a time.
    pub turns: Arc<TurnQueue>,
    /// Where fitting runs: blocking threads, a bounded number at once, a share per tenant.
    pub cpu: Arc<CpuPool>,
    /// The retention of request records for threads without a policy of their own.
    pub retention: RetentionRules,
}

/// The handlers' state: cheap to clone.
#[derive(Clone)]
pub struct AppState(Arc<Shared>);

impl Deref for AppState {
    type Target = Shared;
    fn deref(&self) -> &Shared {
        &self.0
    }
}

impl AppState {
    /// Opens the store and builds everything the configuration names, for clients over
    /// the network.
    pub async fn new(config: ServerConfig) -> Result<AppState, StartError> {
        AppState::open(config, Audience::Clients).await
    }

    /// Opens the store (and the Redis server the rate limits are shared through, when the
    /// configuration names one) and builds everything the configuration names, for
    /// `audience`.
    pub async fn open(config: ServerConfig, audience: Audience) -> Result<AppState, StartError> {
        let store = AnyStore::open(&config.database)
            .await
            .map_err(|source| StartError::Store {
                url: crate::config::redacted_database(&config.database),
                source,
            })?;
        let redis_limits =
            match &config.limits.rate_limit_redis {
                Some(url) => Some(RedisRateLimits::connect(url).await.map_err(|source| {
                    StartError::Store {
                        url: crate::config::redacted_database(url),
                        source,
                    }
                })?),
                None => None,
            };
        AppState::build(config, store, audience, redis_limits)
    }

    /// Builds the state over an open store, for clients over the network.
    pub fn with_store(config: ServerConfig, store: AnyStore) -> Result<AppState, StartError> {
        AppState::with_store_for(config, store, Audience::Clients)
    }

    /// Builds the state over an open store, for `audience`. Rate limits shared through
    /// Redis need [`AppState::open`], which connects to it: a configuration that names a
    /// Redis server is refused here.
    pub fn with_store_for(
        config: ServerConfig,
        store: AnyStore,
        audience: Audience,
    ) -> Result<AppState, StartError> {
        if config.limits.rate_limit_redis.is_some() {
            return Err(StartError::Config(
                "limits.rate_limit_redis is connected to when the server opens its store; \
                 build the state with AppState::open"
                    .into(),
            ));
        }
        AppState::build(config, store, audience, None)
    }

    fn build(
        config: ServerConfig,
        store: AnyStore,
        audience: Audience,
        redis_limits: Option<RedisRateLimits>,
    ) -> Result<AppState, StartError> {
        store.set_max_thread_events(Some(config.limits.max_thread_events));
        store.set_max_thread_bytes(Some(config.limits.max_thread_bytes));
        store.set_projection_cache_bytes(config.limits.projection_cache_bytes);
        let mut registry = Registry::builtin();
        if let Some(path) = &config.models_file {
            let text = std::fs::read_to_string(path).map_err(|error| StartError::Models {
                path: path.clone(),
                message: error.to_string(),
            })?;
            registry
                .apply_toml(&text, &path.display().to_string())
                .map_err(|error| StartError::Models {
                    path: path.clone(),
                    message: error.to_string(),
                })?;
        }
        let registry = Arc::new(registry);
        let spec: LlmSpec = config.llm.parse().map_err(|error| StartError::Llm {
            spec: config.llm.clone(),
            message: format!("{error}"),
        })?;
        let settings = HttpSettings {
            timeout: config.upstream.timeout(),
            retry: RetryPolicy {
                max_retries: config.upstream.retries,
                ..RetryPolicy::default()
            },
            // Executions reach OpenAI-compatible models through the default upstream when
            // it is one.
            openai_base_url: (config.upstream.kind == UpstreamKind::Openai)
                .then(|| config.upstream.base_url().to_owned()),
            openai_api_key: config.upstream.api_key.clone(),
        };
        let router = spec
            .router(&settings, registry.clone(), 0)
            .map_err(|error| StartError::Llm {
                spec: config.llm.clone(),
                message: error.to_string(),
            })?;
        let workflows_dir = config
            .workflows_dir
            .as_ref()
            .map(|dir| dir.canonicalize().unwrap_or_else(|_| dir.clone()));
        let programs = if config.executions.allow_programs || audience == Audience::Operator {
            Programs::Allowed
        } else {
            Programs::Refused(
                "this server runs no programs: its operator may set `[executions] allow_programs = true` for the workflows of `workflows_dir`".into(),
            )
        };
        let mut executor = Executor::new(store.clone(), router.clone())
            .with_registry(registry.clone())
            .with_programs(programs)
            .with_tools(
                config
                    .toolbox()
                    .map_err(|error| StartError::Config(error.to_string()))?,
            )
            .with_limit_caps(config.executions.limit_caps());
        if audience == Audience::Clients {
            // A client shapes an execution's requests: they read the operator's
            // calibration of estimates and feed none; its sub-workflows are the workflows
            // directory's.
            executor = executor
                .with_estimate_learner(contexture_engine::estimates::Learner::ReadOnly)
                .with_workflow_source(Arc::new(ConfinedFiles {
                    root: workflows_dir.clone(),
                }));
        }
        for hook in config
            .hook_programs()
            .map_err(|error| StartError::Config(error.to_string()))?
        {
            executor = executor.with_hook(Arc::new(hook));
        }
        match config.executions.render_workers() {
            Some(workers) => {
                // A worker that cannot start would fail every client workflow: say so now.
                workers.check().map_err(|failure| {
                    StartError::Config(format!("executions.template_worker: {failure}"))
                })?;
                executor = executor.with_client_isolation(Arc::new(workers));
            }
            None if audience == Audience::Operator => {}
            None => tracing::warn!(
                "no executions.template_worker: the templates of workflows clients send render \
                 in this process, bounded only by fuel"
            ),
        }
        let compactor = Compactor::new(router, registry.clone());
        let upstreams = crate::config::upstreams(&config.upstream, &config.upstreams)
            .map_err(StartError::Upstream)?;
        let anonymous = match &config.auth.anonymous_tenant {
            Some(name) => Some(
                Tenant::new(name.clone()).map_err(|error| StartError::Config(error.to_string()))?,
            ),
            None => None,
        };
        let retention = config
            .retention
            .rules()
            .map_err(|error| StartError::Config(error.to_string()))?;
        let compactor = Arc::new(compactor);
        let metrics = Arc::new(Metrics::default());
        let in_flight = Arc::new(InFlight::default());
        let turns = Arc::new(TurnQueue::default());
        let cpu = Arc::new(CpuPool::for_this_machine());
        let chat = ChatService::new(ChatParts {
            store: store.clone(),
            upstreams,
            registry: registry.clone(),
            fit_policy: config.fit.clone(),
            compactor: compactor.clone(),
            compaction: config.compaction.clone(),
            cpu: cpu.clone(),
            turns: turns.clone(),
            slots: TenantSlots::new(
                config.limits.max_chat_turns,
                "chat completions in flight",
                "limits.max_chat_turns",
            ),
            in_flight: in_flight.clone(),
            limits: ChatLimits {
                turn_wait: config.limits.thread_turn_wait(),
                abandon_after_secs: config.upstream.abandon_after_secs,
            },
            observer: metrics.clone(),
        });
        Ok(AppState(Arc::new(Shared {
            audience,
            store,
            registry,
            executor: Arc::new(executor),
            compactor,
            chat,
            rate_limiter: RateLimiter::new(config.limits.requests_per_second, config.limits.burst),
            redis_limits,
            key_cache: KeyCache::new(config.auth.key_cache()),
            metrics,
            anonymous,
            workflows_dir,
            in_flight,
            running: TenantSlots::new(
                config.executions.max_running,
                "running executions",
                "executions.max_running",
            ),
            active_runs: Arc::new(ActiveRuns::default()),
            worker: ExecutionWorker::default(),
            turns,
            cpu,
            streams: TenantSlots::new(
                config.limits.max_event_streams,
                "open event streams",
                "limits.max_event_streams",
            ),
            retention,
            config,
        })))
    }

    /// Reads a workflow an execution names: its name relative to the workflows directory
    /// (what the log records) and its text.
    pub fn read_workflow(&self, name: &str) -> Result<(String, String), String> {
        read_confined(self.workflows_dir.as_deref(), Path::new(name))
    }
}

/// The name (relative to `root`) and text of the workflow file `path` under `root`.
/// Refused: no root, absolute paths, `..`, and files that are not `.yaml` or `.yml` (so no
/// other file of the operator's can be read through a workflow's name).
fn read_confined(root: Option<&Path>, path: &Path) -> Result<(String, String), String> {
    let Some(root) = root else {
        return Err(format!(
            "cannot read workflow `{}`: this server has no workflows directory (its operator may set `workflows_dir`)",
            path.display()
        ));
    };
    if path
        .components()
        .any(|c| !matches!(c, Component::Normal(_) | Component::CurDir))
    {
        return Err(format!(
            "`{}` must be a relative path inside the workflows directory, without `..`",
            path.display()
        ));
    }
    if !matches!(
        path.extension().and_then(|e| e.to_str()),
        Some("yaml" | "yml")
    ) {
        return Err(format!(
            "`{}` is not a workflow file: workflows end in `.yaml` or `.yml`",
            path.display()
        ));
    }
    let text = std::fs::read_to_string(root.join(path)).map_err(|error| {
        let why = match error.kind() {
            std::io::ErrorKind::NotFound => "no such file in the workflows directory".to_owned(),
            std::io::ErrorKind::InvalidData => "not UTF-8 text".to_owned(),
            _ => "it cannot be read".to_owned(),
        };
        format!("cannot read workflow `{}`: {why}", path.display())
    })?;
    let name = path
        .components()
        .filter(|c| matches!(c, Component::Normal(_)))
        .collect::<PathBuf>();
    Ok((name.display().to_string(), text))
}

/// Sub-workflows read from files under the workflows directory only; a parent's name is
/// relative to it.
struct ConfinedFiles {
    root: Option<PathBuf>,
}

impl WorkflowSource for ConfinedFiles {
    fn load(&self, path: &str, parent_file: &str) -> Result<(String, String), String> {
        let parent_dir = Path::new(parent_file).parent().unwrap_or(Path::new(""));
        read_confined(self.root.as_deref(), &parent_dir.join(path))
    }
}

/// The routes behind authentication: each path with its handlers. `openapi.json` documents
/// exactly these and [`open_routes`] (a test compares them).
fn api_routes() -> Vec<(&'static str, MethodRouter<AppState>)> {
    vec![
        ("/v1/threads", post(threads::create).get(threads::list)),
        (
            "/v1/threads/{id}",
            get(threads::show).delete(threads::delete),
        ),
        (
            "/v1/threads/{id}/messages",
            post(threads::append).get(threads::messages),
        ),
        ("/v1/threads/{id}/context", get(threads::context)),
        ("/v1/threads/{id}/events", get(threads::events)),
        ("/v1/threads/{id}/search", get(threads::search)),
        ("/v1/threads/{id}/fork", post(threads::fork)),
        ("/v1/threads/{id}/merge", post(threads::merge)),
        ("/v1/threads/{id}/switch", post(threads::switch)),
        ("/v1/threads/{id}/compact", post(threads::compact)),
        ("/v1/threads/{id}/restore", post(threads::restore)),
        ("/v1/threads/{id}/pop", post(threads::pop)),
        ("/v1/threads/{id}/clear", post(threads::clear)),
        (
            "/v1/threads/{id}/retention",
            put(threads::set_retention).delete(threads::clear_retention),
        ),
        (
            "/v1/threads/{id}/policy",
            put(threads::set_policy).delete(threads::clear_policy),
        ),
        ("/v1/executions", post(executions::start)),
        ("/v1/executions/{id}", get(executions::status)),
        ("/v1/executions/{id}/events", get(executions::events)),
        ("/v1/executions/{id}/cancel", post(executions::cancel)),
        ("/v1/executions/{id}/requests", get(executions::requests)),
        ("/v1/chat/completions", post(chat::completions)),
        ("/v1/messages", post(messages::create)),
        ("/v1/messages/count_tokens", post(messages::count_tokens)),
        ("/v1/responses", post(responses::create)),
        ("/v1/responses/compact", post(responses_compact::compact)),
        (
            "/v1/responses/{id}",
            get(responses::retrieve).delete(responses::delete),
        ),
        (
            "/v1/responses/{id}/input_items",
            get(responses::input_items),
        ),
        ("/v1/conversations", post(conversations::create)),
        (
            "/v1/conversations/{id}",
            get(conversations::retrieve).delete(conversations::delete),
        ),
        (
            "/v1/conversations/{id}/items",
            get(conversations::items).post(conversations::add_items),
        ),
        ("/v1/models", get(chat::models)),
    ]
}

/// The routes anyone may call: probes, metrics and the API's description.
fn open_routes() -> Vec<(&'static str, MethodRouter<AppState>)> {
    vec![
        ("/healthz", get(ops::healthz)),
        ("/readyz", get(ops::readyz)),
        ("/metrics", get(ops::metrics)),
        ("/openapi.json", get(ops::openapi)),
    ]
}

/// The whole API.
pub fn router(state: AppState) -> Router {
    let api = api_routes()
        .into_iter()
        .fold(Router::new(), |router, (path, handlers)| {
            router.route(path, handlers)
        })
        // Contexture's MCP tools, behind the same keys: each call acts for the key's tenant.
        .route_service("/mcp", crate::mcp::http_service(state.clone()));
    // The inspector's views, behind the same keys as the API.
    let api = crate::ui::view_routes()
        .into_iter()
        .fold(api, |router, (path, handlers)| router.route(path, handlers))
        .route_layer(middleware::from_fn_with_state(state.clone(), authenticate));
    let open = open_routes()
        .into_iter()
        .chain(crate::ui::open_routes())
        .fold(Router::new(), |router, (path, handlers)| {
            router.route(path, handlers)
        });
    api.merge(open)
        .fallback(ops::not_found)
        .method_not_allowed_fallback(ops::method_not_allowed)
        .layer(DefaultBodyLimit::max(state.config.limits.max_body_bytes))
        .layer(middleware::from_fn(crate::error::anthropic_errors))
        .layer(middleware::from_fn(crate::ui::security_headers))
        .layer(Extension(BodyTimeout(Duration::from_secs_f64(
            state.config.limits.body_read_timeout_secs,
        ))))
        .route_layer(middleware::from_fn_with_state(state.metrics.clone(), track))
        .with_state(state)
}

/// Serves `state` on `listener` until `shutdown` resolves, then stops accepting and lets
/// the requests in flight finish (at most the configured grace period).
///
/// Each connection has `limits.header_read_timeout_secs` to send a request's headers (the
/// first and each one after on a kept-alive connection), and each request
/// `limits.body_read_timeout_secs` to send its body, so slow clients cannot hold
/// connections (and file descriptors) forever (the body's limit is the body read timeout).
pub async fn serve(
    state: AppState,
    listener: TcpListener,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> std::io::Result<()> {
    let grace = Duration::from_secs(state.config.shutdown_grace_secs);
    let pruner = prune_in_background(&state);
    // Queued runs, and runs whose server died, are taken from the start.
    state.worker.start(&state);
    let header_timeout = Duration::from_secs_f64(state.config.limits.header_read_timeout_secs);
    let in_flight = state.in_flight.clone();
    let worker_state = state.clone();
    let app = router(state);
    let mut http = hyper::server::conn::http1::Builder::new();
    http.timer(TokioTimer::new())
        .header_read_timeout(header_timeout);
    let connections = GracefulShutdown::new();
    tokio::pin!(shutdown);
    loop {
        let (stream, _) = tokio::select! {
            accepted = listener.accept() => match accepted {
                Ok(accepted) => accepted,
                Err(error) => {
                    // Out of file descriptors, say: wait instead of spinning.
                    tracing::warn!(%error, "cannot accept a connection");
                    tokio::time::sleep(Duration::from_millis(50)).await;
                    continue;
                }
            },
            () = &mut shutdown => break,
        };
        let _ = stream.set_nodelay(true);
        let service = TowerToHyperService::new(app.clone());
        let connection = connections.watch(http.serve_connection(TokioIo::new(stream), service));
        tokio::spawn(async move {
            if let Err(error) = connection.await {
                tracing::debug!(%error, "connection ended with an error");
            }
        });
    }
    tracing::info!("shutting down: finishing the requests in flight");
    drop(listener);
    // The runs this server holds go to the other servers now, not when their leases end.
    worker_state.worker.release_all(&worker_state.store).await;
    if let Some(pruner) = pruner {
        pruner.abort();
    }
    let finished = async {
        connections.shutdown().await;
        // Answers of streams that just ended are still being recorded.
        in_flight.idle().await;
    };
    if tokio::time::timeout(grace, finished).await.is_err() {
        tracing::warn!(
            "requests still in flight after {} s; stopping them",
            grace.as_secs()
        );
        // The chat calls still waiting for their upstream record that the server stopped
        // them (with what had arrived) before the process ends.
        in_flight.stop();
        if tokio::time::timeout(STOP_RECORDING_TIME, in_flight.idle())
            .await
            .is_err()
        {
            tracing::error!("work still in flight after it was stopped; exiting anyway");
        }
    }
    Ok(())
}

/// Prunes request records by the threads' policies and `[retention]`, and finished runs'
/// rows from the execution queue past `executions.queue_keep_finished_days`, every
/// `retention.interval_secs` (none when it is 0). Several servers on one database may all
/// prune: pruning is idempotent and each thread's batch is one short transaction.
fn prune_in_background(state: &AppState) -> Option<tokio::task::JoinHandle<()>> {
    let every = Duration::from_secs(state.config.retention.interval_secs);
    if every.is_zero() {
        return None;
    }
    let state = state.clone();
    Some(tokio::spawn(async move {
        let mut ticks = tokio::time::interval(every);
        ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        // The first tick is now: wait a whole interval before the first pruning.
        ticks.tick().await;
        loop {
            ticks.tick().await;
            let started = std::time::Instant::now();
            match state
                .store
                .prune_requests(&state.retention, SystemTime::now())
                .await
            {
                Ok(report) => {
                    state.metrics.count_pruned(report.records, report.bytes);
                    tracing::info!(
                        threads = report.threads,
                        records = report.records,
                        bytes = report.bytes,
                        elapsed_ms = started.elapsed().as_millis() as u64,
                        "pruned request records"
                    );
                }
                Err(error) => tracing::warn!(%error, "cannot prune request records"),
            }
            if let Some(kept) = state.config.executions.queue_keep_finished() {
                match state.store.prune_finished_executions(kept).await {
                    Ok(0) => {}
                    Ok(runs) => {
                        tracing::info!(runs, "pruned finished runs from the execution queue");
                    }
                    Err(error) => {
                        tracing::warn!(%error, "cannot prune finished runs from the execution queue");
                    }
                }
            }
        }
    }))
}

/// How long a shutdown waits, after the grace period, for stopped work to record its end.
const STOP_RECORDING_TIME: Duration = Duration::from_secs(5);

/// Binds the configured address.
pub async fn bind(config: &ServerConfig) -> Result<TcpListener, StartError> {
    TcpListener::bind(config.bind)
        .await
        .map_err(|source| StartError::Bind {
            address: config.bind,
            source,
        })
}

/// Resolves on SIGINT or SIGTERM.
pub async fn shutdown_signal() {
    let interrupt = async {
        let _ = tokio::signal::ctrl_c().await;
    };
    #[cfg(unix)]
    let terminate = async {
        match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
            Ok(mut signal) => {
                signal.recv().await;
            }
            Err(_) => std::future::pending::<()>().await,
        }
    };
    #[cfg(not(unix))]
    let terminate = std::future::pending::<()>();
    tokio::select! {
        _ = interrupt => {}
        _ = terminate => {}
    }
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeSet;

    use super::*;

    #[test]
    fn the_openapi_document_lists_exactly_the_routes_served() {
        let doc: serde_json::Value =
            serde_json::from_str(include_str!("../openapi.json")).expect("openapi.json is JSON");
        let documented: BTreeSet<&str> = doc["paths"]
            .as_object()
            .expect("paths")
            .keys()
            .map(String::as_str)
            .collect();
        let served: BTreeSet<&str> = api_routes()
            .into_iter()
            .chain(open_routes())
            .map(|(path, _)| path)
            .collect();
        assert_eq!(documented, served);
    }
}
