//! The server's configuration: a TOML file, then environment variables over it, then
//! defaults. With neither, the server binds 127.0.0.1:8080 and keeps its data in
//! `contexture.db` (SQLite).

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::Duration;

use contexture_core::compact::CompactionPolicy;
use contexture_core::fit::FitPolicy;
use contexture_core::thread::RunLimits;
use contexture_engine::hooks::{HookProgramSpec, ProgramHook};
use contexture_engine::render_workers::{RenderWorkers, WorkerCommand, WorkerLimits};
use contexture_engine::tools::{BUILT_IN_TOOLS, ProgramTool, Toolbox};
use contexture_engine::workflow::{McpServer, McpServerConfig};
use contexture_store::{RequestRetention, RetentionRules, Tenant};
use serde::{Deserialize, Serialize};

mod upstream;

pub use upstream::{RoutedUpstream, UpstreamConfig, UpstreamKind, upstreams};

/// Everything `contexture serve` can be told.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct ServerConfig {
    /// The address to listen on (`CONTEXTURE_BIND`).
    pub bind: SocketAddr,
    /// The store: `sqlite:PATH` or `postgres://...` (`CONTEXTURE_DB`).
    pub database: String,
    /// Where the workflows that executions name are read from (`CONTEXTURE_WORKFLOWS_DIR`).
    /// Without it, an execution can only be given its workflow's text, and no sub-workflow
    /// file can be read.
    pub workflows_dir: Option<PathBuf>,
    /// A models file (the format of `contexture models`) over the built-in registry
    /// (`CONTEXTURE_MODELS`).
    pub models_file: Option<PathBuf>,
    /// Authentication.
    pub auth: AuthConfig,
    /// Request limits.
    pub limits: LimitsConfig,
    /// What executions may do and spend.
    pub executions: ExecutionsConfig,
    /// The provider chat turns go to (`[upstream]`), for every model no entry of
    /// `upstreams` takes.
    pub upstream: UpstreamConfig,
    /// More providers, each for the models its patterns match (`[[upstreams]]`: `models`,
    /// `kind`, `base_url`, `api_key`, `timeout_secs`, `retries`); the first entry whose
    /// pattern matches a request's model takes it.
    pub upstreams: Vec<RoutedUpstream>,
    /// The LLM of workflow executions: `auto`, `openai[:MODEL]`, `anthropic[:MODEL]` or
    /// `scripted:FILE` (`CONTEXTURE_LLM`).
    pub llm: String,
    /// How chat threads' requests are fitted (`[context]`: the model's context window,
    /// which requests are fitted to): the window, its share, the reply reserve, which
    /// history survives, tool results cleared and truncated, hysteresis. A thread's own
    /// policy takes its place.
    #[serde(rename = "context")]
    pub fit: FitPolicy,
    /// Compaction of chat threads before a request, when a trigger fires (`[compaction]`;
    /// absent: none, requests are still trimmed to fit). A thread's own takes its place.
    pub compaction: Option<CompactionPolicy>,
    /// How long threads keep their request records, and how often the server prunes them.
    pub retention: RetentionConfig,
    /// How long a shutdown waits for requests in flight to finish, in seconds.
    pub shutdown_grace_secs: u64,
    /// Tools the operator registers by name (`[tools.NAME]`): every workflow on this server,
    /// a client's included, may use one by declaring a tool with `tool: NAME`. These are the
    /// only programs a client's workflow can reach.
    pub tools: BTreeMap<String, RegisteredTool>,
    /// Hook programs called at the hook points of every execution's steps (`[[hooks]]`:
    /// `command`, `points`, `timeout_seconds`, `environment`), after the workflow's own
    /// hooks. Operator configuration only: nothing a request sends names a hook program.
    /// Each sees only its `environment` and `PATH`, never the server's variables.
    pub hooks: Vec<HookProgramSpec>,
    /// MCP servers the operator declares (`[mcp_servers.NAME]`: `command`, `args`, `env`,
    /// or `url`, `headers`; `timeout_secs`, `start_timeout_secs`): a workflow on this
    /// server, a client's included, uses one by naming it (`mcp_servers: [NAME]`), and a
    /// client's workflow can use no other. Used as written (no templates); one started
    /// as a program is a host program (it needs `[executions] allow_programs = true`) and
    /// sees only its `env` and `PATH`.
    pub mcp_servers: BTreeMap<String, McpServerConfig>,
    /// Contexture's own MCP endpoint, `/mcp` (`[mcp_endpoint]`).
    pub mcp_endpoint: McpEndpointConfig,
}

/// Contexture's own MCP endpoint, `/mcp`.
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct McpEndpointConfig {
    /// The `Host` names (or `host:port`) that `/mcp` answers; others get a 403, against
    /// DNS rebinding (`CONTEXTURE_MCP_ALLOWED_HOSTS`, comma-separated). Empty (the default):
    /// `localhost`, `127.0.0.1`, `::1` and the bind address; `["*"]`: any name (behind a
    /// proxy that checks names itself).
    pub allowed_hosts: Vec<String>,
}

impl McpEndpointConfig {
    /// The names `/mcp` answers for a server bound to `bind`; `None`: any.
    pub fn allowed_hosts(&self, bind: SocketAddr) -> Option<Vec<String>> {
        if self.allowed_hosts.iter().any(|host| host == "*") {
            None
        } else if self.allowed_hosts.is_empty() {
            Some(crate::mcp::default_allowed_hosts(bind))
        } else {
            Some(self.allowed_hosts.clone())
        }
    }
}

