//! MCP server declarations: which servers a workflow's assistants may call tools of, and how
//! each is reached (a program speaking MCP on its standard input and output, or a URL
//! speaking streamable HTTP).
//!
//! ```yaml
//! mcp_servers:
//!   - name: files
//!     resolve_dynamic_values_in_arguments: true
//!     config: {command: python3, args: ['fs_server.py', '{{project_path}}'], env: {LOG: quiet}}
//!   - name: search
//!     config: {url: 'http://127.0.0.1:9000/mcp', headers: {Authorization: 'Bearer {{token}}'}}
//! assistants:
//!   - id: coder
//!     model: gpt-4o-mini
//!     mcp_servers: [files, search]
//! ```
//!
//! A declaration with neither `command` nor `url` names a server the host declared (the
//! server's operator, in its configuration): that is the only kind a workflow sent in a
//! request may use.

use std::collections::BTreeMap;
use std::fmt;
use std::time::Duration;

use serde::de::{self, MapAccess, Visitor};
use serde::{Deserialize, Deserializer, Serialize};
use serde_json::Value;

/// The time a tool call of an MCP server may take unless its declaration says otherwise.
pub const DEFAULT_MCP_CALL_TIMEOUT: Duration = Duration::from_secs(60);

/// The time an MCP server may take to start and list its tools unless its declaration says
/// otherwise.
pub const DEFAULT_MCP_START_TIMEOUT: Duration = Duration::from_secs(30);

/// The longest name an MCP server may have: its tools are offered to models as
/// `SERVER__TOOL`, and providers take function names of at most 64 characters.
pub const MAX_MCP_SERVER_NAME: usize = 24;

/// An MCP server declaration, as on the CodeMie reference page.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct McpServer {
    /// Its name, unique among the workflow's MCP servers; its tools are offered to models
    /// as `NAME__TOOL`.
    pub name: String,
    /// Render the templates in `config.args` against the context store when the server
    /// starts (`env` and `headers` values are always rendered).
    #[serde(default)]
    pub resolve_dynamic_values_in_arguments: bool,
    /// How to reach it; without `command` or `url`, the host's server of this name.
    #[serde(default)]
    pub config: McpServerConfig,
}

/// How an MCP server is reached: `command` (with `args` and `env`) starts it as a program
/// speaking MCP on its standard input and output, `url` (with `headers`) connects to it
/// over streamable HTTP. The server's configuration declares its servers in this same
/// shape.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct McpServerConfig {
    /// The program to start.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub command: Option<String>,
    /// Its arguments (templates when `resolve_dynamic_values_in_arguments` is set).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub args: Vec<Value>,
    /// Environment variables it gets, besides this process's (values are templates).
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub env: BTreeMap<String, String>,
    /// The streamable HTTP endpoint to connect to (`http://` or `https://`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub url: Option<String>,
    /// HTTP headers sent with every request to `url` (values are templates).
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub headers: BTreeMap<String, String>,
    /// Seconds one tool call may take (default 60); a call past it fails its step.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub timeout_secs: Option<f64>,
    /// Seconds the server may take to start, answer the handshake and list its tools
    /// (default 30).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub start_timeout_secs: Option<f64>,
}

impl McpServerConfig {
    /// True when it declares neither a program nor a URL: it names the host's server.
    pub fn is_reference(&self) -> bool {
        self.command.is_none() && self.url.is_none()
    }

    /// The time one tool call may take.
    pub fn call_timeout(&self) -> Duration {
        self.timeout_secs
            .map_or(DEFAULT_MCP_CALL_TIMEOUT, Duration::from_secs_f64)
    }

    /// The time the server may take to start and list its tools.
    pub fn start_timeout(&self) -> Duration {
        self.start_timeout_secs
            .map_or(DEFAULT_MCP_START_TIMEOUT, Duration::from_secs_f64)
    }

    /// What is wrong with it, as `(field, problem)`; the fields are relative to the
    /// configuration (`command`, `url`, `headers.Authorization`, ...).
    pub fn problems(&self) -> Vec<(String, String)> {
        let mut problems = Vec::new();
        let mut problem = |field: &str, text: String| problems.push((field.to_owned(), text));
        if self.command.is_some() && self.url.is_some() {
            problem(
                "url",
                "give `command` (a program) or `url` (streamable HTTP), not both".into(),
            );
        }
        if let Some(command) = &self.command
            && command.trim().is_empty()
        {
            problem("command", "the command is empty: name a program".into());
        }
        if self.command.is_none() {
            if !self.args.is_empty() {
                problem("args", "`args` are a program's: give `command` too".into());
            }
            if !self.env.is_empty() {
                problem("env", "`env` is a program's: give `command` too".into());
            }
        }
        if let Some(url) = &self.url
            && let Err(why) = check_url(url)
        {
            problem("url", why);
        }
        if self.url.is_none() && !self.headers.is_empty() {
            problem(
                "headers",
                "`headers` are sent to a `url`: give `url` too".into(),
            );
        }
        for name in self.headers.keys() {
            if !is_header_name(name) {
                problem(
                    &format!("headers.{name}"),
                    format!(
                        "`{name}` is not an HTTP header name (letters, digits and !#$%&'*+-.^_`|~ only)"
                    ),
                );
            }
        }
        for (field, seconds) in [
            ("timeout_secs", self.timeout_secs),
            ("start_timeout_secs", self.start_timeout_secs),
        ] {
            if let Some(seconds) = seconds
                && !(seconds.is_finite() && seconds > 0.0 && seconds <= 86_400.0)
            {
                problem(
                    field,
                    format!(
                        "{field} must be a number of seconds above 0 and at most 86400, not {seconds}"
                    ),
                );
            }
        }
        problems
    }
}

