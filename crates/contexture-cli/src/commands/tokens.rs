//! `contexture tokens`: count the tokens of a text or of a chat request.

use std::path::PathBuf;

use anyhow::{Context, Result};
use clap::{Args, Subcommand};
use contexture_core::budget::{BudgetPolicy, RequestReport};
use contexture_core::format::openai;
use contexture_core::registry::ModelInfo;
use contexture_core::{Encoding, TokenCounter};
use serde_json::Value;

use super::input;
use super::models::RegistryArgs;

/// Token counting commands.
#[derive(Debug, Subcommand)]
pub enum TokensCommand {
    /// Count the tokens of a text, or (with --messages) of a chat request.
    Count(CountArgs),
}

/// Arguments of `contexture tokens count`.
#[derive(Debug, Args)]
pub struct CountArgs {
    /// The encoding to count with (cl100k_base or o200k_base). Default: o200k_base, or the
    /// model's encoding when --model is given.
    #[arg(long, conflicts_with = "model")]
    encoding: Option<String>,
    /// Count as this model does (its encoding, or its documented estimate for models whose
    /// tokenizer is not shipped).
    #[arg(long)]
    model: Option<String>,
    /// Read a JSON array of OpenAI-format chat messages and count the whole request by the
    /// chat recipe (per-message overhead, names, reply priming, tool schemas).
    #[arg(long)]
    messages: bool,
    /// With --messages: a JSON file with the request's tool schemas (OpenAI format).
    #[arg(long, requires = "messages")]
    tools: Option<PathBuf>,
    /// With --messages: print the per-message breakdown and the model's budget as JSON.
    #[arg(long, requires = "messages")]
    json: bool,
    /// Tokens to reserve for the reply in the printed budget (default: the model's output
    /// limit, at most a quarter of the window).
    #[arg(long, requires = "json")]
    reserve: Option<u32>,
    #[command(flatten)]
    registry: RegistryArgs,
    /// The input file; standard input when absent or `-`.
    file: Option<PathBuf>,
}

/// Runs a `tokens` command.
pub fn run(command: TokensCommand) -> Result<()> {
    match command {
        TokensCommand::Count(args) => count(args),
    }
}

fn count(args: CountArgs) -> Result<()> {
    let model = match &args.model {
        Some(name) => Some(args.registry.load()?.get(name)?),
        None => None,
    };
    let counter = match (&args.encoding, &model) {
        (Some(name), _) => TokenCounter::exact(Encoding::from_name(name)?),
        (None, Some(model)) => model.counter,
        (None, None) => TokenCounter::exact(Encoding::O200kBase),
    };
    if !args.messages {
        // A part at a time: a file of any size is counted in bounded memory.
        let mut text = counter.text_in_parts();
        input::read_text_in_parts(args.file.as_deref(), |part| {
            text.push(part);
            Ok(())
        })?;
        println!("{}", text.finish());
        return Ok(());
    }
    let value: Value = input::read_json(args.file.as_deref())?;
    let messages = openai::parse_messages(&value).with_context(|| {
        format!(
            "{}: not a chat message array",
            input::describe(args.file.as_deref())
        )
    })?;
    let tools: Vec<Value> = match &args.tools {
        Some(path) => input::read_json(Some(path))?,
        None => Vec::new(),
    };
    if !args.json {
        println!("{}", counter.count_request(&messages, &tools).total);
        return Ok(());
    }
    let model = match model {
        Some(model) => model,
        None => args.registry.load()?.default_model(),
    };
    let policy = BudgetPolicy {
        reserve_output: args.reserve,
        ..BudgetPolicy::default()
    };
    let report = RequestReport::count(&ModelInfo { counter, ..model }, &policy, &messages, &tools)?;
    println!("{}", serde_json::to_string_pretty(&report)?);
    Ok(())
}
