//! `contexture fit`: fit a chat history (a JSON array of OpenAI-format messages) into a
//! model's window, optionally cutting oversized tool results and clearing old ones first,
//! and print the fitted array. Its settings are a fit policy, the one type an assistant's
//! `context:` and a thread's policy are: `--policy FILE` gives one whole (JSON or YAML), and
//! the flags set its fields over it (`--truncate-tool-results` is
//! `truncate_tool_results.max_tokens`, `--clear-*` are `clear_tool_results`).
//!
//! The budget bounds the whole request as `contexture tokens count --messages` counts it
//! (messages, reply priming, and tool schemas given with `--tools`). Without `--max-tokens`
//! it is the model's context window minus the reply reserve; the reserve defaults to the
//! model's `max_output_tokens`, capped at a quarter of the window (the same rule as the
//! budget breakdown of `contexture tokens count --json`).
//!
//! Messages are counted lazily from the kept end: a message the fit drops is not tokenized
//! (except the unit at the edge of the cut, which must be counted to know it does not fit),
//! so the report's `tokens_before` is `null` when the input was not counted in full;
//! `tokens_before_at_least` is then a lower bound.

use std::path::PathBuf;

use anyhow::{Context, Result, bail};
use clap::{Args, ValueEnum};
use contexture_core::fit::{
    ClearOptions, ClearPolicy, ClearTrigger, ClearedResult, FitPolicy, RepairChange, Rules,
    Strategy, TrimOptions, TruncatePolicy, TruncatedResult, clear_tool_results, trim,
    truncate_tool_results,
};
use contexture_core::format::openai;
use contexture_core::{Message, Role};
use serde::Serialize;
use serde_json::Value;

use super::input;
use super::models::RegistryArgs;

/// Arguments of `contexture fit`.
#[derive(Debug, Args)]
pub struct FitArgs {
    /// The model whose window and tokenizer to fit for.
    #[arg(long)]
    model: String,
    /// The most tokens the whole request may take (default: the model's window minus the
    /// reserve).
    #[arg(long)]
    max_tokens: Option<u32>,
    /// Tokens kept free for the reply when --max-tokens is not given (default: the policy's,
    /// else the model's max output, at most a quarter of the window).
    #[arg(long, conflicts_with = "max_tokens")]
    reserve: Option<u32>,
    /// A fit policy (JSON or YAML, the shape of an assistant's `context:`): window, reserve,
    /// budget_ratio, strategy, truncate_tool_results, clear_tool_results, hysteresis. The
    /// other flags set its fields over it.
    #[arg(long, value_name = "FILE")]
    policy: Option<PathBuf>,
    /// Hysteresis: when over the budget, cut down to this many tokens (default: the
    /// policy's `hysteresis.low` share of the budget, when it has one).
    #[arg(long)]
    low_water: Option<u32>,
    /// Which part of the history to keep: last, first, head-tail (the opening turn and the
    /// newest) or head-tail:N (N units at the start); default: the policy's, else last.
    #[arg(long)]
    strategy: Option<Strategy>,
    /// Roles the kept history may start with (after the system prompt); repeatable.
    #[arg(long, value_enum)]
    start_on: Vec<RoleArg>,
    /// Roles the kept history may end with; repeatable.
    #[arg(long, value_enum)]
    end_on: Vec<RoleArg>,
    /// Let the system prompt be dropped like any other message.
    #[arg(long)]
    drop_system: bool,
    /// Use leftover budget for part of one more message, cut at line breaks.
    #[arg(long)]
    allow_partial: bool,
    /// Pin the message at this index (always kept); repeatable.
    #[arg(long = "pin", value_name = "INDEX")]
    pins: Vec<usize>,
    /// Whose message rules the output must follow: openai, anthropic or gemini (default: the
    /// model's, by who serves it).
    #[arg(long, visible_alias = "provider")]
    rules: Option<Rules>,
    /// A JSON file with the request's tool schemas (OpenAI format), counted in the budget.
    #[arg(long, value_name = "FILE")]
    tools: Option<PathBuf>,
    /// Before anything else, cut every tool result over this many tokens to its start and
    /// end (`truncate_tool_results.max_tokens`).
    #[arg(long, value_name = "TOKENS")]
    truncate_tool_results: Option<u32>,
    /// Before trimming, clear the results of all but the N most recent tool uses.
    #[arg(long, value_name = "N")]
    clear_keep: Option<usize>,
    /// With --clear-keep: clear only once the request passes this many tokens, oldest first,
    /// until it is back under (`clear_tool_results.trigger_tokens`).
    #[arg(long, value_name = "TOKENS", requires = "clear_keep")]
    clear_trigger_tokens: Option<u64>,
    /// With --clear-keep: clear at least this many tokens each time (`clear_at_least`).
    #[arg(long, value_name = "TOKENS", requires = "clear_keep")]
    clear_at_least: Option<u64>,
    /// With --clear-keep: never clear results of this tool; repeatable.
    #[arg(long, value_name = "TOOL", requires = "clear_keep")]
    clear_exclude: Vec<String>,
    /// With --clear-keep: also replace the cleared calls' arguments with `{}`.
    #[arg(long, requires = "clear_keep")]
    clear_arguments: bool,
    /// Write a JSON report (dropped indices, cleared results, tokens before and after) to
    /// standard error.
    #[arg(long)]
    report: bool,
    /// The messages file (a JSON array); standard input when absent or `-`.
    file: Option<PathBuf>,
    #[command(flatten)]
    registry: RegistryArgs,
}

