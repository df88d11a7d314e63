//! `contexture expr eval`: evaluate a condition expression against a context, as a workflow
//! transition would.

use std::path::PathBuf;

use anyhow::Result;
use clap::{Args, Subcommand};
use contexture_core::context::{Condition, Scope, parse_output};

use super::input;
use super::template::read_context;

/// Expression commands.
#[derive(Debug, Subcommand)]
pub enum ExprCommand {
    /// Evaluate an expression (`user_role == 'admin'`) and print its value as JSON.
    Eval(EvalArgs),
}

/// Arguments of `contexture expr eval`.
#[derive(Debug, Args)]
pub struct EvalArgs {
    /// A JSON file holding the context store (an object).
    #[arg(long)]
    context: PathBuf,
    /// A file holding the last step's raw output, parsed like a step output and visible as
    /// `output`.
    #[arg(long)]
    output: Option<PathBuf>,
    /// The expression.
    expression: String,
}

/// Runs an `expr` command.
pub fn run(command: ExprCommand) -> Result<()> {
    match command {
        ExprCommand::Eval(args) => eval(args),
    }
}

fn eval(args: EvalArgs) -> Result<()> {
    let store = read_context(&args.context)?;
    let condition = Condition::compile(args.expression)?;
    let output = match &args.output {
        Some(path) => Some(parse_output(&input::read_text(Some(path))?).value),
        None => None,
    };
    let mut scope = Scope::new(&store);
    if let Some(output) = &output {
        scope = scope.with_output(output);
    }
    println!("{}", serde_json::to_string(&condition.value(scope)?)?);
    Ok(())
}
