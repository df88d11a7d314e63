//! MCP servers in runs: each server a run's assistants name starts once per run, when a
//! step first needs it, is shared by the run's steps (its iteration items and forked states
//! included), and is closed when the run ends, whatever the end (a program is killed if it
//! lingers, and a run dropped mid-way kills it too).
//!
//! Its tools are offered to a model as `SERVER__TOOL`, so that two servers' `search` cannot
//! collide and the server's own tool name stays visible; their schemas go with every
//! request (the budget counts them), and their results are tool results like any other
//! (cut, cleared and compacted inside the tool loop).
//!
//! Where a server is comes from the workflow's declaration (its `env`, `headers` and, when
//! asked, `args` rendered from the context store of the step that starts it) or, for a
//! declaration that gives neither `command` nor `url`, from the host's (used as the host
//! wrote it, and a program of the host's sees only its own variables and `PATH`).

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use contexture_core::context::args::resolve_arg_list;
use contexture_core::context::{ContextStore, RenderOptions, render};
use contexture_mcp::{Endpoint, HttpEndpoint, McpError, McpSession, McpTool, ProgramEndpoint};
use serde_json::{Map, Value, json};
use tokio::sync::Mutex;

use crate::executor::{McpProgress, StepError};
use crate::tools::Toolbox;
use crate::workflow::{McpServer, McpServerConfig, Workflow};

/// Separates a server's name from its tool's in the name a model calls.
pub const TOOL_NAME_SEPARATOR: &str = "__";

/// The longest function name providers take.
const MAX_TOOL_NAME: usize = 64;

/// The MCP servers of one run, started as its steps need them.
#[derive(Default)]
pub(crate) struct RunServers {
    sessions: Mutex<BTreeMap<String, Arc<McpSession>>>,
}

/// A tool of an MCP server, as an assistant offers it.
#[derive(Clone)]
pub(crate) struct OfferedTool {
    /// The name the model calls it by: `SERVER__TOOL`.
    pub name: String,
    /// Its name on the server.
    pub tool: String,
    /// Its schema in OpenAI's format, as sent to the model.
    pub schema: Value,
    /// The session that answers it.
    pub session: Arc<McpSession>,
    /// The time a call may take.
    pub timeout: Duration,
}

/// Where a run finds the declaration of the server a step names.
#[derive(Clone, Copy)]
enum Declared<'a> {
    /// The workflow's own (top-level or an assistant's).
    Workflow(&'a McpServer),
    /// The host's, for a declaration that names it.
    Host(&'a McpServerConfig),
}

impl Declared<'_> {
    fn config(&self) -> &McpServerConfig {
        match self {
            Declared::Workflow(server) => &server.config,
            Declared::Host(config) => config,
        }
    }
}

impl RunServers {
    /// The tools of the servers `names`, starting those not yet started (their templates
    /// rendered against `store`); `progress` hears of each start.
    pub(crate) async fn offer(
        &self,
        names: &[&str],
        workflow: &Workflow,
        host: &Toolbox,
        store: &ContextStore,
        options: &RenderOptions,
        progress: &(dyn Fn(McpProgress) + Sync),
    ) -> Result<Vec<OfferedTool>, StepError> {
        let mut offered: Vec<OfferedTool> = Vec::new();
        for name in names {
            let declared = declaration(workflow, host, name).ok_or_else(|| {
                StepError::UndeclaredMcpServer {
                    server: (*name).to_owned(),
                }
            })?;
            let session = self
                .session(name, declared, store, options, progress)
                .await?;
            let timeout = declared.config().call_timeout();
            for tool in session.tools() {
                let name = offered_name(session.server(), tool)?;
                if let Some(earlier) = offered.iter().find(|o| o.name == name) {
                    return Err(StepError::from(McpError::InvalidTool {
                        server: session.server().to_owned(),
                        problem: format!(
                            "tools `{}` and `{}` are both offered as `{name}`",
                            earlier.tool, tool.name
                        ),
                    }));
                }
                offered.push(OfferedTool {
                    schema: schema(&name, tool),
                    name,
                    tool: tool.name.clone(),
                    session: session.clone(),
                    timeout,
                });
            }
        }
        Ok(offered)
    }

    /// The running session of server `name`, started now if it is not yet.
    async fn session(
        &self,
        name: &str,
        declared: Declared<'_>,
        store: &ContextStore,
        options: &RenderOptions,
        progress: &(dyn Fn(McpProgress) + Sync),
    ) -> Result<Arc<McpSession>, StepError> {
        // Held while a server starts, so two items of an iteration start it once.
        let mut sessions = self.sessions.lock().await;
        if let Some(session) = sessions.get(name) {
            return Ok(session.clone());
        }
        let endpoint = endpoint(name, declared, store, options)?;
        progress(McpProgress::Starting {
            server: name.to_owned(),
            endpoint: endpoint.describe(),
        });
        let started = Instant::now();
        let session = Arc::new(
            McpSession::connect(name, &endpoint, declared.config().start_timeout()).await?,
        );
        progress(McpProgress::Ready {
            server: name.to_owned(),
            tools: session.tools().iter().map(|t| t.name.clone()).collect(),
            elapsed: started.elapsed(),
        });
        sessions.insert(name.to_owned(), session.clone());
        Ok(session)
    }