/// Why `url` cannot be connected to over streamable HTTP, if it cannot.
fn check_url(url: &str) -> Result<(), String> {
    let rest = url
        .strip_prefix("http://")
        .or_else(|| url.strip_prefix("https://"))
        .ok_or_else(|| format!("`{url}` is not an http:// or https:// URL"))?;
    let host = rest.split(['/', '?', '#']).next().unwrap_or_default();
    if host.is_empty() {
        return Err(format!("`{url}` names no host"));
    }
    if url.chars().any(|c| c.is_whitespace() || c.is_control()) {
        return Err(format!("`{url}` holds a space or a control character"));
    }
    Ok(())
}

/// RFC 9110's token characters, which a header name is made of.
fn is_header_name(name: &str) -> bool {
    !name.is_empty()
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"!#$%&'*+-.^_`|~".contains(&b))
}

impl McpServer {
    /// What is wrong with its name, if anything: its tools are offered to models as
    /// `NAME__TOOL`, so it takes letters, digits, `_` and `-` only, without `__`.
    pub fn name_problem(&self) -> Option<String> {
        let name = &self.name;
        if name.is_empty() {
            return Some("the name is empty".into());
        }
        if name.chars().count() > MAX_MCP_SERVER_NAME {
            return Some(format!(
                "`{name}` is longer than {MAX_MCP_SERVER_NAME} characters (its tools are named `{name}__TOOL`, and providers take names of at most 64)"
            ));
        }
        if !name
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '-')
        {
            return Some(format!(
                "`{name}` may hold letters, digits, `_` and `-` only (its tools are named `{name}__TOOL`)"
            ));
        }
        if name.contains("__") {
            return Some(format!(
                "`{name}` holds `__`, which separates a server's name from its tools' names"
            ));
        }
        None
    }
}

/// How an assistant names an MCP server: by name (one the workflow or the host declares),
/// or with a declaration of its own.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(untagged)]
pub enum McpServerUse {
    /// A server declared elsewhere, by name.
    Name(String),
    /// A server only this assistant uses.
    Inline(McpServer),
}

impl McpServerUse {
    /// The server's name.
    pub fn name(&self) -> &str {
        match self {
            McpServerUse::Name(name) => name,
            McpServerUse::Inline(server) => &server.name,
        }
    }
}

impl<'de> Deserialize<'de> for McpServerUse {
    // By hand rather than untagged: an untagged enum's error ("did not match any variant")
    // would hide what was wrong inside an inline declaration.
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct UseVisitor;
        impl<'de> Visitor<'de> for UseVisitor {
            type Value = McpServerUse;
            fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
                f.write_str("the name of an MCP server, or a declaration {name, config}")
            }
            fn visit_str<E: de::Error>(self, name: &str) -> Result<McpServerUse, E> {
                Ok(McpServerUse::Name(name.to_owned()))
            }
            fn visit_map<A: MapAccess<'de>>(self, map: A) -> Result<McpServerUse, A::Error> {
                McpServer::deserialize(de::value::MapAccessDeserializer::new(map))
                    .map(McpServerUse::Inline)
            }
        }
        deserializer.deserialize_any(UseVisitor)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn config(yaml: &str) -> McpServerConfig {
        yaml_serde::from_str(yaml).unwrap()
    }

    #[test]
    fn a_configuration_names_each_field_it_gets_wrong() {
        let cases = [
            ("{command: a, url: 'http://x/mcp'}", "url"),
            ("{command: ' '}", "command"),
            ("{args: [x]}", "args"),
            ("{env: {A: b}}", "env"),
            ("{url: 'ftp://x/mcp'}", "url"),
            ("{url: 'http:///mcp'}", "url"),
            ("{url: 'http://x/mcp', headers: {'a b': c}}", "headers.a b"),
            ("{headers: {A: b}}", "headers"),
            ("{command: a, timeout_secs: 0}", "timeout_secs"),
            ("{command: a, start_timeout_secs: -1}", "start_timeout_secs"),
        ];
        for (yaml, field) in cases {
            let problems = config(yaml).problems();
            assert!(
                problems.iter().any(|(f, _)| f == field),
                "{yaml}: {problems:?}"
            );
        }
        assert!(
            config("{command: a, args: [b], env: {X: y}}")
                .problems()
                .is_empty()
        );
        assert!(
            config("{url: 'https://h:9/mcp', headers: {Authorization: 'Bearer t'}}")
                .problems()
                .is_empty()
        );
        assert!(config("{}").is_reference());
    }

    #[test]
    fn a_name_that_cannot_prefix_a_tool_name_is_refused() {
        let server = |name: &str| McpServer {
            name: name.into(),
            resolve_dynamic_values_in_arguments: false,
            config: McpServerConfig::default(),
        };
        assert_eq!(server("files-2_b").name_problem(), None);
        for bad in ["", "a.b", "a b", "a__b", &"x".repeat(25)] {
            assert!(server(bad).name_problem().is_some(), "{bad:?}");
        }
    }

    #[test]
    fn an_assistant_names_a_server_or_declares_one() {
        let uses: Vec<McpServerUse> =
            yaml_serde::from_str("[files, {name: own, config: {url: 'http://h/mcp'}}]").unwrap();
        assert_eq!(uses[0], McpServerUse::Name("files".into()));
        assert_eq!(uses[1].name(), "own");
        let error = yaml_serde::from_str::<Vec<McpServerUse>>("[{name: x, confg: {}}]")
            .unwrap_err()
            .to_string();
        assert!(error.contains("unknown field `confg`"), "{error}");
    }
}
