//! `contexture output parse`: show how a step output is parsed and what it would store.

use std::path::PathBuf;

use anyhow::{Result, anyhow};
use clap::{Args, Subcommand};
use contexture_core::context::parse_output_bytes;
use serde_json::json;

use super::input;

/// Output parsing commands.
#[derive(Debug, Subcommand)]
pub enum OutputCommand {
    /// Parse a step output (JSON, Python literal, fenced JSON, JSON in prose, else text) and
    /// print `{"value": ..., "stored": {...}}`; notes on what did not parse go to stderr.
    Parse(ParseArgs),
}

/// Arguments of `contexture output parse`.
#[derive(Debug, Args)]
pub struct ParseArgs {
    /// The output file; standard input when absent or `-`.
    file: Option<PathBuf>,
}

/// Runs an `output` command.
pub fn run(command: OutputCommand) -> Result<()> {
    match command {
        OutputCommand::Parse(args) => parse(args),
    }
}

fn parse(args: ParseArgs) -> Result<()> {
    let bytes = input::read_bytes(args.file.as_deref())?;
    let parsed = parse_output_bytes(&bytes)
        .map_err(|error| anyhow!("{}: {error}", input::describe(args.file.as_deref())))?;
    for note in &parsed.notes {
        eprintln!("note: {note}");
    }
    let shown = json!({ "value": parsed.value, "stored": parsed.stored() });
    println!("{}", serde_json::to_string_pretty(&shown)?);
    Ok(())
}
