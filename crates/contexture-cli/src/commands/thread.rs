//! `contexture thread`: append to, read, fork, list, delete and prune threads in a store, and
//! set their retention of request records.
//!
//! `--db` names the store: `sqlite:PATH` (the default, `sqlite:contexture.db`) or
//! `postgres://...`. Messages are read and printed in the OpenAI chat format; events are
//! printed as JSON lines in Contexture's storage form.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use anyhow::{Context, Result, bail};
use clap::{Args, Subcommand};
use contexture_core::compact::CompactionPolicy;
use contexture_core::fit::{FitPolicy, Strategy};
use contexture_core::format::openai;
use contexture_core::thread::{ConflictPolicy, MergeKeys, MergePolicy, MergeSpec, ThreadPolicy};
use contexture_core::tokens::Encoding;
use contexture_engine::compaction::{CompactOptions, CompactionOutcome, Compactor, compact_stored};
use contexture_engine::estimates::Learner;
use contexture_engine::fitting::{
    FitOverrides, FitSettings, MessageView, ModelChoice, SettingsError, thread_messages,
};
use contexture_engine::llm::LlmSpec;
use contexture_engine::threads::{
    append_messages, fork_thread, merge_thread, restore_thread, search_thread, set_thread_policy,
    switch_context,
};
use contexture_store::{AnyStore, RequestRetention, RetentionRules, Store, StoreError};
use serde_json::Value;

use super::input;
use super::llm::LlmArgs;
use super::models::RegistryArgs;
use super::runtime;
use super::store_args::StoreArgs;

/// Arguments of `contexture thread`.
#[derive(Debug, Args)]
pub struct ThreadArgs {
    #[command(flatten)]
    store: StoreArgs,
    #[command(subcommand)]
    command: ThreadCommand,
}

