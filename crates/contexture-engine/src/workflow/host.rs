//! What a workflow may do on the host that runs it.
//!
//! A workflow can declare things that reach outside the engine: `command` tools start a
//! program, MCP servers with a `command` start one too, and so do hook programs (`hooks`).
//! Whoever wrote the workflow decides whether that is acceptable: the operator's own files may (when the operator
//! allows it), a workflow a client sent over the network never may. [`Programs`] carries that
//! decision into validation, so a refused workflow is refused before anything runs, with a
//! diagnostic at the tool or server that would have started a program.

use super::{Diagnostic, Workflow};

/// Who wrote a workflow.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum WorkflowOrigin {
    /// The operator: a file on this host, or the CLI at a terminal.
    #[default]
    Operator,
    /// A client: a workflow text sent in a request. It never starts a program.
    Client,
}

/// Whether the workflows of one run may start programs on this host.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub enum Programs {
    /// `command` tools and MCP servers' commands may run.
    #[default]
    Allowed,
    /// They may not; the text says why and what would allow them (it ends each diagnostic).
    Refused(String),
    /// The workflow came from a client: it starts no program and connects nowhere of its
    /// own choosing (an MCP server's `url`); it may only name the host's MCP servers.
    Client,
}

impl Programs {
    /// The reason a client's workflow is given when it declares a program.
    pub const CLIENT_REFUSAL: &'static str = "a workflow sent in a request never starts a program on the server (use a tool the operator registered, or ask the operator to add the workflow to the workflows directory)";

    /// The reason a client's workflow is given when it declares where an MCP server is.
    pub const CLIENT_CONNECTION_REFUSAL: &'static str = "a workflow sent in a request never picks where the server connects: name an MCP server the operator declared in the server's configuration ([mcp_servers.NAME]) and give it no `config`";

    /// The programs a run of `origin` may start when the host allows `host`.
    pub fn for_run(host: &Programs, origin: WorkflowOrigin) -> Programs {
        match origin {
            WorkflowOrigin::Client => Programs::Client,
            WorkflowOrigin::Operator => host.clone(),
        }
    }
}

/// Every place in `workflow` that would start a program on the host, as `(path, what)`:
/// `tools[2].command` for a program tool, `mcp_servers[0].config.command` for an MCP server
/// started as a program.
pub fn program_declarations(workflow: &Workflow) -> Vec<(String, String)> {
    let tools = workflow
        .tools
        .iter()
        .enumerate()
        .filter(|(_, tool)| tool.command.is_some())
        .map(|(n, tool)| {
            (
                format!("tools[{n}].command"),
                format!("tool `{}` runs a program (`command`)", tool.id),
            )
        });
    let servers = workflow
        .mcp_declarations()
        .filter(|(_, server)| server.config.command.is_some())
        .map(|(base, server)| {
            (
                format!("{base}.config.command"),
                format!(
                    "MCP server `{}` is started as a program (`config.command`)",
                    server.name
                ),
            )
        });
    let hooks = workflow.hooks.iter().enumerate().map(|(n, hook)| {
        (
            format!("hooks[{n}].command"),
            format!(
                "hook `{}` runs a program (`command`)",
                hook.command.join(" ")
            ),
        )
    });
    tools.chain(servers).chain(hooks).collect()
}

/// Every program `workflow` declares, as `(path, problem)`, when `programs` refuses them,
/// and for a client's workflow every MCP server it gives a URL; none when programs are
/// allowed.
pub fn program_refusals(workflow: &Workflow, programs: &Programs) -> Vec<(String, String)> {
    let reason = match programs {
        Programs::Allowed => return Vec::new(),
        Programs::Refused(reason) => reason.as_str(),
        Programs::Client => Programs::CLIENT_REFUSAL,
    };
    let mut refusals: Vec<(String, String)> = program_declarations(workflow)
        .into_iter()
        .map(|(path, what)| (path, format!("{what}, which is refused here: {reason}")))
        .collect();
    if *programs == Programs::Client {
        refusals.extend(
            workflow
                .mcp_declarations()
                .filter(|(_, server)| server.config.url.is_some())
                .map(|(base, server)| {
                    (
                        format!("{base}.config.url"),
                        format!(
                            "MCP server `{}` names a URL (`config.url`), which is refused here: {}",
                            server.name,
                            Programs::CLIENT_CONNECTION_REFUSAL
                        ),
                    )
                }),
        );
    }
    refusals
}

/// The diagnostics of `workflow` (read from `text`, named `file`) under `programs`: one per
/// program it declares when programs are refused, none otherwise.
pub(super) fn program_diagnostics(
    workflow: &Workflow,
    text: &str,
    file: &str,
    programs: &Programs,
) -> Vec<Diagnostic> {
    let problems = program_refusals(workflow, programs);
    if problems.is_empty() {
        return Vec::new();
    }
    super::load::located(text, file, problems)
}