#[derive(Debug, Clone, Copy, ValueEnum)]
enum RoleArg {
    System,
    User,
    Assistant,
    Tool,
}

impl From<RoleArg> for Role {
    fn from(role: RoleArg) -> Role {
        match role {
            RoleArg::System => Role::System,
            RoleArg::User => Role::User,
            RoleArg::Assistant => Role::Assistant,
            RoleArg::Tool => Role::Tool,
        }
    }
}

/// The JSON report written to standard error with `--report`.
#[derive(Debug, Serialize)]
struct Report<'a> {
    model: &'a str,
    rules: Rules,
    max_tokens: u32,
    low_water: Option<u32>,
    messages_in: usize,
    messages_out: usize,
    over_budget: bool,
    /// Dropped original indices as half-open ranges.
    dropped: Vec<Range>,
    dropped_count: usize,
    partial: Option<usize>,
    marker: Option<usize>,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    truncated: Vec<TruncatedResult>,
    cleared: Vec<ClearedResult>,
    tokens_cleared: u64,
    tokens_before: Option<u64>,
    tokens_before_at_least: u64,
    tokens_after: u64,
    repairs: Vec<RepairChange>,
}

#[derive(Debug, Serialize)]
struct Range {
    start: usize,
    end: usize,
}

/// Runs `contexture fit`.
pub fn run(args: FitArgs) -> Result<()> {
    let model = args.registry.load()?.get(&args.model)?;
    let counter = model.counter;
    let rules = args.rules.unwrap_or_else(|| model.rules());
    let source = input::describe(args.file.as_deref());
    let value: Value = input::read_json(args.file.as_deref())?;
    let mut messages: Vec<Message> = openai::parse_messages(&value)
        .with_context(|| format!("{source}: not a chat message array"))?;
    for &index in &args.pins {
        match messages.get_mut(index) {
            Some(message) => message.metadata.pinned = true,
            None => bail!(
                "--pin {index}: {source} has only {} messages",
                messages.len()
            ),
        }
    }
    let tools: Vec<Value> = match &args.tools {
        Some(path) => input::read_json(Some(path))?,
        None => Vec::new(),
    };
    let tools_tokens = counter.count_request(&[], &tools).tools;
    let policy = policy_of(&args)?;
    let model = policy.model(model);
    let limit = policy.budget().limits(&model)?.limit;
    let max_tokens = args.max_tokens.unwrap_or(limit);
    let low_water = args.low_water.or_else(|| {
        policy
            .hysteresis
            .map(|hysteresis| (f64::from(max_tokens) * hysteresis.low).floor() as u32)
    });

    let messages_in = messages.len();
    let mut truncated = Vec::new();
    if let Some(truncate) = &policy.truncate_tool_results {
        let cut = truncate_tool_results(&messages, truncate, &counter);
        messages = cut.messages;
        truncated = cut.truncated;
    }
    // A number of recent tool uses to keep, with no trigger, clears every older result; a
    // policy's clearing starts past its trigger.
    let clear = match (&policy.clear_tool_results, args.clear_keep) {
        (Some(clear), _) => Some(clear.options(tools_tokens)),
        (None, Some(keep)) => Some(ClearOptions {
            trigger: ClearTrigger::ToolUses(keep),
            keep_tool_uses: keep,
            clear_at_least: args.clear_at_least,
            exclude_tools: args.clear_exclude.clone(),
            clear_arguments: args.clear_arguments,
            tools_tokens,
        }),
        (None, None) => None,
    };
    let (cleared, tokens_cleared) = match clear {
        Some(options) => {
            let result = clear_tool_results(&messages, &options, &counter);
            messages = result.messages;
            (result.cleared, result.tokens_cleared)
        }
        None => (Vec::new(), 0),
    };

    let options = TrimOptions {
        max_tokens,
        low_water,
        tools_tokens,
        strategy: policy.strategy,
        keep_system: !args.drop_system,
        start_on: args.start_on.iter().copied().map(Role::from).collect(),
        end_on: args.end_on.iter().copied().map(Role::from).collect(),
        allow_partial: args.allow_partial,
        rules,
    };
    let trimmed = trim(&messages, &options, &counter).with_context(|| {
        format!(
            "cannot fit {source} into {max_tokens} tokens for {}",
            model.id
        )
    })?;

    println!(
        "{}",
        serde_json::to_string_pretty(&openai::to_values(&trimmed.messages))?
    );
    if args.report {
        let report = Report {
            model: &model.id,
            rules,
            max_tokens,
            low_water,
            messages_in,
            messages_out: trimmed.messages.len(),
            over_budget: trimmed.over_budget,
            dropped_count: trimmed.dropped_count(),
            dropped: trimmed
                .dropped
                .iter()
                .map(|range| Range {
                    start: range.start,
                    end: range.end,
                })
                .collect(),
            partial: trimmed.partial,
            marker: trimmed.marker,
            truncated,
            cleared,
            tokens_cleared,
            tokens_before: trimmed.tokens_before,
            tokens_before_at_least: trimmed.tokens_before_at_least,
            tokens_after: trimmed.tokens_after,
            repairs: trimmed.repairs,
        };
        eprintln!("{}", serde_json::to_string_pretty(&report)?);
    }
    Ok(())
}

