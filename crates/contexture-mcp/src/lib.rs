//! Contexture's MCP client: the tools of MCP servers, for the workflow engine's assistants.
//!
//! An [`McpSession`] is one connection to one server, reached as an [`Endpoint`]: a
//! program started as a child process speaking MCP on its standard input and output, or a
//! URL speaking streamable HTTP. Connecting performs the handshake (a protocol version
//! both sides know) and lists the server's tools, each checked to take an object of
//! arguments; [`McpSession::call`] calls one within a timeout; [`McpSession::close`] ends
//! the session and, for a program, waits for it to exit (killing it when it does not).
//! Dropping a session kills its program too: a child never outlives its session.
//!
//! Everything that goes wrong is an [`McpError`] naming the server and, for a program, the
//! start of what it wrote on its standard error. A tool that fails is not an error: its
//! result says so ([`ToolOutput::is_error`]), for the model to read and recover from.
//!
//! The protocol itself is the official SDK's (`rmcp`); this crate holds no JSON-RPC.

mod content;
mod error;
mod session;
mod stderr;
#[cfg(feature = "testing")]
pub mod testing;

pub use error::McpError;
pub use session::McpSession;

use std::collections::BTreeMap;

use serde_json::{Map, Value};

/// Where an MCP server is.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Endpoint {
    /// A program this process starts, speaking MCP on its standard input and output.
    Program(ProgramEndpoint),
    /// A server speaking streamable HTTP at a URL.
    Http(HttpEndpoint),
}

/// An MCP server started as a program.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ProgramEndpoint {
    /// The program (looked up in `PATH` when it holds no `/`).
    pub program: String,
    /// Its arguments.
    pub args: Vec<String>,
    /// Environment variables it gets.
    pub env: BTreeMap<String, String>,
    /// Whether it also gets this process's variables; without them it sees only `env` and
    /// `PATH`.
    pub inherit_environment: bool,
}

/// An MCP server reached over streamable HTTP.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HttpEndpoint {
    /// Its URL (`http://` or `https://`).
    pub url: String,
    /// Headers sent with every request (an `Authorization` one included).
    pub headers: BTreeMap<String, String>,
}

impl Endpoint {
    /// How it is reached, for messages: the program and its arguments, or the URL.
    pub fn describe(&self) -> String {
        match self {
            Endpoint::Program(program) => std::iter::once(program.program.as_str())
                .chain(program.args.iter().map(String::as_str))
                .collect::<Vec<_>>()
                .join(" "),
            Endpoint::Http(http) => http.url.clone(),
        }
    }
}

/// A tool an MCP server offers.
#[derive(Debug, Clone, PartialEq)]
pub struct McpTool {
    /// Its name on the server.
    pub name: String,
    /// What it does, as the server describes it.
    pub description: Option<String>,
    /// The JSON schema of its arguments (always of `"type": "object"`).
    pub input_schema: Map<String, Value>,
}

/// The result of one tool call.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ToolOutput {
    /// Its content as text: text parts as they are, other parts described in brackets
    /// (an image's type and size, a resource's URI), the structured content as JSON when
    /// there is no other content.
    pub text: String,
    /// The server reported the call as failed (a tool error, or a protocol error such as
    /// an unknown tool or arguments it refused).
    pub is_error: bool,
}
