//! Contexture as an MCP server: the thread and workflow tools of [`tools`], over streamable
//! HTTP at `/mcp` (behind the API's keys: each call acts for the key's tenant) and over
//! stdio for the operator at a terminal (`contexture mcp`: the whole store). A door like the
//! HTTP routes: it parses a tool call, calls the operation the route calls, and writes the
//! answer; a refusal is a tool error (`isError`) that names the argument at fault.

pub mod tools;

use std::net::SocketAddr;
use std::sync::Arc;

use axum::http::request::Parts;
use rmcp::model::{
    CallToolRequestParams, CallToolResponse, CallToolResult, ContentBlock, Implementation,
    InitializeResult, ListToolsResult, PaginatedRequestParams, ServerCapabilities, Tool,
};
use rmcp::service::RequestContext;
use rmcp::transport::streamable_http_server::session::never::NeverSessionManager;
use rmcp::transport::{StreamableHttpServerConfig, StreamableHttpService};
use rmcp::{ErrorData, RoleServer, ServerHandler, ServiceExt};

use crate::app::AppState;
use crate::auth::Caller;
use crate::tenancy::Actor;

/// What the server tells an MCP host about itself.
const INSTRUCTIONS: &str = "Contexture keeps conversation threads (append-only logs of messages) and runs workflows. \
thread_append records messages; thread_context shows what a request to a model would send, fitted to its window; \
thread_search finds earlier messages; thread_compact summarizes old history; thread_fork branches a thread; \
run_workflow starts a workflow and execution_result reads its outcome.";

/// The MCP server: one per connection (stdio) or per request (HTTP, stateless).
#[derive(Clone)]
pub struct ContextureMcp {
    state: AppState,
    /// Who the calls act for: fixed for stdio, the request's key for HTTP.
    actor: Option<Actor>,
}

impl ContextureMcp {
    /// The tools of `state` for the operator at a terminal: the whole store.
    pub fn for_operator(state: AppState) -> ContextureMcp {
        ContextureMcp {
            state,
            actor: Some(Actor::Operator),
        }
    }

    /// The tools of `state` for one tenant.
    pub fn for_tenant(state: AppState, tenant: crate::tenancy::Tenant) -> ContextureMcp {
        ContextureMcp {
            state,
            actor: Some(Actor::Tenant(tenant)),
        }
    }

    /// The actor of a call: the fixed one, or the tenant of the HTTP request's key (the
    /// API's authentication put it in the request).
    fn actor(&self, context: &RequestContext<RoleServer>) -> Result<Actor, ErrorData> {
        if let Some(actor) = &self.actor {
            return Ok(actor.clone());
        }
        context
            .extensions
            .get::<Parts>()
            .and_then(|parts| parts.extensions.get::<Caller>())
            .map(|caller| Actor::Tenant(caller.tenant.clone()))
            // Every route of /mcp is behind authentication: a call without a caller is a
            // mistake of the server's.
            .ok_or_else(|| {
                ErrorData::internal_error("the request has no authenticated caller", None)
            })
    }
}

impl ServerHandler for ContextureMcp {
    fn get_info(&self) -> InitializeResult {
        InitializeResult::new(ServerCapabilities::builder().enable_tools().build())
            .with_server_info(Implementation::new("contexture", env!("CARGO_PKG_VERSION")))
            .with_instructions(INSTRUCTIONS)
    }

    async fn list_tools(
        &self,
        _request: Option<PaginatedRequestParams>,
        _context: RequestContext<RoleServer>,
    ) -> Result<ListToolsResult, ErrorData> {
        let tools = tools::tool_specs(self.state.audience)
            .into_iter()
            .map(|spec| Tool::new(spec.name, spec.description, Arc::new(spec.input_schema)))
            .collect();
        Ok(ListToolsResult::with_all_items(tools))
    }

    async fn call_tool(
        &self,
        request: CallToolRequestParams,
        context: RequestContext<RoleServer>,
    ) -> Result<CallToolResponse, ErrorData> {
        let actor = self.actor(&context)?;
        let answer = tools::call_tool(&self.state, &actor, &request.name, request.arguments).await;
        let result = match answer {
            Ok(value) => {
                let text = serde_json::to_string_pretty(&value).unwrap_or_default();
                let mut result = CallToolResult::success(vec![ContentBlock::text(text)]);
                result.structured_content = Some(value);
                result
            }
            Err(error) => CallToolResult::error(vec![ContentBlock::text(error.0)]),
        };
        Ok(result.into())
    }
}

/// Serves the tools over this process's stdin and stdout until the host closes them, then
/// lets the runs `run_workflow` started finish (at most the configured grace period: a run
/// stopped then is left as it was logged, for `contexture run --resume`).
pub async fn serve_stdio(server: ContextureMcp) -> Result<(), std::io::Error> {
    let state = server.state.clone();
    let served = serve_until_closed(server).await;
    let grace = std::time::Duration::from_secs(state.config.shutdown_grace_secs);
    let waited = tokio::time::timeout(grace, async {
        while !state.active_runs.is_empty() {
            tokio::time::sleep(std::time::Duration::from_millis(50)).await;
        }
    })
    .await;
    if waited.is_err() {
        tracing::warn!("workflow runs still going after the grace period; stopping them");
    }
    served
}

/// Serves the tools over stdin and stdout until the host closes them.
async fn serve_until_closed(server: ContextureMcp) -> Result<(), std::io::Error> {
    let running = server
        .serve(rmcp::transport::stdio())
        .await
        .map_err(|error| std::io::Error::other(error.to_string()))?;
    running
        .waiting()
        .await
        .map_err(|error| std::io::Error::other(error.to_string()))?;
    Ok(())
}

/// The `Host` names `/mcp` answers by default: the loopback names, and the bind address
/// when it is a specific one (the check keeps DNS rebinding away from a local server).
pub fn default_allowed_hosts(bind: SocketAddr) -> Vec<String> {
    let mut hosts = vec![
        "localhost".to_owned(),
        "127.0.0.1".to_owned(),
        "::1".to_owned(),
    ];
    if !bind.ip().is_unspecified() && !bind.ip().is_loopback() {
        hosts.push(bind.ip().to_string());
    }
    hosts
}

/// The streamable HTTP service of `/mcp`: stateless (every request stands alone, so any of
/// several servers on one database answers any request), answered as plain JSON.
pub fn http_service(state: AppState) -> StreamableHttpService<ContextureMcp, NeverSessionManager> {
    let allowed_hosts = state.config.mcp_endpoint.allowed_hosts(state.config.bind);
    let mut config = StreamableHttpServerConfig::default();
    config.legacy_session_mode = false;
    config.json_response = true;
    config = match allowed_hosts {
        Some(hosts) => config.with_allowed_hosts(hosts),
        None => config.disable_allowed_hosts(),
    };
    let server = ContextureMcp { state, actor: None };
    StreamableHttpService::new(
        move || Ok(server.clone()),
        Arc::new(NeverSessionManager::default()),
        config,
    )
}
