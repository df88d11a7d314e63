//! One session with one MCP server: connect (start or reach it, handshake, list its tools),
//! call its tools, close.

use std::collections::HashMap;
use std::process::Stdio;
use std::time::Duration;

use rmcp::model::{
    CallToolRequest, CallToolRequestParams, ClientCapabilities, ClientConfig, Implementation,
    ProtocolVersion, ServerResult,
};
use rmcp::service::{PeerRequestOptions, RunningService};
use rmcp::transport::StreamableHttpClientTransport;
use rmcp::transport::streamable_http_client::StreamableHttpClientTransportConfig;
use rmcp::{ClientHandler, RoleClient, ServiceError, ServiceExt};
use serde_json::{Map, Value};
use tokio::process::Child;
use tokio::sync::Mutex;

use crate::content::result_text;
use crate::stderr::StderrStart;
use crate::{Endpoint, HttpEndpoint, McpError, McpTool, ProgramEndpoint, ToolOutput};

/// How long a session's close waits for the server to end on its own (its input closed)
/// before its program is killed.
const CLOSE_GRACE: Duration = Duration::from_secs(2);

/// How long a failed handshake waits for the program's exit and the rest of its error
/// output, so the error can say how it ended.
const EXIT_GRACE: Duration = Duration::from_millis(300);

/// This client, as it introduces itself in the handshake.
#[derive(Debug, Clone)]
struct ContextureClient {
    config: ClientConfig,
}

impl ContextureClient {
    fn new() -> ContextureClient {
        ContextureClient {
            // The newest version with the `initialize` handshake, which every server of
            // the 2024-2025 versions answers; the SDK's default offers one without it.
            config: ClientConfig::new(
                ClientCapabilities::default(),
                Implementation::new("contexture", env!("CARGO_PKG_VERSION")),
            )
            .with_protocol_version(ProtocolVersion::LATEST_WITH_INITIALIZE),
        }
    }
}

impl ClientHandler for ContextureClient {
    fn get_info(&self) -> ClientConfig {
        self.config.clone()
    }
}

/// A session with one MCP server; see the crate's documentation.
pub struct McpSession {
    server: String,
    endpoint: String,
    client: RunningService<RoleClient, ContextureClient>,
    tools: Vec<McpTool>,
    protocol_version: String,
    /// The server's program, when this session started one.
    program: Option<Program>,
}

/// A server's running program.
struct Program {
    child: Mutex<Child>,
    stderr: StderrStart,
}

impl std::fmt::Debug for McpSession {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("McpSession")
            .field("server", &self.server)
            .field("endpoint", &self.endpoint)
            .field("protocol_version", &self.protocol_version)
            .field("tools", &self.tools.len())
            .finish()
    }
}

impl McpSession {
    /// Reaches the server `server` at `endpoint` (starting its program), performs the
    /// handshake and lists its tools, all within `start_timeout`.
    pub async fn connect(
        server: &str,
        endpoint: &Endpoint,
        start_timeout: Duration,
    ) -> Result<McpSession, McpError> {
        match endpoint {
            Endpoint::Program(program) => connect_program(server, program, start_timeout).await,
            Endpoint::Http(http) => connect_http(server, http, start_timeout).await,
        }
    }

    /// The server's name.
    pub fn server(&self) -> &str {
        &self.server
    }

    /// Its tools, as listed when the session started.
    pub fn tools(&self) -> &[McpTool] {
        &self.tools
    }

    /// The process id of the server's program, when this session started one.
    pub fn process_id(&self) -> Option<u32> {
        let program = self.program.as_ref()?;
        program.child.try_lock().ok()?.id()
    }

    /// The protocol version the handshake agreed on.
    pub fn protocol_version(&self) -> &str {
        &self.protocol_version
    }

