//! The `contexture` command line: argument parsing and printing only. Every command is a
//! thin shell over a library call, so everything the CLI does is also a library feature.

mod commands;

use std::process::ExitCode;

use clap::{Parser, Subcommand};

#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

/// Contexture: the context engine for LLM agents and workflows.
#[derive(Debug, Parser)]
#[command(name = "contexture", version, about, long_about = None)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Count tokens of a text or of a chat request.
    #[command(subcommand)]
    Tokens(commands::tokens::TokensCommand),
    /// List and show models of the registry.
    #[command(subcommand)]
    Models(commands::models::ModelsCommand),
    /// Fit a chat history (OpenAI-format JSON messages) into a model's window.
    Fit(commands::fit::FitArgs),
    /// Append to, read, fork, list and prune threads in a store (--db sqlite:PATH | postgres://...).
    Thread(commands::thread::ThreadArgs),
    /// Parse step outputs as a workflow would (JSON, Python literals, fences, prose).
    #[command(subcommand)]
    Output(commands::output::OutputCommand),
    /// Render templates against a context store.
    #[command(subcommand)]
    Template(commands::template::TemplateCommand),
    /// Evaluate condition expressions against a context store.
    #[command(subcommand)]
    Expr(commands::expr::ExprCommand),
    /// Check workflow files: references, reachability, expressions, templates.
    Validate(commands::validate::ValidateArgs),
    /// Run a YAML workflow (or resume one) and print its final output.
    Run(commands::run::RunArgs),
    /// Show an execution: its steps, its sub-executions, usage, and each LLM call's token
    /// budget as a bar.
    Inspect(commands::inspect::InspectArgs),
    /// Cancel an execution and all its descendants (a run in another process stops too).
    Cancel(commands::cancel::CancelArgs),
    /// Serve the HTTP API and the OpenAI-compatible chat endpoint.
    Serve(commands::serve::ServeArgs),
    /// Make, list and revoke the server's API keys.
    Keys(commands::keys::KeysArgs),
    /// Serve Contexture's thread and workflow tools to an MCP host over stdio.
    Mcp(commands::mcp::McpArgs),
    /// Render templates for `contexture serve` under a memory limit (started by the server).
    #[command(hide = true)]
    TemplateWorker,
    // Later commands register here, one line each.
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    // Output piped into a command that stops reading (`contexture models list | head`) ends
    // the program quietly, as for any Unix tool, instead of a panic on the broken pipe. Not
    // for the commands that start programs (tools, hook programs): the signal would take
    // the whole process down when one of them exits without reading all its input; those
    // handle a closed standard output themselves.
    #[cfg(unix)]
    if !matches!(
        cli.command,
        Command::Run(_) | Command::Serve(_) | Command::Mcp(_)
    ) {
        // SAFETY: restoring the default disposition of SIGPIPE before any thread starts.
        unsafe {
            libc::signal(libc::SIGPIPE, libc::SIG_DFL);
        }
    }
    let result = match cli.command {
        Command::Tokens(command) => commands::tokens::run(command),
        Command::Models(command) => commands::models::run(command),
        Command::Fit(args) => commands::fit::run(args),
        Command::Thread(args) => commands::thread::run(args),
        Command::Output(command) => commands::output::run(command),
        Command::Template(command) => commands::template::run(command),
        Command::Expr(command) => commands::expr::run(command),
        Command::Validate(args) => commands::validate::run(args),
        Command::Run(args) => commands::run::run(args),
        Command::Inspect(args) => commands::inspect::run(args),
        Command::Cancel(args) => commands::cancel::run(args),
        Command::Serve(args) => commands::serve::run(args),
        Command::Keys(args) => commands::keys::run(args),
        Command::Mcp(args) => commands::mcp::run(args),
        Command::TemplateWorker => commands::template_worker::run(),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(error) => {
            eprintln!("error: {error:#}");
            ExitCode::FAILURE
        }
    }
}
