//! Tools: what runs when a tool state runs or an assistant calls a tool.
//!
//! A workflow's tool declares what runs it (see [`crate::workflow::Tool`]): a local program
//! (`command`), a fixed answer (`response`), or a named implementation from the
//! [`Toolbox`]: a built-in ([`Echo`]) or one the library's caller registered with
//! [`Toolbox::register`] (such as a [`ProgramTool`], a program the operator vetted).
//!
//! Arguments: the configured ones (the tool's `arguments`, then a tool state's `tool_args`)
//! are templates rendered against the context; an assistant's call adds the arguments the
//! model passed, but never replaces a configured one (fixing CodeMie, where context keys
//! silently overrode configured arguments).

use std::collections::BTreeMap;
use std::process::Stdio;
use std::sync::Arc;
use std::time::Duration;

use contexture_core::context::args::{ArgError, resolve_arg_list, resolve_args};
use contexture_core::context::{ContextStore, RenderOptions, render};
use contexture_llm::BoxFuture;
use serde_json::{Map, Value};
use tokio::io::AsyncWriteExt;

use crate::workflow::{McpServerConfig, Tool};

/// The built-in tool that compacts the shared history (Dynamiq's context manager tool): an
/// assistant calls it with `notes` (kept verbatim, never summarized), `is_history_preserved`
/// (false keeps only the notes) and optional `history` lines; a tool state runs it with its
/// configured arguments. The executor runs it, since it needs the run's thread.
pub const CONTEXT_MANAGER: &str = "context_manager";

/// The built-in tool that answers with its arguments ([`Echo`]).
pub const ECHO: &str = "echo";

/// The names of the built-in tools, which a registered tool cannot take.
pub const BUILT_IN_TOOLS: [&str; 2] = [ECHO, CONTEXT_MANAGER];

/// The default time a tool call may take.
pub const DEFAULT_TOOL_TIMEOUT: Duration = Duration::from_secs(60);

/// Why a tool call failed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("tool `{tool}`: {message}")]
pub struct ToolError {
    /// The tool's id.
    pub tool: String,
    /// What went wrong.
    pub message: String,
}

impl ToolError {
    fn new(tool: &str, message: impl Into<String>) -> ToolError {
        ToolError {
            tool: tool.to_owned(),
            message: message.into(),
        }
    }
}

/// One call of a tool.
#[derive(Debug, Clone)]
pub struct ToolCallRequest<'a> {
    /// The tool's declaration.
    pub tool: &'a Tool,
    /// The arguments: the model's, then the configured ones over them.
    pub arguments: Map<String, Value>,
    /// The context store of the step.
    pub store: &'a ContextStore,
}

/// A tool implementation.
pub trait ToolRunner: Send + Sync {
    /// Runs one call and returns its result text.
    fn call<'a>(&'a self, request: ToolCallRequest<'a>)
    -> BoxFuture<'a, Result<String, ToolError>>;
}

/// The built-in `echo` tool: answers with its arguments as a JSON object. With configured
/// arguments it turns context values into a step output; in tests it shows what a tool
/// received.
#[derive(Debug, Clone, Copy, Default)]
pub struct Echo;

impl ToolRunner for Echo {
    fn call<'a>(
        &'a self,
        request: ToolCallRequest<'a>,
    ) -> BoxFuture<'a, Result<String, ToolError>> {
        Box::pin(async move { Ok(Value::Object(request.arguments).to_string()) })
    }
}

/// The named tool implementations a run can use, and the MCP servers the host declares
/// (which a workflow names without saying how to reach them).
#[derive(Clone)]
pub struct Toolbox {
    runners: BTreeMap<String, Arc<dyn ToolRunner>>,
    mcp_servers: BTreeMap<String, McpServerConfig>,
}

impl Default for Toolbox {
    fn default() -> Self {
        let mut toolbox = Toolbox {
            runners: BTreeMap::new(),
            mcp_servers: BTreeMap::new(),
        };
        toolbox.register(ECHO, Arc::new(Echo));
        toolbox
    }
}

impl std::fmt::Debug for Toolbox {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Toolbox")
            .field("tools", &self.runners.keys().collect::<Vec<_>>())
            .field("mcp_servers", &self.mcp_servers.keys().collect::<Vec<_>>())
            .finish()
    }
}