impl Default for ServerConfig {
    fn default() -> Self {
        ServerConfig {
            bind: SocketAddr::from(([127, 0, 0, 1], 8080)),
            database: "sqlite:contexture.db".into(),
            workflows_dir: None,
            models_file: None,
            auth: AuthConfig::default(),
            limits: LimitsConfig::default(),
            executions: ExecutionsConfig::default(),
            upstream: UpstreamConfig::default(),
            upstreams: Vec::new(),
            llm: "auto".into(),
            fit: FitPolicy::default(),
            compaction: None,
            retention: RetentionConfig::default(),
            shutdown_grace_secs: 30,
            tools: BTreeMap::new(),
            hooks: Vec::new(),
            mcp_servers: BTreeMap::new(),
            mcp_endpoint: McpEndpointConfig::default(),
        }
    }
}

/// Who may call the API.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct AuthConfig {
    /// When set, requests without an API key act as this tenant (for local development;
    /// `CONTEXTURE_ANONYMOUS_TENANT`). By default every request needs a key.
    pub anonymous_tenant: Option<String>,
    /// How long, in seconds, a verified API key is trusted without asking the store again
    /// (default 5; `CONTEXTURE_KEY_CACHE_SECS`). A revoked key is refused at most this long
    /// after `contexture keys revoke`, on every server; 0 asks the store on every request.
    pub key_cache_secs: f64,
}

impl Default for AuthConfig {
    fn default() -> Self {
        AuthConfig {
            anonymous_tenant: None,
            key_cache_secs: 5.0,
        }
    }
}

impl AuthConfig {
    /// [`AuthConfig::key_cache_secs`] as a duration.
    pub fn key_cache(&self) -> Duration {
        Duration::from_secs_f64(self.key_cache_secs)
    }
}

/// Limits on what one client may send.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct LimitsConfig {
    /// The largest request body, in bytes (default 4 MiB).
    pub max_body_bytes: usize,
    /// Requests per second per API key, sustained (`CONTEXTURE_RATE_LIMIT`; 0: no limit).
    pub requests_per_second: f64,
    /// Requests per API key allowed in a burst above the sustained rate.
    pub burst: u32,
    /// A Redis server (`redis://host:port[/db]`) that holds the rate limits, shared by
    /// every server configured with the same one (`CONTEXTURE_RATE_LIMIT_REDIS`; default
    /// none). Without it, servers on one PostgreSQL database share their limits through
    /// it, and a server on SQLite keeps its own. A server that cannot reach it at start
    /// does not start; one that loses it later judges by its own bucket until it is back.
    pub rate_limit_redis: Option<String>,
    /// Seconds a client has to send a request's headers (and, on a kept-alive connection,
    /// the next request's) before the connection is closed (default 10).
    pub header_read_timeout_secs: f64,
    /// Seconds a client has to send a request's whole body (default 30); past it, a 408.
    pub body_read_timeout_secs: f64,
    /// Event streams (`GET /v1/executions/{id}/events`) one tenant may hold open at once on
    /// this server (default 16); past it, a 429.
    pub max_event_streams: usize,
    /// The most events one thread may hold: messages, requests and context operations alike
    /// (default 100,000). An append past it stores nothing and answers 413; an execution
    /// whose log is full fails.
    pub max_thread_events: u64,
    /// The most bytes of events one thread may hold, as stored (default 512 MiB). An append
    /// past it stores nothing and answers 413; an execution whose log fills up fails.
    pub max_thread_bytes: u64,
    /// Seconds a chat turn waits for the turns before it on its thread to end (default 60):
    /// turns on one thread run one at a time, in the order they arrived, across servers.
    /// Past it, a 409 with nothing stored.
    pub thread_turn_wait_secs: f64,
    /// Chat completions one tenant may have in flight at once on this server, waiting for
    /// their thread or answering (default 16); past it, a 429.
    pub max_chat_turns: usize,
    /// Named contexts one thread may have, `main` included (default 64); a switch that
    /// would start one more answers 409.
    pub max_contexts_per_thread: usize,
    /// About the most bytes of JSON one page of a thread's events holds (default 8 MiB):
    /// a page ends before the event that would pass it (its first event always goes in),
    /// and `next_after` continues it.
    pub max_page_bytes: usize,
    /// About the most memory the store's cache of recently read threads holds (default
    /// 16 MiB, the folds of some hundreds of conversations; 0 keeps none): a thread read
    /// again within it costs only its new events (a thread larger than the bound is kept
    /// alone). Once a server has served more threads than it holds, this cache is full, and
    /// is most of the server's resident memory: raise it for many long threads in use at once. An eighth more bounds the message bodies the SQLite writer keeps so
    /// that a thread's next request record reads only the thread's new messages.
    pub projection_cache_bytes: u64,
}

impl LimitsConfig {
    /// How long a chat turn waits for the turns before it on its thread.
    pub fn thread_turn_wait(&self) -> std::time::Duration {
        std::time::Duration::from_secs_f64(self.thread_turn_wait_secs)
    }
}

impl Default for LimitsConfig {
    fn default() -> Self {
        LimitsConfig {
            max_body_bytes: 4 * 1024 * 1024,
            requests_per_second: 100.0,
            burst: 200,
            rate_limit_redis: None,
            header_read_timeout_secs: 10.0,
            body_read_timeout_secs: 30.0,
            max_event_streams: 16,
            max_thread_events: 100_000,
            max_thread_bytes: 512 * 1024 * 1024,
            thread_turn_wait_secs: 60.0,
            max_chat_turns: 16,
            max_contexts_per_thread: contexture_core::thread::DEFAULT_MAX_CONTEXTS,
            max_page_bytes: 8 * 1024 * 1024,
            projection_cache_bytes: contexture_store::DEFAULT_PROJECTION_CACHE_BYTES,
        }
    }
}

