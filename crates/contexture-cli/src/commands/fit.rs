//! `contexture fit`: fit a chat history (a JSON array of OpenAI-format messages) for a model
//! exactly as a request to it is fitted, and print the fitted array. The fit is the
//! engine's, built by the one constructor of fit settings (the registry's model, the
//! calibration the store `--db` learnt when it exists, a fit policy, the call's overrides):
//! oversized tool results cut, old ones cleared, the history trimmed by the strategy and
//! mended for the provider's rules. A leading system message is the system prompt.
//!
//! Its settings are a fit policy, the one type an assistant's `context:` and a thread's
//! policy are: `--policy FILE` gives one whole (JSON or YAML), and the flags set its fields
//! over it (`--strategy`, `--reserve`, `--truncate-tool-results` is
//! `truncate_tool_results.max_tokens`, `--clear-*` are `clear_tool_results`, `--low-water`
//! is the hysteresis' low mark) or the call's overrides (`--max-tokens`, `--rules`, and the
//! shape of the kept history: `--start-on`, `--end-on`, `--drop-system`,
//! `--allow-partial`). So `fit --policy P` prints what `thread messages --model M` reads of a
//! thread whose policy is P.
//!
//! The budget bounds the whole request as `contexture tokens count --messages` counts it
//! (messages, reply priming, and tool schemas given with `--tools`): the model's context
//! window minus the reply reserve, which defaults to the model's `max_output_tokens`, capped
//! at a quarter of the window (the same rule as the budget breakdown of
//! `contexture tokens count --json`); `--max-tokens` lowers it.
//!
//! The history is read from its end: the file is checked as JSON a part at a time, keeping
//! only where each message is, then each message is read again from the file (its fields
//! checked) and counted only when the fit needs it, so a long history costs about what the
//! fit keeps, in time and in memory (standard input is held whole). A message the fit drops is not read as a message nor tokenized
//! (except the unit at the edge of the cut, which must be counted to know it does not fit),
//! so the report's `tokens_before` is `null` when the input was not counted in full;
//! `tokens_before_at_least` is then a lower bound. A fit that can keep older messages (the
//! strategies `first` and `head-tail`, cleared or cut tool results, pins) reads them all.

use std::io::{BufWriter, Write};
use std::path::PathBuf;

use anyhow::{Context, Result, bail};
use clap::{Args, ValueEnum};
use contexture_core::Role;
use contexture_core::fit::{ClearPolicy, FitPolicy, Hysteresis, Rules, Strategy, TruncatePolicy};
use contexture_core::format::openai;
use contexture_core::thread::Projection;
use contexture_engine::estimates::Learner;
use contexture_engine::fit_report::FitReport;
use contexture_engine::fitting::{
    FitOverrides, FitSettings, HistoryShape, ModelChoice, SettingsError,
};
use serde_json::Value;

use super::input;
use super::message_array::MessageArray;
use super::models::RegistryArgs;
use super::runtime;
use super::store_args::StoreArgs;