impl Toolbox {
    /// Registers `runner` under `name` (replacing one of that name).
    pub fn register(&mut self, name: impl Into<String>, runner: Arc<dyn ToolRunner>) {
        self.runners.insert(name.into(), runner);
    }

    /// Declares the host's MCP server `name` (replacing one of that name): a workflow that
    /// names it without a `command` or `url` of its own uses `config`, as given (its
    /// values are not templates). A server started as a program sees only its `env` and
    /// `PATH`, never the variables of the process that starts it (where API keys live).
    pub fn declare_mcp_server(&mut self, name: impl Into<String>, config: McpServerConfig) {
        self.mcp_servers.insert(name.into(), config);
    }

    /// The host's MCP server `name`, if it declared one.
    pub fn mcp_server(&self, name: &str) -> Option<&McpServerConfig> {
        self.mcp_servers.get(name)
    }

    /// The names of the host's MCP servers.
    pub fn mcp_server_names(&self) -> impl Iterator<Item = &str> {
        self.mcp_servers.keys().map(String::as_str)
    }

    /// The names of the registered implementations.
    pub fn names(&self) -> impl Iterator<Item = &str> {
        self.runners.keys().map(String::as_str)
    }

    /// Why `tool` cannot run, if it cannot: it names an implementation nobody registered.
    pub fn check(&self, tool: &Tool) -> Result<(), String> {
        if tool.command.is_some() || tool.response.is_some() {
            return Ok(());
        }
        let name = tool.tool.as_deref().unwrap_or(&tool.id);
        if self.runners.contains_key(name) || name == CONTEXT_MANAGER {
            Ok(())
        } else {
            Err(format!(
                "tool `{}` has no implementation: give it `command` or `response`, or `tool:` naming a registered tool (registered: {})",
                tool.id,
                self.names().collect::<Vec<_>>().join(", ")
            ))
        }
    }

    /// Runs `tool` once with `arguments` (see [`configured_arguments`] and
    /// [`merge_arguments`]), within the tool's timeout; returns the result text.
    pub async fn run(
        &self,
        tool: &Tool,
        arguments: Map<String, Value>,
        store: &ContextStore,
        options: &RenderOptions,
    ) -> Result<String, ToolError> {
        let timeout = tool
            .timeout_seconds
            .map_or(DEFAULT_TOOL_TIMEOUT, Duration::from_secs_f64);
        let call = self.dispatch(tool, arguments, store, options);
        let output = tokio::time::timeout(timeout, call)
            .await
            .map_err(|_| ToolError::new(&tool.id, format!("no result within {timeout:?}")))??;
        if tool.resolve_dynamic_values_in_response {
            return render(&output, store, options)
                .map(|rendered| rendered.text)
                .map_err(|error| {
                    ToolError::new(&tool.id, format!("in its response's templates: {error}"))
                });
        }
        Ok(output)
    }

    async fn dispatch(
        &self,
        tool: &Tool,
        arguments: Map<String, Value>,
        store: &ContextStore,
        options: &RenderOptions,
    ) -> Result<String, ToolError> {
        if let Some(command) = &tool.command {
            return run_command(tool, command, &arguments, store, options).await;
        }
        if let Some(response) = &tool.response {
            let options = options
                .clone()
                .with_variable("arguments", Value::Object(arguments));
            return respond(tool, response, store, &options);
        }
        let name = tool.tool.as_deref().unwrap_or(&tool.id);
        let runner = self
            .runners
            .get(name)
            .ok_or_else(|| ToolError::new(&tool.id, self.check(tool).unwrap_err()))?;
        runner
            .call(ToolCallRequest {
                tool,
                arguments,
                store,
            })
            .await
    }
}

/// A fixed answer: a string is rendered as a template; another value has the templates
/// inside it rendered and is returned as JSON.
fn respond(
    tool: &Tool,
    response: &Value,
    store: &ContextStore,
    options: &RenderOptions,
) -> Result<String, ToolError> {
    let fail = |error: contexture_core::context::TemplateError| {
        ToolError::new(&tool.id, format!("in its response: {error}"))
    };
    Ok(match response {
        Value::String(text) => render(text, store, options).map_err(fail)?.text,
        other => resolve_arg_list(std::slice::from_ref(other), store, options)
            .map_err(fail)?
            .into_iter()
            .next()
            .unwrap_or(Value::Null)
            .to_string(),
    })
}