/// What workflow executions may do on this host and spend. A workflow sent in a request
/// (`workflow_yaml`) never starts a program, whatever this says.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct ExecutionsConfig {
    /// Let the workflows of `workflows_dir` start programs on this host (`command` tools,
    /// MCP servers started as programs), as the server's user (default false;
    /// `CONTEXTURE_ALLOW_PROGRAMS`).
    pub allow_programs: bool,
    /// The most steps of one execution (a workflow may set fewer; default 200).
    pub max_steps: u64,
    /// The most tokens one execution's calls may use (a workflow may set fewer; default
    /// 1,000,000).
    pub max_tokens: u64,
    /// The most seconds one execution may run before it is cancelled (a workflow may set
    /// fewer; default 600).
    pub max_seconds: f64,
    /// Executions one tenant may have running at once, across every server on the
    /// database (default 8); past it, its new runs wait in the queue.
    pub max_running: usize,
    /// Executions this server runs at once, of every tenant (default 32); past it, runs
    /// wait in the queue for this server or another.
    pub node_capacity: usize,
    /// How long a server's hold on a run lasts without a renewal, in seconds (default 30;
    /// renewed every third of it). When a server dies or loses the database, another takes
    /// its runs over this long after its last renewal.
    pub lease_secs: f64,
    /// How often a server looks for queued runs and runs whose server died, in seconds
    /// (default 1; a run started on this server is taken at once).
    pub claim_interval_secs: f64,
    /// How many times a run may stop on a database error while the database still answers
    /// (an error of the run's own, such as a value the database refuses) before it is
    /// ended as failed, the last error in its log (default 5). Each time, it is taken up
    /// again from its log a claim interval later, by this server or another, so that a
    /// passing error costs a retry, not the run. A database that does not answer at all
    /// counts nothing: the run waits for its lease, as when its server dies.
    pub max_database_failures: u32,
    /// How long a finished run's row stays in the queue, in days (default 7; 0 keeps them
    /// for good): past it the background pruning (every `retention.interval_secs`)
    /// deletes the row. The run's log stays; its status loses only its `queue` part.
    pub queue_keep_finished_days: f64,
    /// The program (and its arguments) that renders the templates and expressions of a
    /// workflow a client sent, in worker processes whose memory and time are bounded.
    /// `contexture serve` uses its own `template-worker` command unless this names another;
    /// a server built without one renders them in its own process, bounded only by fuel.
    pub template_worker: Option<Vec<String>>,
    /// The memory one template worker may map, in MiB (default 1024); a render that needs
    /// more fails with this limit named.
    pub template_memory_mib: u64,
    /// The seconds one such render may take before its worker is stopped (default 5).
    pub template_seconds: f64,
    /// Template workers alive at once on this server (default 4): together they hold at
    /// most this many times `template_memory_mib`; a render waits for a free one.
    pub template_workers: usize,
}

impl Default for ExecutionsConfig {
    fn default() -> Self {
        ExecutionsConfig {
            allow_programs: false,
            max_steps: 200,
            max_tokens: 1_000_000,
            max_seconds: 600.0,
            max_running: 8,
            node_capacity: 32,
            lease_secs: 30.0,
            claim_interval_secs: 1.0,
            max_database_failures: 5,
            queue_keep_finished_days: 7.0,
            template_worker: None,
            template_memory_mib: 1024,
            template_seconds: 5.0,
            template_workers: 4,
        }
    }
}

impl ExecutionsConfig {
    /// How long a server's hold on a run lasts without a renewal.
    pub fn lease(&self) -> std::time::Duration {
        std::time::Duration::from_secs_f64(self.lease_secs)
    }

    /// How often a server looks for runs to take.
    pub fn claim_interval(&self) -> std::time::Duration {
        std::time::Duration::from_secs_f64(self.claim_interval_secs)
    }

    /// How long a finished run's row stays in the queue; `None`: for good.
    pub fn queue_keep_finished(&self) -> Option<std::time::Duration> {
        (self.queue_keep_finished_days > 0.0)
            .then(|| std::time::Duration::from_secs_f64(self.queue_keep_finished_days * 86_400.0))
    }

    /// The workers that render a client's templates, when a worker program is configured.
    pub fn render_workers(&self) -> Option<RenderWorkers> {
        let (program, args) = self.template_worker.as_ref()?.split_first()?;
        Some(RenderWorkers::new(
            WorkerCommand {
                program: program.into(),
                args: args.to_vec(),
            },
            WorkerLimits {
                max_memory_bytes: self.template_memory_mib.saturating_mul(1024 * 1024),
                max_duration: Duration::from_secs_f64(self.template_seconds),
                max_workers: self.template_workers,
            },
        ))
    }

    /// The ceilings every execution's limits are held under.
    pub fn limit_caps(&self) -> RunLimits {
        RunLimits {
            max_tokens: Some(self.max_tokens),
            max_cost_usd: None,
            max_steps: Some(self.max_steps),
            max_seconds: Some(self.max_seconds),
        }
    }
}

/// A program the operator registers as a tool. It runs as given: a workflow chooses neither
/// the program nor its arguments, only the call's arguments, which arrive as a JSON object
/// on standard input (standard output is the result). It sees only `env` and `PATH`, never
/// the server's environment (where the upstream key lives).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RegisteredTool {
    /// The program and its arguments.
    pub command: Vec<String>,
    /// The environment variables it sees, besides `PATH`.
    #[serde(default)]
    pub env: BTreeMap<String, String>,
    /// Seconds a call may take before the program is killed (default 60), whatever the
    /// workflow's declaration asks for.
    #[serde(default = "default_tool_timeout_secs")]
    pub timeout_secs: f64,
}

fn default_tool_timeout_secs() -> f64 {
    contexture_engine::tools::DEFAULT_TOOL_TIMEOUT.as_secs_f64()
}