    /// Closes every server the run started.
    pub(crate) async fn close(&self) {
        let sessions = std::mem::take(&mut *self.sessions.lock().await);
        for (_, session) in sessions {
            // A step still holding the session (it cannot: the run has ended) would drop
            // it later, which kills its program all the same.
            if let Ok(session) = Arc::try_unwrap(session) {
                session.close().await;
            }
        }
    }
}

/// The declaration of server `name` for a run of `workflow`: the workflow's, unless it
/// gives neither `command` nor `url`, then the host's.
fn declaration<'a>(workflow: &'a Workflow, host: &'a Toolbox, name: &str) -> Option<Declared<'a>> {
    match workflow.mcp_server(name) {
        Some(server) if !server.config.is_reference() => Some(Declared::Workflow(server)),
        _ => host.mcp_server(name).map(Declared::Host),
    }
}

/// Where the server is: a workflow's declaration rendered against `store`, a host's as
/// written.
fn endpoint(
    name: &str,
    declared: Declared<'_>,
    store: &ContextStore,
    options: &RenderOptions,
) -> Result<Endpoint, StepError> {
    let template_error = |field: String| {
        move |error| StepError::Template {
            place: format!("MCP server `{name}`'s {field}"),
            error,
        }
    };
    let (config, rendered, args_rendered) = match declared {
        Declared::Workflow(server) => (
            &server.config,
            true,
            server.resolve_dynamic_values_in_arguments,
        ),
        Declared::Host(config) => (config, false, false),
    };
    let text = |field: String, value: &str| -> Result<String, StepError> {
        if rendered {
            render(value, store, options)
                .map(|r| r.text)
                .map_err(template_error(field))
        } else {
            Ok(value.to_owned())
        }
    };
    if let Some(url) = &config.url {
        let headers = config
            .headers
            .iter()
            .map(|(header, value)| Ok((header.clone(), text(format!("header `{header}`"), value)?)))
            .collect::<Result<_, StepError>>()?;
        return Ok(Endpoint::Http(HttpEndpoint {
            url: url.clone(),
            headers,
        }));
    }
    let program = config.command.clone().unwrap_or_default();
    let args = if args_rendered {
        resolve_arg_list(&config.args, store, options)
            .map_err(template_error("arguments".to_owned()))?
    } else {
        config.args.clone()
    };
    let env = config
        .env
        .iter()
        .map(|(variable, value)| Ok((variable.clone(), text(format!("env `{variable}`"), value)?)))
        .collect::<Result<_, StepError>>()?;
    Ok(Endpoint::Program(ProgramEndpoint {
        program,
        args: args.iter().map(argument_text).collect(),
        env,
        // The operator's workflow runs its programs as the CLI's `command` tools do; the
        // host's servers are confined like the host's registered program tools.
        inherit_environment: matches!(declared, Declared::Workflow(_)),
    }))
}

/// A program argument: a string as it is, another value as JSON.
fn argument_text(value: &Value) -> String {
    match value {
        Value::String(text) => text.clone(),
        other => other.to_string(),
    }
}

/// The name `tool` of `server` is offered under: `SERVER__TOOL`, any character a provider
/// refuses in a function name replaced by `_`.
fn offered_name(server: &str, tool: &McpTool) -> Result<String, StepError> {
    let safe: String = tool
        .name
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || c == '_' || c == '-' {
                c
            } else {
                '_'
            }
        })
        .collect();
    let name = format!("{server}{TOOL_NAME_SEPARATOR}{safe}");
    if name.len() > MAX_TOOL_NAME {
        return Err(StepError::from(McpError::InvalidTool {
            server: server.to_owned(),
            problem: format!(
                "tool `{}` would be offered as `{name}`, longer than the {MAX_TOOL_NAME} characters providers take (give the server a shorter name)",
                tool.name
            ),
        }));
    }
    Ok(name)
}

/// The tool's schema in OpenAI's format, under its offered name.
fn schema(name: &str, tool: &McpTool) -> Value {
    let mut function = Map::new();
    function.insert("name".into(), Value::String(name.to_owned()));
    if let Some(description) = &tool.description {
        function.insert("description".into(), Value::String(description.clone()));
    }
    function.insert(
        "parameters".into(),
        Value::Object(tool.input_schema.clone()),
    );
    json!({"type": "function", "function": Value::Object(function)})
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tool(name: &str) -> McpTool {
        McpTool {
            name: name.into(),
            description: Some("d".into()),
            input_schema: Map::from_iter([("type".into(), json!("object"))]),
        }
    }

    #[test]
    fn a_tool_is_offered_under_its_servers_name() {
        assert_eq!(offered_name("files", &tool("read")).unwrap(), "files__read");
        assert_eq!(
            offered_name("files", &tool("fs.read/all")).unwrap(),
            "files__fs_read_all"
        );
        let error = offered_name("files", &tool(&"x".repeat(60))).unwrap_err();
        assert!(
            error.to_string().contains("longer than the 64 characters"),
            "{error}"
        );
        assert_eq!(
            schema("files__read", &tool("read")),
            json!({"type": "function", "function": {"name": "files__read", "description": "d", "parameters": {"type": "object"}}})
        );
    }
}