    /// Calls `tool` with `arguments`, waiting at most `timeout` (past it the call is
    /// cancelled on the server). A tool error or a protocol error the server answers is a
    /// result with `is_error`; a timeout or an ended connection is an error.
    pub async fn call(
        &self,
        tool: &str,
        arguments: Map<String, Value>,
        timeout: Duration,
    ) -> Result<ToolOutput, McpError> {
        let request = CallToolRequest::new(
            CallToolRequestParams::new(tool.to_owned()).with_arguments(arguments),
        );
        let sent = self
            .client
            .peer()
            .send_request_with_option(request.into(), PeerRequestOptions::with_timeout(timeout))
            .await;
        let answer = match sent {
            Ok(handle) => handle.await_response().await,
            Err(error) => Err(error),
        };
        match answer {
            Ok(ServerResult::CallToolResult(result)) => Ok(ToolOutput {
                text: result_text(&result),
                is_error: result.is_error.unwrap_or(false),
            }),
            Ok(other) => Ok(ToolOutput {
                text: format!(
                    "MCP server `{}` answered the call with something other than a tool result: {other:?}",
                    self.server
                ),
                is_error: true,
            }),
            Err(ServiceError::McpError(error)) => Ok(ToolOutput {
                text: format!(
                    "MCP server `{}` refused the call (error {}): {}",
                    self.server, error.code.0, error.message
                ),
                is_error: true,
            }),
            Err(ServiceError::Timeout { timeout }) => Err(McpError::CallTimeout {
                server: self.server.clone(),
                tool: tool.to_owned(),
                timeout,
                stderr: self.stderr(),
            }),
            Err(other) => {
                let exit = self.exit_status().await;
                Err(McpError::Closed {
                    server: self.server.clone(),
                    tool: tool.to_owned(),
                    reason: other.to_string(),
                    exit,
                    stderr: self.stderr(),
                })
            }
        }
    }

    /// Ends the session: the connection closed, then the program (if any) given a moment
    /// to exit before it is killed.
    pub async fn close(self) {
        let McpSession {
            mut client,
            program,
            ..
        } = self;
        // Closing the connection closes the program's input, which ends a well-behaved
        // server; one that lingers is killed below.
        let _ = client.close_with_timeout(CLOSE_GRACE).await;
        if let Some(program) = program {
            let mut child = program.child.into_inner();
            if tokio::time::timeout(CLOSE_GRACE, child.wait())
                .await
                .is_err()
            {
                let _ = child.kill().await;
            }
        }
    }

    fn stderr(&self) -> Option<String> {
        self.program
            .as_ref()
            .and_then(|program| program.stderr.text())
    }

    /// How the program ended, if it has (waiting a moment for it).
    async fn exit_status(&self) -> Option<String> {
        let program = self.program.as_ref()?;
        let mut child = program.child.lock().await;
        exited(&mut child).await
    }
}

/// How `child` ended, waiting a moment for it; `None` while it runs.
async fn exited(child: &mut Child) -> Option<String> {
    match tokio::time::timeout(EXIT_GRACE, child.wait()).await {
        Ok(Ok(status)) => Some(match status.code() {
            Some(code) => format!("exited with code {code}"),
            None => format!("ended: {status}"),
        }),
        _ => None,
    }
}

async fn connect_program(
    server: &str,
    program: &ProgramEndpoint,
    start_timeout: Duration,
) -> Result<McpSession, McpError> {
    let mut command = tokio::process::Command::new(&program.program);
    command
        .args(&program.args)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .kill_on_drop(true);
    if !program.inherit_environment {
        command.env_clear();
        if let Some(path) = std::env::var_os("PATH") {
            command.env("PATH", path);
        }
    }
    command.envs(&program.env);
    let mut child = command.spawn().map_err(|error| McpError::Spawn {
        server: server.to_owned(),
        program: program.program.clone(),
        reason: match error.kind() {
            std::io::ErrorKind::NotFound => "no such program (is it installed and on PATH?)".into(),
            _ => error.to_string(),
        },
    })?;
    let (Some(stdout), Some(stdin), Some(stderr)) =
        (child.stdout.take(), child.stdin.take(), child.stderr.take())
    else {
        unreachable!("all three pipes were asked for");
    };
    let stderr = StderrStart::read(stderr);
    let endpoint = Endpoint::Program(program.clone()).describe();
    let started = tokio::time::timeout(start_timeout, async {
        let client = ContextureClient::new()
            .serve((stdout, stdin))
            .await
            .map_err(|error| error.to_string())?;
        Ok::<_, String>(client)
    })
    .await;
    let client = match started {
        Ok(Ok(client)) => client,
        Ok(Err(reason)) => {
            let exit = exited(&mut child).await;
            return Err(McpError::Handshake {
                server: server.to_owned(),
                endpoint,
                reason,
                exit,
                stderr: stderr.text(),
            });
        }
        Err(_) => {
            return Err(McpError::StartTimeout {
                server: server.to_owned(),
                endpoint,
                timeout: start_timeout,
                stderr: stderr.text(),
            });
        }
    };
    let program = Program {
        child: Mutex::new(child),
        stderr,
    };
    finish_connect(server, endpoint, client, Some(program), start_timeout).await
}