/// How long threads keep the messages of their request records (`[retention]`); message
/// events are always kept. A thread's own policy (set through the API or `contexture
/// thread retention`) comes first, then its tenant's (`[retention.tenants.NAME]`), then
/// `keep_days` / `keep_last` here; with none of them, records are kept.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct RetentionConfig {
    /// Keep request records appended in the last this many days.
    pub keep_days: Option<u32>,
    /// Keep each thread's newest this many request records.
    pub keep_last: Option<u64>,
    /// Seconds between two prunings in the background (0: never; `contexture thread prune`
    /// still prunes by the same policies).
    pub interval_secs: u64,
    /// Policies by tenant, over the default.
    pub tenants: BTreeMap<String, RequestRetention>,
}

impl Default for RetentionConfig {
    fn default() -> Self {
        RetentionConfig {
            keep_days: None,
            keep_last: None,
            interval_secs: 300,
            tenants: BTreeMap::new(),
        }
    }
}

impl RetentionConfig {
    /// The rules pruning applies to threads without a policy of their own: a tenant's
    /// threads are those under its prefix.
    pub fn rules(&self) -> Result<RetentionRules, ConfigError> {
        let default =
            match (self.keep_days, self.keep_last) {
                (None, None) => None,
                (days, last) => Some(RequestRetention::new(days, last).map_err(|error| {
                    ConfigError::Invalid {
                        field: "retention",
                        problem: error.to_string(),
                    }
                })?),
            };
        let mut rules = RetentionRules::with_default(default);
        for (name, policy) in &self.tenants {
            let problem = |problem: String| ConfigError::Invalid {
                field: "retention.tenants",
                problem: format!("`{name}`: {problem}"),
            };
            let tenant = Tenant::new(name.clone()).map_err(|error| problem(error.to_string()))?;
            policy.check().map_err(|error| problem(error.to_string()))?;
            rules = rules.with_tenant(&tenant, *policy);
        }
        Ok(rules)
    }
}

/// A database URL as logs and errors may show it: without its password, in the URL form
/// (`postgres://user:***@host/db`) and the key-value form (`password=***`).
pub fn redacted_database(url: &str) -> String {
    if let (Some(scheme), Some(at)) = (url.find("://"), url.rfind('@'))
        && at > scheme
    {
        let credentials = &url[scheme + 3..at];
        return match credentials.split_once(':') {
            Some((user, _)) => format!("{}{user}:***{}", &url[..scheme + 3], &url[at..]),
            None => url.to_owned(),
        };
    }
    url.split(' ')
        .map(|part| match part.split_once('=') {
            Some((name, _)) if name.eq_ignore_ascii_case("password") => format!("{name}=***"),
            _ => part.to_owned(),
        })
        .collect::<Vec<_>>()
        .join(" ")
}

/// A configuration that cannot be used.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    /// The file could not be read.
    #[error("cannot read the configuration file {}: {source}", path.display())]
    Read {
        /// The file.
        path: PathBuf,
        /// Why.
        source: std::io::Error,
    },
    /// The file is not valid TOML for this configuration.
    #[error("{}:{position} {message}", path.display())]
    Parse {
        /// The file.
        path: PathBuf,
        /// `LINE:COLUMN:` of the mistake, when known.
        position: String,
        /// What was wrong.
        message: String,
    },
    /// An environment variable has a value that cannot be used.
    #[error("environment variable {name}: {problem}")]
    Env {
        /// The variable.
        name: &'static str,
        /// What was wrong.
        problem: String,
    },
    /// A registered tool cannot be used.
    #[error("tools.{name}: {problem}")]
    Tool {
        /// The tool's name.
        name: String,
        /// What was wrong.
        problem: String,
    },
    /// An MCP server's declaration cannot be used.
    #[error("mcp_servers.{name}: {problem}")]
    McpServer {
        /// The server's name.
        name: String,
        /// What was wrong.
        problem: String,
    },
    /// An entry of `upstreams` cannot be used.
    #[error("upstreams[{index}].{problem}")]
    Upstream {
        /// Its position in `upstreams`.
        index: usize,
        /// What was wrong, starting with the setting.
        problem: String,
    },
    /// A hook program cannot be used.
    #[error("hooks[{index}].{problem}")]
    Hook {
        /// Its position in `hooks`.
        index: usize,
        /// What was wrong, starting with the setting.
        problem: String,
    },
    /// A value is out of range.
    #[error("{field}: {problem}")]
    Invalid {
        /// The setting.
        field: &'static str,
        /// What was wrong.
        problem: String,
    },
}

impl ServerConfig {
    /// Reads `file` (when given), then applies the environment `env` gives (use
    /// `|name| std::env::var(name).ok()`), then checks the result.
    pub fn load(
        file: Option<&Path>,
        env: impl Fn(&str) -> Option<String>,
    ) -> Result<ServerConfig, ConfigError> {
        let mut config = match file {
            Some(path) => {
                let text = std::fs::read_to_string(path).map_err(|source| ConfigError::Read {
                    path: path.to_owned(),
                    source,
                })?;
                Self::parse(&text, path)?
            }
            None => ServerConfig::default(),
        };
        config.apply_env(env)?;
        config.check()?;
        Ok(config)
    }

    /// Parses a TOML text (`path` names it in errors).
    pub fn parse(text: &str, path: &Path) -> Result<ServerConfig, ConfigError> {
        toml::from_str(text).map_err(|error| {
            let position = error
                .span()
                .map(|span| {
                    let before = &text[..span.start.min(text.len())];
                    let line = before.matches('\n').count() + 1;
                    let column = before.rsplit('\n').next().map_or(0, |l| l.chars().count()) + 1;
                    format!("{line}:{column}:")
                })
                .unwrap_or_default();
            ConfigError::Parse {
                path: path.to_owned(),
                position,
                message: error.message().trim_end().to_owned(),
            }
        })
    }