/// The `thread` subcommands.
#[derive(Debug, Subcommand)]
pub enum ThreadCommand {
    /// Append one message (a JSON object) or several (an array) in one transaction; print
    /// each assigned seq on its own line once committed.
    Append {
        /// The thread (created on first append).
        #[arg(long)]
        thread: String,
        /// An idempotency key: a retry with the same key stores nothing and prints the seqs
        /// assigned the first time (message i of the file is keyed KEY:i, as the API keys a request's
        /// messages, so a retry through either stores nothing twice).
        #[arg(long)]
        key: Option<String>,
        /// Append in this named context: it becomes the active one first, in the same
        /// transaction (it must be one the thread has; `thread switch --create` starts one).
        #[arg(long)]
        context: Option<String>,
        /// The JSON file; standard input when absent or `-`.
        file: Option<PathBuf>,
    },
    /// Print the thread's message view as a JSON array, fitted when --model or --max-tokens
    /// is given: the messages a request to that model would be sent (the same fit as the
    /// server's `GET /v1/threads/{id}/context`).
    Messages {
        /// The thread.
        #[arg(long)]
        thread: String,
        /// Fit for this model: its window, tokenizer and message rules (default with
        /// --max-tokens: the registry's default model).
        #[arg(long)]
        model: Option<String>,
        /// At most this many tokens for the request (default: the model's budget, its window
        /// times --budget-ratio minus the reply reserve).
        #[arg(long)]
        max_tokens: Option<u32>,
        /// Which history survives fitting: last, first, head-tail or head-tail:N (default:
        /// the thread's policy's, else last).
        #[arg(long)]
        strategy: Option<Strategy>,
        /// The share of the window the request may use, in (0, 1] (default: the thread's
        /// policy's, else 1).
        #[arg(long)]
        budget_ratio: Option<f64>,
        /// Tokens kept free for the reply (default: the thread's policy's, else the model's
        /// output limit, at most a quarter of the window).
        #[arg(long)]
        reserve_output: Option<u32>,
        /// Keep only the last N units of the conversation: a message, or an assistant turn
        /// with its tool results counted as one (the system prompt is not counted).
        #[arg(long)]
        limit: Option<usize>,
        /// Project this named context instead of the active one.
        #[arg(long)]
        context: Option<String>,
        #[command(flatten)]
        registry: RegistryArgs,
    },
    /// Print the thread's events as JSON lines (a fork's shared prefix included).
    Events {
        /// The thread.
        #[arg(long)]
        thread: String,
    },
    /// Print the messages of a thread that hold QUERY (case-insensitive) as JSON lines, oldest
    /// first: each with its event's seq and type, its role and an excerpt around the match.
    Search {
        /// The thread.
        #[arg(long)]
        thread: String,
        /// At most this many hits (at most 1,000).
        #[arg(long, default_value_t = 20)]
        limit: usize,
        /// The text to look for.
        query: String,
    },
    /// Fork a thread after event SEQ without copying; print the seq of the fork's first event.
    Fork {
        /// The thread to fork.
        #[arg(long)]
        thread: String,
        /// The last event the fork shares (0: none; default: the thread's last event).
        #[arg(long)]
        at: Option<u64>,
        /// The new thread's id.
        #[arg(long = "new")]
        new: String,
    },
    /// Merge a fork back into the thread it was forked from as one `merged` event; print
    /// its seq.
    Merge {
        /// The thread to merge into (the fork's parent).
        #[arg(long)]
        thread: String,
        /// The fork to merge from.
        #[arg(long)]
        from: String,
        /// What comes back: append-messages, summary-only or output-keys.
        #[arg(long, default_value = "append-messages", value_parser = kebab_name::<MergePolicy>)]
        policy: MergePolicy,
        /// When a key brought back already holds another value: child-wins, parent-wins,
        /// error or append.
        #[arg(long, default_value = "child-wins", value_parser = kebab_name::<ConflictPolicy>)]
        conflict: ConflictPolicy,
        /// The fork's store keys to bring back (repeat the flag or separate with commas).
        #[arg(long, value_delimiter = ',', conflicts_with = "all_keys")]
        keys: Vec<String>,
        /// Bring back every key of the fork's store (by --conflict where the thread holds
        /// another value).
        #[arg(long)]
        all_keys: bool,
    },
    /// List threads: id, last seq, and the fork point of forks.
    List {
        /// Print JSON lines with timestamps and sizes instead.
        #[arg(long)]
        json: bool,
        /// Add each thread's size: the bytes of its events, the bytes of its messages (each
        /// stored once), and how many times its messages' bytes the whole takes.
        #[arg(long)]
        sizes: bool,
    },
    /// Delete a thread (refused while it has forks).
    Delete {
        /// The thread.
        #[arg(long)]
        thread: String,
    },
    /// Prune request records by each thread's retention policy (for threads without one,
    /// the policy given here, if any) and, with --idle-secs, delete threads idle for longer,
    /// forks before their parents; print a JSON report. Message events are never pruned.
    Prune {
        /// Also delete the threads idle for longer than this many seconds.
        #[arg(long, value_name = "SECONDS")]
        idle_secs: Option<u64>,
        #[command(flatten)]
        retention: RetentionArgs,
        /// Then rewrite an SQLite file without its free pages (and switch a file made by an
        /// older version to giving pages back as it goes). Writes wait meanwhile: run it
        /// during maintenance. PostgreSQL's autovacuum needs nothing.
        #[arg(long)]
        vacuum: bool,
    },
    /// Show a thread's own retention policy for its request records, set it (--keep-days,
    /// --keep-last) or remove it (--clear). `thread prune` and the server's pruning apply it.
    Retention {
        /// The thread.
        #[arg(long)]
        thread: String,
        #[command(flatten)]
        retention: RetentionArgs,
        /// Remove the thread's policy (the default policy applies again).
        #[arg(long, conflicts_with_all = ["keep_days", "keep_last"])]
        clear: bool,
    },
    /// Print the thread's own policy for its requests (null: none); with --set FILE, set it
    /// first (JSON or YAML: `context`, how requests are fitted, the shape of an assistant's
    /// `context:`, and `compaction`), with --clear remove it. A server fits and compacts the
    /// thread's requests by it in place of its `[context]` and `[compaction]`.
    Policy {
        /// The thread.
        #[arg(long)]
        thread: String,
        /// The policy file (standard input with `-`).
        #[arg(long, value_name = "FILE")]
        set: Option<PathBuf>,
        /// Remove the thread's policy (the defaults apply again).
        #[arg(long, conflicts_with = "set")]
        clear: bool,
    },
    /// Make another named context the thread's active one (the one requests and `messages`
    /// read); print the switch's seq. While a request is in flight the switch waits for it
    /// to end; recorded again with the same --op-id it has no second effect.
    Switch {
        /// The thread.
        #[arg(long)]
        thread: String,
        /// The context to make active: one the thread has (`main`, or one a replace or a
        /// switch named), or a new one with --create.
        #[arg(long)]
        context: String,
        /// The operation's id, so that a retry is applied once.
        #[arg(long, value_name = "ID")]
        op_id: Option<String>,
        /// Start a new context of this name (it shows the whole history until replaced).
        #[arg(long)]
        create: bool,
    },
    /// Summarize the older part of a thread into one message (a recorded replace: the
    /// original events stay); print what was covered and the tokens before and after.
    Compact(CompactArgs),
    /// Put back the thread's messages as they were just before a replace event (a compaction
    /// or a clear), followed by everything appended since; print the restore's seq.
    Restore {
        /// The thread.
        #[arg(long)]
        thread: String,
        /// The seq of the replace event to undo.
        #[arg(long, value_name = "SEQ")]
        before: u64,
    },
}