/// The configured arguments of a call: the tool's `arguments`, with a tool state's
/// `tool_args` over them, their templates rendered against `context`.
pub fn configured_arguments(
    tool: &Tool,
    state_args: Option<&BTreeMap<String, Value>>,
    store: &ContextStore,
    options: &RenderOptions,
) -> Result<Map<String, Value>, ArgError> {
    let mut configured: Map<String, Value> = tool
        .arguments
        .iter()
        .map(|(k, v)| (k.clone(), v.clone()))
        .collect();
    for (name, value) in state_args.into_iter().flatten() {
        configured.insert(name.clone(), value.clone());
    }
    Ok(resolve_args(&configured, store, options)?.args)
}

/// The arguments of a model's call: what the model passed, with the configured arguments
/// over them (a model never replaces a configured argument).
pub fn merge_arguments(
    model: Map<String, Value>,
    configured: Map<String, Value>,
) -> Map<String, Value> {
    let mut arguments = model;
    for (name, value) in configured {
        arguments.insert(name, value);
    }
    arguments
}

/// Runs a workflow's `command` tool: its argv's templates rendered against the context, then
/// the program run as [`run_program`] runs it, with the server's environment.
async fn run_command(
    tool: &Tool,
    command: &[String],
    arguments: &Map<String, Value>,
    store: &ContextStore,
    options: &RenderOptions,
) -> Result<String, ToolError> {
    let argv: Vec<String> = command
        .iter()
        .map(|part| render(part, store, options).map(|rendered| rendered.text))
        .collect::<Result<_, _>>()
        .map_err(|error| ToolError::new(&tool.id, format!("in its command: {error}")))?;
    run_program(&tool.id, &argv, None, arguments).await
}

/// Runs a local program: the arguments as JSON on standard input, the result on standard
/// output. With `environment`, the program sees only those variables (and `PATH`);
/// without, it inherits this process's. The program is killed when the call is dropped
/// (a timeout, a cancelled run).
async fn run_program(
    tool_id: &str,
    argv: &[String],
    environment: Option<&BTreeMap<String, String>>,
    arguments: &Map<String, Value>,
) -> Result<String, ToolError> {
    let Some((program, program_args)) = argv.split_first() else {
        return Err(ToolError::new(tool_id, "its command is empty"));
    };
    let mut command = tokio::process::Command::new(program);
    command
        .args(program_args)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .kill_on_drop(true);
    if let Some(environment) = environment {
        confine_environment(command.as_std_mut(), environment);
    }
    let mut child = command
        .spawn()
        .map_err(|error| ToolError::new(tool_id, format!("cannot start `{program}`: {error}")))?;
    let input = Value::Object(arguments.clone()).to_string();
    if let Some(mut stdin) = child.stdin.take() {
        // A program that exits without reading its input is not an error in itself.
        let _ = stdin.write_all(input.as_bytes()).await;
    }
    let output = child
        .wait_with_output()
        .await
        .map_err(|error| ToolError::new(tool_id, format!("`{program}` failed: {error}")))?;
    let stdout = String::from_utf8(output.stdout).map_err(|_| {
        ToolError::new(
            tool_id,
            format!("`{program}` wrote output that is not UTF-8"),
        )
    })?;
    if !output.status.success() {
        return Err(ToolError::new(
            tool_id,
            format!(
                "`{program}` exited with {}{}",
                output.status,
                stderr_excerpt(&output.stderr)
                    .map(|excerpt| format!(": {excerpt}"))
                    .unwrap_or_default()
            ),
        ));
    }
    Ok(stdout.trim_end_matches('\n').to_owned())
}

/// The most characters of a failed program's standard error an error message quotes.
const STDERR_EXCERPT_CHARS: usize = 2000;

/// The start of what a failed program wrote on standard error, trimmed; `None` when it
/// wrote nothing.
pub(crate) fn stderr_excerpt(stderr: &[u8]) -> Option<String> {
    let excerpt: String = String::from_utf8_lossy(stderr)
        .trim()
        .chars()
        .take(STDERR_EXCERPT_CHARS)
        .collect();
    (!excerpt.is_empty()).then_some(excerpt)
}

/// Gives `command` only `environment` and this process's `PATH`: none of the variables of
/// the process that starts it (where API keys live).
pub(crate) fn confine_environment(
    command: &mut std::process::Command,
    environment: &BTreeMap<String, String>,
) {
    command.env_clear();
    if let Some(path) = std::env::var_os("PATH") {
        command.env("PATH", path);
    }
    command.envs(environment);
}