/// The fit policy of the command: `--policy`'s (default: none), with the flags' fields over
/// it, checked as every fit policy is (a problem names its flag, or its field in the file).
fn policy_of(args: &FitArgs) -> Result<FitPolicy> {
    let mut policy = match &args.policy {
        Some(path) => input::read_yaml::<FitPolicy>(Some(path))?,
        None => FitPolicy::default(),
    };
    if let Some(strategy) = args.strategy {
        policy.strategy = strategy;
    }
    if args.reserve.is_some() {
        policy.reserve = args.reserve;
    }
    if let Some(max_tokens) = args.truncate_tool_results {
        policy.truncate_tool_results = Some(TruncatePolicy { max_tokens });
    }
    if let (Some(keep), Some(trigger_tokens)) = (args.clear_keep, args.clear_trigger_tokens) {
        policy.clear_tool_results = Some(ClearPolicy {
            trigger_tokens,
            keep,
            clear_at_least: args.clear_at_least,
            exclude_tools: args.clear_exclude.clone(),
            clear_inputs: args.clear_arguments,
        });
    }
    if let Some((field, problem)) = policy.problems().into_iter().next() {
        let flag = match field.as_str() {
            "truncate_tool_results.max_tokens" if args.truncate_tool_results.is_some() => {
                "--truncate-tool-results".to_owned()
            }
            "reserve" if args.reserve.is_some() => "--reserve".to_owned(),
            clear
                if clear.starts_with("clear_tool_results.")
                    && args.clear_trigger_tokens.is_some() =>
            {
                let name = clear.trim_start_matches("clear_tool_results.");
                let name = match name {
                    "trigger_tokens" => "trigger-tokens",
                    "clear_at_least" => "at-least",
                    "exclude_tools" => "exclude",
                    other => other,
                };
                format!("--clear-{name}")
            }
            _ => match &args.policy {
                Some(path) => format!("{}: {field}", path.display()),
                None => field,
            },
        };
        bail!("{flag}: {problem}");
    }
    Ok(policy)
}