/// Arguments of `contexture thread compact`.
#[derive(Debug, Args)]
pub struct CompactArgs {
    /// The thread.
    #[arg(long)]
    thread: String,
    /// The summarizer model (through --llm); without it, the offline extractive summarizer.
    #[arg(long)]
    model: Option<String>,
    /// Keep at most this many of the most recent tokens verbatim (default 2,000).
    #[arg(long, value_name = "N")]
    keep_tokens: Option<u64>,
    /// Keep at most this many of the most recent messages verbatim.
    #[arg(long, value_name = "N")]
    keep_messages: Option<usize>,
    /// Verbatim content kept before the summary and never shown to the summarizer.
    #[arg(long)]
    notes: Option<String>,
    /// Keep only the notes (and pinned messages): no summary.
    #[arg(long)]
    no_history: bool,
    /// The most tokens the summary may take (default 1,024).
    #[arg(long, value_name = "N")]
    summary_tokens: Option<u32>,
    /// Summarizer attempts after a failed or empty summary (default 2).
    #[arg(long, value_name = "N")]
    retries: Option<u32>,
    /// Seconds one summarizer call may take (default 600), in place of --llm-timeout.
    #[arg(long, value_name = "SECONDS")]
    summary_timeout: Option<u64>,
    /// A file holding the summarizer's prompt (with {transcript}, optionally
    /// {previous_summary}) instead of the default.
    #[arg(long, value_name = "FILE")]
    prompt: Option<PathBuf>,
    /// The model whose tokenizer counts the tokens before and after.
    #[arg(long, default_value = "gpt-4o")]
    tokens_model: String,
    /// Print the report as JSON.
    #[arg(long)]
    json: bool,
    #[command(flatten)]
    llm: LlmArgs,
    #[command(flatten)]
    registry: RegistryArgs,
}

/// Runs a `thread` command.
/// Parses a policy by its kebab-case name (as the HTTP API and workflows spell it).
fn kebab_name<T: serde::de::DeserializeOwned>(name: &str) -> Result<T, String> {
    serde_json::from_value(Value::String(name.to_owned())).map_err(|error| error.to_string())
}

pub fn run(args: ThreadArgs) -> Result<()> {
    runtime::on_worker_threads(Some(2), execute(args))
}