async fn connect_http(
    server: &str,
    http: &HttpEndpoint,
    start_timeout: Duration,
) -> Result<McpSession, McpError> {
    let refused = |reason: String| McpError::Handshake {
        server: server.to_owned(),
        endpoint: http.url.clone(),
        reason,
        exit: None,
        stderr: None,
    };
    let mut headers = HashMap::new();
    for (name, value) in &http.headers {
        let header = http::HeaderName::from_bytes(name.as_bytes())
            .map_err(|_| refused(format!("`{name}` is not an HTTP header name")))?;
        let value = http::HeaderValue::from_str(value).map_err(|_| {
            refused(format!(
                "the value of header `{name}` holds a character a header cannot carry"
            ))
        })?;
        headers.insert(header, value);
    }
    let config =
        StreamableHttpClientTransportConfig::with_uri(http.url.as_str()).custom_headers(headers);
    let transport = StreamableHttpClientTransport::from_config(config);
    let client = match tokio::time::timeout(start_timeout, ContextureClient::new().serve(transport))
        .await
    {
        Ok(Ok(client)) => client,
        Ok(Err(error)) => {
            let reason = match error.auth_challenge() {
                Some(challenge) => format!(
                    "it asks for authorization ({challenge}): give `headers` such as Authorization"
                ),
                None if error.is_authorization_required() => {
                    "it asks for authorization: give `headers` such as Authorization".to_owned()
                }
                None => error.to_string(),
            };
            return Err(refused(reason));
        }
        Err(_) => {
            return Err(McpError::StartTimeout {
                server: server.to_owned(),
                endpoint: http.url.clone(),
                timeout: start_timeout,
                stderr: None,
            });
        }
    };
    finish_connect(server, http.url.clone(), client, None, start_timeout).await
}

/// The rest of a connection once the handshake is done: the version checked and the tools
/// listed and checked.
async fn finish_connect(
    server: &str,
    endpoint: String,
    client: RunningService<RoleClient, ContextureClient>,
    program: Option<Program>,
    start_timeout: Duration,
) -> Result<McpSession, McpError> {
    let stderr = || program.as_ref().and_then(|p| p.stderr.text());
    let version = client
        .peer_info()
        .map(|info| info.protocol_version.clone())
        .unwrap_or(ProtocolVersion::LATEST_WITH_INITIALIZE);
    if !ProtocolVersion::KNOWN_VERSIONS.contains(&version) {
        return Err(McpError::ProtocolVersion {
            server: server.to_owned(),
            version: version.to_string(),
            supported: ProtocolVersion::KNOWN_VERSIONS
                .iter()
                .map(ToString::to_string)
                .collect::<Vec<_>>()
                .join(", "),
        });
    }
    let listed = match tokio::time::timeout(start_timeout, client.list_all_tools()).await {
        Ok(Ok(tools)) => tools,
        Ok(Err(error)) => {
            return Err(McpError::ListTools {
                server: server.to_owned(),
                reason: error.to_string(),
                stderr: stderr(),
            });
        }
        Err(_) => {
            return Err(McpError::StartTimeout {
                server: server.to_owned(),
                endpoint,
                timeout: start_timeout,
                stderr: stderr(),
            });
        }
    };
    let mut tools = Vec::with_capacity(listed.len());
    for tool in listed {
        let input_schema = (*tool.input_schema).clone();
        if input_schema.get("type").and_then(Value::as_str) != Some("object") {
            return Err(McpError::InvalidTool {
                server: server.to_owned(),
                problem: format!(
                    "tool `{}` takes {} as its input schema, not a JSON schema of `\"type\": \"object\"`",
                    tool.name,
                    Value::Object(input_schema)
                ),
            });
        }
        tools.push(McpTool {
            name: tool.name.to_string(),
            description: tool.description.as_deref().map(str::to_owned),
            input_schema,
        });
    }
    Ok(McpSession {
        server: server.to_owned(),
        endpoint,
        client,
        tools,
        protocol_version: version.to_string(),
        program,
    })
}
