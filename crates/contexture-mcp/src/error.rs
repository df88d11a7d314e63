//! What goes wrong reaching an MCP server.

use std::time::Duration;

/// Why a session with an MCP server could not start or go on. Every variant names the
/// server; `stderr` is the start of what a program wrote on its standard error (none for a
/// URL, or when it wrote nothing).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum McpError {
    /// Its program could not be started (not found, not executable).
    #[error("MCP server `{server}`: cannot start `{program}`: {reason}")]
    Spawn {
        /// The server's name.
        server: String,
        /// The program.
        program: String,
        /// Why, as the system said.
        reason: String,
    },
    /// It did not finish the handshake and list its tools in time.
    #[error("MCP server `{server}` ({endpoint}) did not start within {} s: it did not answer the handshake and list its tools{}", timeout.as_secs_f64(), stderr_note(.stderr))]
    StartTimeout {
        /// The server's name.
        server: String,
        /// How it is reached.
        endpoint: String,
        /// The time it had.
        timeout: Duration,
        /// The start of its standard error.
        stderr: Option<String>,
    },
    /// The handshake failed: the server exited or closed the connection, answered
    /// something else, or refused.
    #[error("MCP server `{server}` ({endpoint}) failed its handshake: {reason}{}{}", exit_note(.exit), stderr_note(.stderr))]
    Handshake {
        /// The server's name.
        server: String,
        /// How it is reached.
        endpoint: String,
        /// What went wrong.
        reason: String,
        /// How its program ended, when it did.
        exit: Option<String>,
        /// The start of its standard error.
        stderr: Option<String>,
    },
    /// It speaks a protocol version this client does not.
    #[error(
        "MCP server `{server}` speaks MCP version `{version}`, which Contexture does not (it speaks {supported})"
    )]
    ProtocolVersion {
        /// The server's name.
        server: String,
        /// The version it answered.
        version: String,
        /// The versions this client speaks.
        supported: String,
    },
    /// Its list of tools could not be read, or a tool in it cannot be offered to a model.
    #[error("MCP server `{server}` lists a tool that cannot be used: {problem}")]
    InvalidTool {
        /// The server's name.
        server: String,
        /// What is wrong, naming the tool.
        problem: String,
    },
    /// Listing its tools failed.
    #[error("MCP server `{server}` did not list its tools: {reason}{}", stderr_note(.stderr))]
    ListTools {
        /// The server's name.
        server: String,
        /// What went wrong.
        reason: String,
        /// The start of its standard error.
        stderr: Option<String>,
    },
    /// A tool call got no answer in time.
    #[error("MCP server `{server}`: tool `{tool}` gave no result within {} s{}", timeout.as_secs_f64(), stderr_note(.stderr))]
    CallTimeout {
        /// The server's name.
        server: String,
        /// The tool.
        tool: String,
        /// The time it had.
        timeout: Duration,
        /// The start of its standard error.
        stderr: Option<String>,
    },
    /// The connection ended during a call (the program exited or crashed, the HTTP server
    /// went away).
    #[error("MCP server `{server}` stopped while tool `{tool}` ran: {reason}{}{}", exit_note(.exit), stderr_note(.stderr))]
    Closed {
        /// The server's name.
        server: String,
        /// The tool.
        tool: String,
        /// What the connection reported.
        reason: String,
        /// How its program ended, when it did.
        exit: Option<String>,
        /// The start of its standard error.
        stderr: Option<String>,
    },
}

impl McpError {
    /// The server the error is about.
    pub fn server(&self) -> &str {
        match self {
            McpError::Spawn { server, .. }
            | McpError::StartTimeout { server, .. }
            | McpError::Handshake { server, .. }
            | McpError::ProtocolVersion { server, .. }
            | McpError::InvalidTool { server, .. }
            | McpError::ListTools { server, .. }
            | McpError::CallTimeout { server, .. }
            | McpError::Closed { server, .. } => server,
        }
    }
}

fn stderr_note(stderr: &Option<String>) -> String {
    match stderr {
        Some(text) => format!("; its standard error began:\n{text}"),
        None => String::new(),
    }
}

fn exit_note(exit: &Option<String>) -> String {
    match exit {
        Some(status) => format!(" (its program {status})"),
        None => String::new(),
    }
}