/// A program registered as a named tool by whoever runs the engine (the server's operator):
/// the workflows that name it (`tool: NAME`), a client's included, run exactly this argv,
/// never one of their own. The call's arguments arrive as a JSON object on standard input;
/// standard output is the result. It sees only its own environment variables and `PATH`,
/// never the variables of the process that runs it (where API keys live), and it is killed
/// past its timeout, whatever the workflow's declaration asks for.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ProgramTool {
    argv: Vec<String>,
    environment: BTreeMap<String, String>,
    timeout: Duration,
}

impl ProgramTool {
    /// The program `argv[0]` with the arguments `argv[1..]`, as given (no templates);
    /// `environment` is all it sees besides `PATH`.
    pub fn new(
        argv: Vec<String>,
        environment: BTreeMap<String, String>,
        timeout: Duration,
    ) -> Result<ProgramTool, String> {
        match argv.first() {
            None => return Err("the command is empty: name a program".into()),
            Some(program) if program.is_empty() => {
                return Err("the command's program is an empty string".into());
            }
            Some(_) => {}
        }
        if timeout.is_zero() {
            return Err("the timeout must be more than 0 seconds".into());
        }
        Ok(ProgramTool {
            argv,
            environment,
            timeout,
        })
    }
}

impl ToolRunner for ProgramTool {
    fn call<'a>(
        &'a self,
        request: ToolCallRequest<'a>,
    ) -> BoxFuture<'a, Result<String, ToolError>> {
        Box::pin(async move {
            let tool_id = &request.tool.id;
            let call = run_program(
                tool_id,
                &self.argv,
                Some(&self.environment),
                &request.arguments,
            );
            tokio::time::timeout(self.timeout, call)
                .await
                .map_err(|_| {
                    ToolError::new(tool_id, format!("no result within {:?}", self.timeout))
                })?
        })
    }
}

/// Parses the arguments a model passed to a tool: a JSON object (an empty text counts as
/// no arguments).
pub fn parse_model_arguments(text: &str) -> Result<Map<String, Value>, String> {
    if text.trim().is_empty() {
        return Ok(Map::new());
    }
    match serde_json::from_str::<Value>(text) {
        Ok(Value::Object(map)) => Ok(map),
        Ok(other) => Err(format!(
            "the arguments must be a JSON object, not {}",
            contexture_core::format::json_type(&other)
        )),
        Err(error) => Err(format!("the arguments are not valid JSON: {error}")),
    }
}

/// True when `tool` is the built-in context manager.
pub fn is_context_manager(tool: &Tool) -> bool {
    tool.tool.as_deref() == Some(CONTEXT_MANAGER)
        || (tool.tool.is_none()
            && tool.command.is_none()
            && tool.response.is_none()
            && tool.id == CONTEXT_MANAGER)
}

/// The tool's schema in OpenAI's format, as sent to the model.
pub fn schema(tool: &Tool) -> Value {
    let manager = is_context_manager(tool);
    let mut function = Map::new();
    function.insert("name".into(), Value::String(tool.id.clone()));
    let description = tool.description.clone().or_else(|| {
        manager.then(|| {
            "Replaces the earlier conversation with a concise summary, to tighten the context \
             and focus on the current task. Put anything that must survive word for word (ids, \
             file names, decisions) in `notes`: notes are kept verbatim and never summarized. \
             Set `is_history_preserved` to false to keep only the notes."
                .to_owned()
        })
    });
    if let Some(description) = description {
        function.insert("description".into(), Value::String(description));
    }
    let default_parameters = if manager {
        serde_json::json!({"type": "object", "properties": {
            "notes": {"type": "string", "description": "Verbatim content to keep as it is (never summarized)."},
            "is_history_preserved": {"type": "boolean", "description": "False keeps only the notes, no summary. Default true."},
            "history": {"type": "array", "items": {"type": "string"}, "description": "More lines to summarize with the conversation."}
        }})
    } else {
        serde_json::json!({"type": "object", "properties": {}})
    };
    function.insert(
        "parameters".into(),
        tool.parameters.clone().unwrap_or(default_parameters),
    );
    serde_json::json!({"type": "function", "function": Value::Object(function)})
}