    fn apply_env(&mut self, env: impl Fn(&str) -> Option<String>) -> Result<(), ConfigError> {
        let set = |name: &str| env(name).filter(|value| !value.is_empty());
        if let Some(bind) = set("CONTEXTURE_BIND") {
            self.bind = bind.parse().map_err(|error| ConfigError::Env {
                name: "CONTEXTURE_BIND",
                problem: format!("`{bind}` is not an address like 127.0.0.1:8080 ({error})"),
            })?;
        }
        if let Some(db) = set("CONTEXTURE_DB") {
            self.database = db;
        }
        if let Some(dir) = set("CONTEXTURE_WORKFLOWS_DIR") {
            self.workflows_dir = Some(dir.into());
        }
        if let Some(allow) = set("CONTEXTURE_ALLOW_PROGRAMS") {
            self.executions.allow_programs = match allow.as_str() {
                "true" | "1" | "yes" => true,
                "false" | "0" | "no" => false,
                other => {
                    return Err(ConfigError::Env {
                        name: "CONTEXTURE_ALLOW_PROGRAMS",
                        problem: format!("`{other}` is not true or false"),
                    });
                }
            };
        }
        if let Some(hosts) = set("CONTEXTURE_MCP_ALLOWED_HOSTS") {
            self.mcp_endpoint.allowed_hosts = hosts
                .split(',')
                .map(str::trim)
                .filter(|host| !host.is_empty())
                .map(str::to_owned)
                .collect();
        }
        if let Some(file) = set("CONTEXTURE_MODELS") {
            self.models_file = Some(file.into());
        }
        if let Some(llm) = set("CONTEXTURE_LLM") {
            self.llm = llm;
        }
        if let Some(tenant) = set("CONTEXTURE_ANONYMOUS_TENANT") {
            self.auth.anonymous_tenant = Some(tenant);
        }
        if let Some(url) = set("CONTEXTURE_UPSTREAM_URL").or_else(|| set("OPENAI_BASE_URL")) {
            self.upstream.base_url = Some(url);
        }
        if let Some(key) = set("CONTEXTURE_UPSTREAM_KEY").or_else(|| set("OPENAI_API_KEY")) {
            self.upstream.api_key = Some(key);
        }
        let number = |name: &'static str, unit: &str| {
            set(name)
                .map(|text| {
                    text.parse::<f64>().map_err(|_| ConfigError::Env {
                        name,
                        problem: format!("`{text}` is not a number of {unit}"),
                    })
                })
                .transpose()
        };
        if let Some(secs) = number("CONTEXTURE_KEY_CACHE_SECS", "seconds")? {
            self.auth.key_cache_secs = secs;
        }
        if let Some(rate) = number("CONTEXTURE_RATE_LIMIT", "requests per second")? {
            self.limits.requests_per_second = rate;
        }
        if let Some(url) = set("CONTEXTURE_RATE_LIMIT_REDIS") {
            self.limits.rate_limit_redis = Some(url);
        }
        Ok(())
    }

    /// The tools executions can use: the built-ins and the operator's registered ones.
    pub fn toolbox(&self) -> Result<Toolbox, ConfigError> {
        let mut toolbox = Toolbox::default();
        for (name, tool) in &self.tools {
            let problem = |problem: String| ConfigError::Tool {
                name: name.clone(),
                problem,
            };
            if BUILT_IN_TOOLS.contains(&name.as_str()) {
                return Err(problem(format!(
                    "`{name}` is a built-in tool; register this one under another name"
                )));
            }
            if name.is_empty()
                || name.len() > 64
                || !name
                    .chars()
                    .all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '-')
            {
                return Err(problem(
                    "a tool's name is 1 to 64 letters, digits, `_` or `-`".into(),
                ));
            }
            if !(tool.timeout_secs.is_finite() && tool.timeout_secs > 0.0) {
                return Err(problem(format!(
                    "timeout_secs must be above 0, not {}",
                    tool.timeout_secs
                )));
            }
            let runner = ProgramTool::new(
                tool.command.clone(),
                tool.env.clone(),
                Duration::from_secs_f64(tool.timeout_secs),
            )
            .map_err(problem)?;
            toolbox.register(name.clone(), std::sync::Arc::new(runner));
        }
        for (name, config) in &self.mcp_servers {
            let problem = |problem: String| ConfigError::McpServer {
                name: name.clone(),
                problem,
            };
            let declaration = McpServer {
                name: name.clone(),
                resolve_dynamic_values_in_arguments: false,
                config: config.clone(),
            };
            if let Some(why) = declaration.name_problem() {
                return Err(problem(why));
            }
            if let Some((field, why)) = config.problems().into_iter().next() {
                return Err(problem(format!("{field}: {why}")));
            }
            if config.is_reference() {
                return Err(problem(
                    "give `command` (a program speaking MCP on its standard input and output) or `url` (streamable HTTP)".into(),
                ));
            }
            if config.command.is_some() && !self.executions.allow_programs {
                return Err(problem(
                    "`command` starts a program on this host, which needs `[executions] allow_programs = true`".into(),
                ));
            }
            toolbox.declare_mcp_server(name.clone(), config.clone());
        }
        Ok(toolbox)
    }

    /// The operator's hook programs, each seeing only its own environment (and `PATH`).
    pub fn hook_programs(&self) -> Result<Vec<ProgramHook>, ConfigError> {
        self.hooks
            .iter()
            .enumerate()
            .map(|(index, spec)| {
                let mut spec = spec.clone();
                spec.environment.get_or_insert_with(BTreeMap::new);
                ProgramHook::new(spec).map_err(|problem| ConfigError::Hook { index, problem })
            })
            .collect()
    }

    fn check(&self) -> Result<(), ConfigError> {
        let invalid = |field, problem: String| Err(ConfigError::Invalid { field, problem });
        if self.limits.max_body_bytes == 0 {
            return invalid("limits.max_body_bytes", "must be above 0".into());
        }
        if let Some(url) = &self.limits.rate_limit_redis
            && !(url.starts_with("redis://") || url.starts_with("rediss://"))
        {
            return invalid(
                "limits.rate_limit_redis",
                format!(
                    "`{}` is not a Redis URL (redis://host:port)",
                    redacted_database(url)
                ),
            );
        }
        if !(self.limits.requests_per_second.is_finite() && self.limits.requests_per_second >= 0.0)
        {
            return invalid(
                "limits.requests_per_second",
                format!(
                    "must be 0 (no limit) or more, not {}",
                    self.limits.requests_per_second
                ),
            );
        }
        for (field, secs) in [
            (
                "limits.header_read_timeout_secs",
                self.limits.header_read_timeout_secs,
            ),
            (
                "limits.body_read_timeout_secs",
                self.limits.body_read_timeout_secs,
            ),
        ] {
            if !(secs.is_finite() && secs > 0.0 && secs <= 3600.0) {
                return invalid(
                    field,
                    format!("must be above 0 and at most 3600, not {secs}"),
                );
            }
        }
        if !(self.auth.key_cache_secs.is_finite()
            && (0.0..=3600.0).contains(&self.auth.key_cache_secs))
        {
            return invalid(
                "auth.key_cache_secs",
                format!(
                    "must be 0 (no cache) to 3600 seconds, not {}",
                    self.auth.key_cache_secs
                ),
            );
        }
        upstream::check(&self.upstream, &self.upstreams)?;
        if !(self.upstream.abandon_after_secs.is_finite() && self.upstream.abandon_after_secs > 0.0)
        {
            return invalid(
                "upstream.abandon_after_secs",
                format!("must be above 0, not {}", self.upstream.abandon_after_secs),
            );
        }
        if self.executions.max_steps == 0 {
            return invalid("executions.max_steps", "must be at least 1".into());
        }
        if self.executions.max_running == 0 {
            return invalid("executions.max_running", "must be at least 1".into());
        }
        if self.executions.node_capacity == 0 {
            return invalid("executions.node_capacity", "must be at least 1".into());
        }
        if self.executions.max_database_failures == 0 {
            return invalid(
                "executions.max_database_failures",
                "must be at least 1 (the first failure ends the run)".into(),
            );
        }
        for (field, value, range, lowest) in [
            (
                "executions.lease_secs",
                self.executions.lease_secs,
                0.3..=86_400.0,
                "0.3",
            ),
            (
                "executions.claim_interval_secs",
                self.executions.claim_interval_secs,
                0.01..=3600.0,
                "0.01",
            ),
            (
                "executions.queue_keep_finished_days",
                self.executions.queue_keep_finished_days,
                0.0..=36_500.0,
                "0 (keep for good)",
            ),
        ] {
            if !(value.is_finite() && range.contains(&value)) {
                return invalid(
                    field,
                    format!("must be from {lowest} to {}, not {value}", range.end()),
                );
            }
        }
        if self.limits.max_thread_events == 0 {
            return invalid("limits.max_thread_events", "must be at least 1".into());
        }
        if self.limits.max_thread_bytes == 0 {
            return invalid("limits.max_thread_bytes", "must be at least 1".into());
        }
        if !(self.limits.thread_turn_wait_secs.is_finite()
            && (0.0..=3600.0).contains(&self.limits.thread_turn_wait_secs))
        {
            return invalid(
                "limits.thread_turn_wait_secs",
                format!(
                    "must be 0 (never wait) to 3600 seconds, not {}",
                    self.limits.thread_turn_wait_secs
                ),
            );
        }
        if self.limits.max_page_bytes < 1024 {
            return invalid(
                "limits.max_page_bytes",
                format!("must be at least 1024, not {}", self.limits.max_page_bytes),
            );
        }
        if self.limits.max_contexts_per_thread == 0 {
            return invalid(
                "limits.max_contexts_per_thread",
                "must be at least 1".into(),
            );
        }
        if self.limits.max_chat_turns == 0 {
            return invalid("limits.max_chat_turns", "must be at least 1".into());
        }
        if self.limits.max_event_streams == 0 {
            return invalid("limits.max_event_streams", "must be at least 1".into());
        }
        if self.executions.max_tokens == 0 {
            return invalid("executions.max_tokens", "must be at least 1".into());
        }
        if !(self.executions.max_seconds.is_finite() && self.executions.max_seconds > 0.0) {
            return invalid(
                "executions.max_seconds",
                format!("must be above 0, not {}", self.executions.max_seconds),
            );
        }
        if let Some(worker) = &self.executions.template_worker
            && worker
                .first()
                .is_none_or(|program| program.trim().is_empty())
        {
            return invalid(
                "executions.template_worker",
                "must name a program (and its arguments)".into(),
            );
        }
        if self.executions.template_memory_mib < 64 {
            return invalid(
                "executions.template_memory_mib",
                format!(
                    "must be at least 64 (a worker needs room for itself), not {}",
                    self.executions.template_memory_mib
                ),
            );
        }
        if !(self.executions.template_seconds.is_finite() && self.executions.template_seconds > 0.0)
        {
            return invalid(
                "executions.template_seconds",
                format!("must be above 0, not {}", self.executions.template_seconds),
            );
        }
        self.retention.rules()?;
        if self.executions.template_workers == 0 {
            return invalid("executions.template_workers", "must be at least 1".into());
        }
        if self.executions.allow_programs && self.workflows_dir.is_none() {
            return invalid(
                "executions.allow_programs",
                "programs run only for the workflows of `workflows_dir`, which is not set".into(),
            );
        }
        self.toolbox()?;
        self.hook_programs()?;
        if let Some((field, problem)) = self.fit.problems().into_iter().next() {
            return invalid("context", format!("{field}: {problem}"));
        }
        if let Some(policy) = &self.compaction
            && let Some((field, problem)) = policy.problems().into_iter().next()
        {
            return invalid("compaction", format!("{field}: {problem}"));
        }
        if let Some(tenant) = &self.auth.anonymous_tenant
            && let Err(problem) = crate::tenancy::check_tenant(tenant)
        {
            return invalid("auth.anonymous_tenant", problem);
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn no_file_and_no_environment_give_the_defaults() {
        let config = ServerConfig::load(None, |_| None).unwrap();
        assert_eq!(config, ServerConfig::default());
        assert_eq!(config.database, "sqlite:contexture.db");
    }

    #[test]
    fn the_environment_wins_over_the_file() {
        let file = ServerConfig::parse(
            "bind = \"127.0.0.1:9000\"\ndatabase = \"sqlite:a.db\"\n[upstream]\nbase_url = \"http://file\"\n",
            Path::new("c.toml"),
        )
        .unwrap();
        assert_eq!(file.bind.port(), 9000);
        let mut config = file;
        config
            .apply_env(|name| match name {
                "CONTEXTURE_DB" => Some("postgres://x/y".into()),
                "OPENAI_API_KEY" => Some("sk-secret".into()),
                _ => None,
            })
            .unwrap();
        assert_eq!(config.database, "postgres://x/y");
        assert_eq!(config.upstream.base_url(), "http://file");
        assert_eq!(config.upstream.api_key.as_deref(), Some("sk-secret"));
        assert!(!format!("{config:?}").contains("sk-secret"));
    }

    #[test]
    fn the_documented_example_is_valid() {
        let doc = include_str!("../../../docs/server.md");
        let start = doc.find("```toml\n").expect("a toml block") + 8;
        let text = &doc[start..start + doc[start..].find("```").unwrap()];
        let config = ServerConfig::parse(text, Path::new("docs/server.md")).unwrap();
        config.check().unwrap();
        assert_eq!(config.upstream.retries, 2);
        assert_eq!(config.upstreams[0].kind, UpstreamKind::Anthropic);
        assert!(config.compaction.is_some());
        assert_eq!(config.fit.reserve, Some(4096));
    }

    #[test]
    fn database_passwords_are_redacted() {
        for (url, shown) in [
            (
                "postgres://me:secret@db:5432/x",
                "postgres://me:***@db:5432/x",
            ),
            ("postgres://me@db/x", "postgres://me@db/x"),
            (
                "host=db user=me password=secret dbname=x",
                "host=db user=me password=*** dbname=x",
            ),
            ("sqlite:a.db", "sqlite:a.db"),
        ] {
            assert_eq!(redacted_database(url), shown);
        }
    }

    #[test]
    fn mistakes_say_where() {
        let error =
            ServerConfig::parse("bind = \"x\"\n[limits]\nburst = -1\n", Path::new("c.toml"))
                .unwrap_err()
                .to_string();
        assert!(error.starts_with("c.toml:1:8: "), "{error}");
        let error = ServerConfig::parse("[limit]\n", Path::new("c.toml"))
            .unwrap_err()
            .to_string();
        assert!(error.contains("unknown field `limit`"), "{error}");
        let error = ServerConfig::load(None, |name| {
            (name == "CONTEXTURE_BIND").then(|| "localhost".to_owned())
        })
        .unwrap_err()
        .to_string();
        assert!(
            error.starts_with("environment variable CONTEXTURE_BIND"),
            "{error}"
        );
        let error = ServerConfig::parse("[context]\nstrategy = \"middle\"\n", Path::new("c.toml"))
            .unwrap_err()
            .to_string();
        assert!(error.starts_with("c.toml:2:"), "{error}");
        assert!(error.contains("unknown strategy `middle`"), "{error}");
    }

    #[test]
    fn a_redis_for_rate_limits_is_a_redis_url_from_the_file_or_the_environment() {
        let config = ServerConfig::parse(
            "[limits]\nrate_limit_redis = \"redis://127.0.0.1:6379/2\"\n",
            Path::new("c.toml"),
        )
        .unwrap();
        config.check().unwrap();
        assert_eq!(
            config.limits.rate_limit_redis.as_deref(),
            Some("redis://127.0.0.1:6379/2")
        );
        let error = ServerConfig::parse(
            "[limits]\nrate_limit_redis = \"http://user:secret@cache:6379\"\n",
            Path::new("c.toml"),
        )
        .unwrap()
        .check()
        .unwrap_err()
        .to_string();
        assert!(error.contains("limits.rate_limit_redis"), "{error}");
        assert!(
            !error.contains("secret"),
            "the password is not shown: {error}"
        );
        let config = ServerConfig::load(None, |name| {
            (name == "CONTEXTURE_RATE_LIMIT_REDIS").then(|| "redis://cache:6379".to_owned())
        })
        .unwrap();
        assert_eq!(
            config.limits.rate_limit_redis.as_deref(),
            Some("redis://cache:6379")
        );
        assert_eq!(ServerConfig::default().limits.rate_limit_redis, None);
    }

    #[test]
    fn finished_runs_are_kept_in_the_queue_for_days_or_for_good() {
        let parse = |text: &str| ServerConfig::parse(text, Path::new("c.toml"));
        let days = |text: &str| parse(text).unwrap().executions.queue_keep_finished();
        assert_eq!(
            ServerConfig::default().executions.queue_keep_finished(),
            Some(std::time::Duration::from_secs(7 * 86_400))
        );
        assert_eq!(days("[executions]\nqueue_keep_finished_days = 0\n"), None);
        assert_eq!(
            days("[executions]\nqueue_keep_finished_days = 0.5\n"),
            Some(std::time::Duration::from_secs(43_200))
        );
        for bad in ["-1", "nan", "inf", "40000"] {
            let error = parse(&format!("[executions]\nqueue_keep_finished_days = {bad}\n"))
                .unwrap()
                .check()
                .unwrap_err()
                .to_string();
            assert!(
                error.contains("executions.queue_keep_finished_days"),
                "{bad}: {error}"
            );
        }
        let error = parse("[executions]\nqueue_keep_finished_days = \"week\"\n")
            .unwrap_err()
            .to_string();
        assert!(error.starts_with("c.toml:2:"), "{error}");
    }

    #[test]
    fn the_context_section_is_a_fit_policy() {
        let text = "[context]\nwindow = 16000\nreserve_output = 1000\nstrategy = \"head-tail\"\n\
                    clear_tool_results = { trigger_tokens = 9000, keep = 3, clear_at_least = 2000 }\n\
                    truncate_tool_results = { max_tokens = 4000 }\n\
                    hysteresis = { high = 0.9, low = 0.6 }\n";
        let config = ServerConfig::parse(text, Path::new("c.toml")).unwrap();
        config.check().unwrap();
        let policy = &config.fit;
        assert_eq!(policy.window, Some(16_000));
        assert_eq!(policy.reserve, Some(1_000));
        assert_eq!(policy.clear_tool_results.as_ref().unwrap().keep, 3);
        assert_eq!(policy.truncate_tool_results.unwrap().max_tokens, 4_000);
        let text = "[context]\nclear_tool_results = { trigger_tool_uses = 12, clear_inputs = [\"search\"] }\n\
                    clear_thinking = { keep_turns = 2 }\n";
        let config = ServerConfig::parse(text, Path::new("c.toml")).unwrap();
        config.check().unwrap();
        let clear = config.fit.clear_tool_results.as_ref().unwrap();
        assert_eq!(
            (clear.trigger_tokens, clear.trigger_tool_uses, clear.keep),
            (None, Some(12), 3)
        );
        assert_eq!(
            clear.clear_inputs,
            contexture_core::fit::ClearInputs::Tools(vec!["search".into()])
        );
        assert_eq!(config.fit.clear_thinking.unwrap().keep_turns, 2);
        let config = ServerConfig::parse(
            "[context]\nclear_tool_results = { keep = 2 }\n",
            Path::new("c.toml"),
        )
        .unwrap();
        match config.check() {
            Err(ConfigError::Invalid { problem, .. }) => {
                assert!(
                    problem.starts_with("clear_tool_results.trigger_tokens: set trigger_tokens"),
                    "{problem}"
                );
            }
            other => panic!("not refused: {other:?}"),
        }
        let error = ServerConfig::parse("[context]\nwindw = 1\n", Path::new("c.toml"))
            .unwrap_err()
            .to_string();
        assert!(error.contains("unknown field `windw`"), "{error}");
        let config = ServerConfig::parse(
            "[context]\nhysteresis = { high = 0.5, low = 0.8 }\n",
            Path::new("c.toml"),
        )
        .unwrap();
        match config.check() {
            Err(ConfigError::Invalid { field, problem }) => {
                assert_eq!(field, "context");
                assert!(problem.starts_with("hysteresis.low: "), "{problem}");
            }
            other => panic!("not refused: {other:?}"),
        }
    }

    #[test]
    fn template_worker_settings_are_checked() {
        let mut config = ServerConfig::default();
        config.executions.template_worker = Some(vec![" ".into()]);
        let invalid = |config: ServerConfig| match config.check() {
            Err(ConfigError::Invalid { field, problem }) => (field, problem),
            other => panic!("not an invalid setting: {other:?}"),
        };
        assert_eq!(invalid(config).0, "executions.template_worker");
        let mut config = ServerConfig::default();
        config.executions.template_memory_mib = 8;
        let (field, problem) = invalid(config);
        assert_eq!(field, "executions.template_memory_mib");
        assert!(problem.starts_with("must be at least 64"), "{problem}");
        let mut config = ServerConfig::default();
        config.executions.template_seconds = f64::NAN;
        assert_eq!(invalid(config).0, "executions.template_seconds");
        let config = ServerConfig::load(None, |_| None).unwrap();
        assert!(config.executions.render_workers().is_none());
    }

    #[test]
    fn mcp_servers_are_checked_and_a_program_needs_programs_allowed() {
        let parse = |text: &str| ServerConfig::parse(text, Path::new("serve.toml")).unwrap();
        let http = parse(
            "[mcp_servers.search]\nurl = \"http://127.0.0.1:9000/mcp\"\nheaders = {Authorization = \"Bearer t\"}\n",
        );
        let toolbox = http.toolbox().unwrap();
        assert_eq!(
            toolbox.mcp_server("search").unwrap().url.as_deref(),
            Some("http://127.0.0.1:9000/mcp")
        );
        let program = "[mcp_servers.files]\ncommand = \"python3\"\nargs = [\"fs.py\"]\n";
        let error = parse(program).toolbox().unwrap_err().to_string();
        assert_eq!(
            error,
            "mcp_servers.files: `command` starts a program on this host, which needs `[executions] allow_programs = true`"
        );
        let mut allowed = parse(program);
        allowed.executions.allow_programs = true;
        assert!(allowed.toolbox().unwrap().mcp_server("files").is_some());
        for (text, expected) in [
            (
                "[mcp_servers.\"a.b\"]\nurl = \"http://h/mcp\"\n",
                "mcp_servers.a.b: `a.b` may hold",
            ),
            ("[mcp_servers.x]\n", "mcp_servers.x: give `command`"),
            (
                "[mcp_servers.x]\nurl = \"ftp://h\"\n",
                "mcp_servers.x: url: `ftp://h` is not",
            ),
        ] {
            let error = parse(text).toolbox().unwrap_err().to_string();
            assert!(error.starts_with(expected), "{error}");
        }
        let unknown = ServerConfig::parse(
            "[mcp_servers.x]\nurl = \"http://h\"\ncwd = \"/\"\n",
            Path::new("serve.toml"),
        )
        .unwrap_err()
        .to_string();
        assert!(unknown.contains("unknown field `cwd`"), "{unknown}");
    }
}