/// Arguments of `contexture fit`.
#[derive(Debug, Args)]
pub struct FitArgs {
    /// The model whose window and tokenizer to fit for.
    #[arg(long)]
    model: String,
    /// The most tokens the whole request may take: lowers the budget (the model's window
    /// minus the reserve), never raises it.
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
    /// Hysteresis: once the request passes the policy's high mark (else the budget), cut
    /// the history down to this many tokens (default: the policy's `hysteresis.low` share
    /// of the budget, when it has one).
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
    #[command(flatten)]
    store: StoreArgs,
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

/// Runs `contexture fit`.
pub fn run(args: FitArgs) -> Result<()> {
    runtime::on_current_thread(execute(args))
}

async fn execute(args: FitArgs) -> Result<()> {
    let registry = args.registry.load()?;
    let source = input::describe(args.file.as_deref());
    let history = MessageArray::read(args.file.as_deref())?;
    if let Some(&index) = args.pins.iter().find(|&&index| index >= history.len()) {
        bail!(
            "--pin {index}: {source} has only {} messages",
            history.len()
        );
    }
    let tools: Vec<Value> = match &args.tools {
        Some(path) => input::read_json(Some(path))?,
        None => Vec::new(),
    };
    let mut policy = policy_of(&args)?;
    let overrides = FitOverrides {
        max_tokens: args.max_tokens,
        rules: args.rules,
        shape: HistoryShape {
            keep_system: !args.drop_system,
            start_on: args.start_on.iter().copied().map(Role::from).collect(),
            end_on: args.end_on.iter().copied().map(Role::from).collect(),
            allow_partial: args.allow_partial,
        },
        ..FitOverrides::default()
    };
    // Fitted as a request for the model is: its estimate calibrated by what the store
    // learnt, when there is a store.
    let store = args.store.open_existing().await?;
    let mut settings = FitSettings::for_model(
        store.as_ref(),
        &registry,
        ModelChoice::Named(&args.model),
        &Learner::Operator,
        policy.clone(),
        overrides,
    )
    .await
    .map_err(|error| match error {
        SettingsError::Budget(error) => anyhow::Error::new(error).context(match &args.policy {
            Some(path) => format!(
                "{}: the budget does not work for {}",
                path.display(),
                args.model
            ),
            None => format!("the budget does not work for {}", args.model),
        }),
        other => other.into(),
    })?;
    let limit = settings.budget().limits(&settings.model)?.limit;
    if let Some(low_water) = args.low_water {
        policy.hysteresis = Some(low_mark(low_water, limit, policy.hysteresis)?);
        settings.adopt(&policy)?;
    }
    let messages_in = history.len();
    let not_messages = || format!("{source}: not a chat message array");
    let fitted = if args.pins.is_empty() {
        // Read from its end, a message at a time, only as far back as the fit needs: a
        // long history costs about what the fit keeps. Pinned messages can be anywhere, so
        // a fit with pins reads every message.
        settings
            .fit_list_read_back(messages_in, |index| history.message(index), &tools)
            .with_context(not_messages)?
    } else {
        let mut messages = history.messages().with_context(not_messages)?;
        for &index in &args.pins {
            messages[index].metadata.pinned = true;
        }
        settings.fit(Projection::from_messages(messages), &[], &tools)
    }
    .with_context(|| {
        format!(
            "cannot fit {source} into {limit} tokens for {}",
            settings.model.id
        )
    })?;

    history.check_unchanged()?;
    let mut out = BufWriter::new(std::io::stdout().lock());
    serde_json::to_writer_pretty(&mut out, &openai::WireMessages(&fitted.messages))?;
    writeln!(out)?;
    out.flush()?;
    if args.report {
        let report = FitReport::new(&settings, &fitted, messages_in)?;
        eprintln!("{}", serde_json::to_string_pretty(&report)?);
    }
    Ok(())
}

/// `--low-water`'s mark as the policy's hysteresis: cut down to `low_water` tokens of the
/// `limit` once the request passes the policy's high mark (else the limit itself).
fn low_mark(low_water: u32, limit: u32, policy: Option<Hysteresis>) -> Result<Hysteresis> {
    let high = policy.map_or(1.0, |hysteresis| hysteresis.high);
    let high_mark = (f64::from(limit) * high).floor() as u32;
    if low_water == 0 || low_water >= high_mark {
        bail!(
            "--low-water: must be at least 1 and below the {high_mark} tokens past which the request is cut (not {low_water})"
        );
    }
    // Half a token over, so that the mark comes back whole from the share (shares are
    // turned into tokens rounding down).
    Ok(Hysteresis {
        high,
        low: (f64::from(low_water) + 0.5) / f64::from(limit),
    })
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
    if let Some(keep) = args.clear_keep {
        policy.clear_tool_results = Some(ClearPolicy {
            // Without a trigger, every result but the newest `keep` is cleared: a request
            // of one token is past it.
            trigger_tokens: Some(args.clear_trigger_tokens.unwrap_or(1)),
            trigger_tool_uses: None,
            min_cleared: None,
            keep,
            clear_at_least: args.clear_at_least,
            exclude_tools: args.clear_exclude.clone(),
            clear_inputs: args.clear_arguments.into(),
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