async fn execute(args: ThreadArgs) -> Result<()> {
    let store = args.store.open().await?;
    match args.command {
        ThreadCommand::Append {
            thread,
            key,
            context,
            file,
        } => {
            let source = input::describe(file.as_deref());
            let value: Value = input::read_json(file.as_deref())?;
            let messages = match &value {
                Value::Array(_) => openai::parse_messages(&value),
                _ => openai::parse_message(&value).map(|m| vec![m]),
            };
            let messages = messages
                .with_context(|| format!("{source}: not a chat message or message array"))?;
            if messages.is_empty() {
                bail!("{source}: the array holds no message");
            }
            let appended = append_messages(
                &store,
                &thread,
                messages,
                key.as_deref(),
                context.as_deref(),
            )
            .await
            .with_context(|| match &context {
                Some(context) => {
                    format!("cannot append to thread {thread} in context {context}")
                }
                None => format!("cannot append to thread {thread}"),
            })?;
            for seq in appended.seqs {
                println!("{seq}");
            }
        }
        ThreadCommand::Messages {
            thread,
            model,
            max_tokens,
            strategy,
            budget_ratio,
            reserve_output,
            limit,
            context,
            registry,
        } => {
            let settings = if model.is_some() || max_tokens.is_some() {
                let registry = registry.load()?;
                let overrides = FitOverrides {
                    strategy,
                    budget_ratio,
                    reserve: reserve_output,
                    max_tokens,
                    ..FitOverrides::default()
                };
                // Measured as requests to it are: with what its family's calls taught.
                let settings = FitSettings::for_model(
                    Some(&store),
                    &registry,
                    model
                        .as_deref()
                        .map_or(ModelChoice::Default, ModelChoice::Named),
                    &Learner::Operator,
                    FitPolicy::default(),
                    overrides,
                )
                .await
                .map_err(|error| match error {
                    SettingsError::Budget(error) => {
                        anyhow::Error::new(error).context("--budget-ratio")
                    }
                    other => other.into(),
                })?;
                Some(settings)
            } else {
                None
            };
            let what = match &settings {
                Some(settings) => format!("cannot fit thread {thread} for {}", settings.model.id),
                None => format!("cannot read thread {thread}"),
            };
            let view = MessageView {
                context,
                limit,
                fit: settings,
            };
            let messages = thread_messages(&store, &thread, &view)
                .await
                .context(what)?;
            println!(
                "{}",
                serde_json::to_string_pretty(&openai::to_values(&messages))?
            );
        }
        ThreadCommand::Events { thread } => {
            for event in store.events(&thread).await? {
                println!("{}", serde_json::to_string(&event)?);
            }
        }
        ThreadCommand::Search {
            thread,
            limit,
            query,
        } => {
            let hits = search_thread(&store, &thread, &query, limit)
                .await
                .with_context(|| format!("cannot search thread {thread}"))?;
            for hit in hits {
                println!("{}", serde_json::to_string(&hit)?);
            }
        }
        ThreadCommand::Fork { thread, at, new } => {
            println!(
                "{}",
                fork_thread(&store, &thread, at, &new).await?.forked_seq
            );
        }
        ThreadCommand::Merge {
            thread,
            from,
            policy,
            conflict,
            keys,
            all_keys,
        } => {
            let spec = MergeSpec {
                policy,
                conflict,
                keys: if all_keys {
                    MergeKeys::All
                } else {
                    MergeKeys::Listed(keys)
                },
            };
            let seq = merge_thread(&store, &thread, &from, &spec)
                .await
                .with_context(|| format!("cannot merge thread {from} into {thread}"))?;
            println!("{seq}");
        }
        ThreadCommand::List { json, sizes } => {
            for info in store.list().await? {
                if json {
                    println!("{}", serde_json::to_string(&info)?);
                    continue;
                }
                let mut line = format!("{}\t{}", info.id, info.last_seq);
                if let (Some(parent), Some(at)) = (&info.parent, info.fork_seq) {
                    line.push_str(&format!("\tfork of {parent} at {at}"));
                }
                if let Some(policy) = &info.retention {
                    line.push_str(&format!("\tkeeps request records: {policy}"));
                }
                if sizes {
                    line.push_str(&format!(
                        "\t{} bytes, {} in messages{}",
                        info.bytes,
                        info.message_bytes,
                        match info.message_bytes {
                            0 => String::new(),
                            messages => format!(" ({:.1}x)", info.bytes as f64 / messages as f64),
                        }
                    ));
                }
                println!("{line}");
            }
        }
        ThreadCommand::Delete { thread } => store.delete(&thread).await?,
        ThreadCommand::Compact(args) => compact(&store, args).await?,
        ThreadCommand::Restore { thread, before } => {
            let seq = restore_thread(&store, &thread, before).await?;
            println!("{seq}");
        }
        ThreadCommand::Prune {
            idle_secs,
            retention,
            vacuum,
        } => {
            let now = SystemTime::now();
            let mut report = serde_json::Map::new();
            if let Some(idle_secs) = idle_secs {
                let cutoff = now
                    .checked_sub(Duration::from_secs(idle_secs))
                    .unwrap_or(SystemTime::UNIX_EPOCH);
                let deleted = store.prune(cutoff).await?;
                if let Value::Object(fields) = serde_json::to_value(&deleted)? {
                    report.extend(fields);
                }
            }
            let rules = RetentionRules::with_default(retention.policy()?);
            let requests = store.prune_requests(&rules, now).await?;
            report.insert("requests".into(), serde_json::to_value(&requests)?);
            if vacuum && let Some((before, after)) = store.vacuum().await? {
                report.insert(
                    "file_bytes".into(),
                    serde_json::json!({"before": before, "after": after}),
                );
            }
            println!("{}", serde_json::to_string_pretty(&report)?);
        }
        ThreadCommand::Retention {
            thread,
            retention,
            clear,
        } => {
            let policy = retention.policy()?;
            if clear || policy.is_some() {
                store
                    .set_retention(&thread, policy)
                    .await
                    .with_context(|| format!("cannot set the retention of thread {thread}"))?;
            }
            let info = store
                .thread_info(&thread)
                .await?
                .ok_or(StoreError::NotFound { thread })?;
            match info.retention {
                Some(policy) => println!("{}", serde_json::to_string(&policy)?),
                None => println!("null"),
            }
        }
        ThreadCommand::Switch {
            thread,
            context,
            op_id,
            create,
        } => {
            let switched = switch_context(
                &store,
                &thread,
                &context,
                op_id,
                create,
                contexture_core::thread::DEFAULT_MAX_CONTEXTS,
            )
            .await
            .with_context(|| format!("cannot switch thread {thread} to context {context}"))?;
            if switched.queued {
                eprintln!(
                    "a request is in flight on thread {thread}: the switch to {context} applies when it ends"
                );
            }
            println!("{}", switched.seq);
        }
        ThreadCommand::Policy { thread, set, clear } => {
            let policy = match &set {
                Some(path) => Some(input::read_yaml::<ThreadPolicy>(Some(path))?),
                None => None,
            };
            if clear || policy.is_some() {
                set_thread_policy(&store, &thread, policy)
                    .await
                    .with_context(|| format!("cannot set the policy of thread {thread}"))?;
            }
            let tail = store
                .load_projection_tail(&thread, Encoding::O200kBase, 0)
                .await?;
            if tail.last_seq == 0 {
                return Err(StoreError::NotFound { thread }.into());
            }
            println!("{}", serde_json::to_string(&tail.policy)?);
        }
    }
    Ok(())
}

/// A retention policy for request records given on the command line.
#[derive(Debug, Args)]
pub struct RetentionArgs {
    /// Keep request records appended in the last this many days.
    #[arg(long, value_name = "DAYS")]
    keep_days: Option<u32>,
    /// Keep each thread's newest this many request records.
    #[arg(long, value_name = "N")]
    keep_last: Option<u64>,
}

impl RetentionArgs {
    /// The policy given, if any.
    fn policy(&self) -> Result<Option<RequestRetention>> {
        if self.keep_days.is_none() && self.keep_last.is_none() {
            return Ok(None);
        }
        let policy = RequestRetention::new(self.keep_days, self.keep_last)
            .context("--keep-days / --keep-last")?;
        Ok(Some(policy))
    }
}

/// `contexture thread compact`.
async fn compact(store: &AnyStore, args: CompactArgs) -> Result<()> {
    let registry = Arc::new(args.registry.load()?);
    let options = CompactOptions {
        summarizer: args.model.clone(),
        keep_tokens: args.keep_tokens,
        keep_messages: args.keep_messages,
        summary_tokens: args.summary_tokens,
        max_retries: args.retries,
        timeout_secs: args.summary_timeout,
        prompt: match &args.prompt {
            Some(path) => Some(input::read_text(Some(path))?),
            None => None,
        },
        notes: args.notes.clone(),
        preserve_history: Some(!args.no_history),
        measure_model: Some(args.tokens_model.clone()),
    };
    let request = options.request(CompactionPolicy::default(), "manual")?;
    let spec: LlmSpec = args.llm.llm.as_deref().unwrap_or("auto").parse()?;
    let router = spec.router(&args.llm.settings()?, registry.clone(), 0)?;
    let compactor = Compactor::new(router, registry);
    let report = compact_stored(&compactor, store, &args.thread, &request)
        .await
        .with_context(|| format!("cannot compact thread {}", args.thread))?;
    if args.json {
        println!("{}", serde_json::to_string_pretty(&report)?);
    } else {
        match &report.outcome {
            CompactionOutcome::Compacted {
                replace_seq,
                queued,
            } => {
                let (from, to) = report.covered.unwrap_or_default();
                let replacement = if report.summary.is_some() {
                    "a summary"
                } else {
                    "the notes"
                };
                if *queued {
                    println!(
                        "queued a compaction of thread {}: a request is in flight, and seqs {from}..{to} ({} messages) are replaced by {replacement} when it ends (event {replace_seq}, summarizer {}, {} calls)",
                        args.thread, report.covered_messages, report.summarizer, report.calls
                    );
                } else {
                    println!(
                        "compacted thread {}: seqs {from}..{to} ({} messages) replaced by {replacement} (event {replace_seq}, summarizer {}, {} calls)",
                        args.thread, report.covered_messages, report.summarizer, report.calls
                    );
                }
                println!(
                    "tokens: {} -> {} ({})",
                    report.tokens_before, report.tokens_after, args.tokens_model
                );
            }
            CompactionOutcome::Skipped { reason } => {
                println!("nothing compacted in thread {}: {reason}", args.thread);
            }
            CompactionOutcome::Failed { .. } => {}
        }
    }
    if let CompactionOutcome::Failed { error } = &report.outcome {
        bail!(
            "compaction of thread {} failed and replaced nothing: {error}",
            args.thread
        );
    }
    Ok(())
}
