//! `contexture run`: run a YAML workflow (or resume one) and print its final output.
//!
//! Standard output gets the final output (and, with `--print-context`, the final context
//! store as JSON after it). Standard error gets a progress line per step when it is a
//! terminal, each request's budget and messages with `--trace`, and errors with the command
//! that resumes the run.

use std::io::{IsTerminal, Write};
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::Instant;

use anyhow::{Result, anyhow, bail};
use clap::Args;
use contexture_core::format::openai;
use contexture_core::thread::{Event, EventKind, RequestOutcome, RunLimits};
use contexture_engine::conversation::ConversationKey;
use contexture_engine::executor::{
    ExecError, Executor, McpProgress, Observer, RunOutcome, RunRequest, parse_user_context,
};
use contexture_engine::hooks::{HookProgramSpec, ProgramHook};
use contexture_engine::llm::LlmSpec;
use contexture_engine::sources::FileSource;
use contexture_engine::workflow::Workflow;
use contexture_llm::StreamDelta;
use contexture_store::{Store, Tenant};

use super::input;
use super::llm::LlmArgs;
use super::models::RegistryArgs;
use super::runtime;
use super::store_args::StoreArgs;

/// Arguments of `contexture run`.
#[derive(Debug, Args)]
pub struct RunArgs {
    /// The workflow YAML file (not needed with --resume).
    #[arg(required_unless_present = "resume")]
    workflow: Option<PathBuf>,
    /// The user input: JSON (its root keys fill the context store) or plain text.
    #[arg(long, conflicts_with = "input_file")]
    input: Option<String>,
    /// Read the user input from a file (`-` for standard input).
    #[arg(long, value_name = "FILE")]
    input_file: Option<PathBuf>,
    #[command(flatten)]
    store: StoreArgs,
    /// Continue the execution with this id from its log (finished steps are not re-run).
    #[arg(long, value_name = "EXECUTION_ID", conflicts_with_all = ["input", "input_file", "execution_id"])]
    resume: Option<String>,
    /// Continue a conversation: USER or USER/CHAT. The run loads the conversation's recent
    /// history and, when it completes, adds its input and answer to it (key: user, workflow
    /// name, chat; with --tenant, the tenant's conversation).
    #[arg(long, value_name = "USER[/CHAT]", conflicts_with = "resume")]
    conversation: Option<String>,
    /// Run as this tenant: the execution, its sub-workflows and its conversation are the
    /// tenant's threads, as if the tenant's API key had started it through `contexture
    /// serve` (a resumed run must name the tenant that started it).
    #[arg(long, value_name = "TENANT")]
    tenant: Option<String>,
    /// The run's user context, a JSON object that every template of the run and of its
    /// sub-workflows reads, read-only, as `user_context.KEY` (a resumed run keeps the one
    /// it started with).
    #[arg(long, value_name = "JSON", conflicts_with = "resume")]
    user_context: Option<String>,
    /// The new execution's id (default: a fresh UUID).
    #[arg(long)]
    execution_id: Option<String>,
    /// Print each request's budget and messages to standard error.
    #[arg(long)]
    trace: bool,
    /// After the output, print the final context store as JSON.
    #[arg(long)]
    print_context: bool,
    /// Stream replies (with --trace, the text is shown as it arrives).
    #[arg(long)]
    stream: bool,
    /// Stop the run once its calls have used this many tokens.
    #[arg(long, value_name = "TOKENS")]
    max_tokens: Option<u64>,
    /// Stop the run once its calls have cost this many US dollars.
    #[arg(long, value_name = "USD")]
    max_cost: Option<f64>,
    /// Stop the run after this many steps.
    #[arg(long, value_name = "STEPS")]
    max_steps: Option<u64>,
    /// Cancel the run once it has run this many seconds of wall-clock time.
    #[arg(long, value_name = "SECONDS")]
    max_seconds: Option<f64>,
    /// Render templates at this Unix time instead of now (reproducible runs).
    #[arg(long, value_name = "UNIX_SECONDS")]
    now: Option<i64>,
    /// Call PROGRAM at every hook point of the run: it reads the point and its payload as
    /// JSON on standard input and answers with a JSON decision (nothing, or `{}`, changes
    /// nothing). Repeat to chain programs, in the order given; they run after the
    /// workflow's own hooks. See docs/workflows.md, "Hook programs".
    #[arg(long = "hook", value_name = "PROGRAM")]
    hooks: Vec<String>,
    #[command(flatten)]
    llm: LlmArgs,
    #[command(flatten)]
    registry: RegistryArgs,
}

/// Runs `contexture run`.
pub fn run(args: RunArgs) -> Result<()> {
    runtime::on_worker_threads(Some(2), execute(args))
}

async fn execute(args: RunArgs) -> Result<()> {
    if let Some(cost) = args.max_cost
        && !(cost.is_finite() && cost >= 0.0)
    {
        bail!("--max-cost must be a non-negative number of dollars, not {cost}");
    }
    if let Some(seconds) = args.max_seconds
        && !(seconds.is_finite() && seconds > 0.0)
    {
        bail!("--max-seconds must be a positive number of seconds, not {seconds}");
    }
    let store = args.store.open().await?;
    match args.tenant.clone() {
        Some(name) => {
            let tenant = Tenant::new(name).map_err(|error| anyhow!("--tenant: {error}"))?;
            execute_on(args, store.scoped(tenant)).await
        }
        None => execute_on(args, store).await,
    }
}

/// Runs `contexture run` on `store`: the whole store, or a tenant's view of it.
async fn execute_on<S: Store + Clone + 'static>(args: RunArgs, store: S) -> Result<()> {
    let registry = Arc::new(args.registry.load()?);
    let settings = args.llm.settings()?;
    let limits = RunLimits {
        max_tokens: args.max_tokens,
        max_cost_usd: args.max_cost,
        max_steps: args.max_steps,
        max_seconds: args.max_seconds,
    };
    let progress = Arc::new(Progress::new(std::io::stderr().is_terminal(), args.trace));

    // A resumed run keeps its LLM unless another is named; a scripted one continues its
    // script after the replies the log already used.
    let (spec_text, skip) = match &args.resume {
        Some(id) => {
            let probe = Executor::new(
                store.clone(),
                LlmSpec::Auto.router(&settings, registry.clone(), 0)?,
            );
            let log = probe.load(id).await.map_err(|error| report(error, None))?;
            log.resume_llm(args.llm.llm.as_deref())
        }
        None => (args.llm.llm.clone().unwrap_or_else(|| "auto".to_owned()), 0),
    };
    // A new run's workflow and input are read and checked before the LLM is set up, so
    // that a mistake in them is the error reported.
    let new_run = match &args.resume {
        Some(_) => None,
        None => {
            let path = args
                .workflow
                .as_deref()
                .ok_or_else(|| anyhow!("no workflow file"))?;
            let text = input::read_text(Some(path))?;
            let file = path.display().to_string();
            let workflow = Workflow::load_tree(&text, &file, &FileSource)?;
            let input = match (&args.input, &args.input_file) {
                (Some(text), _) => text.clone(),
                (None, Some(file)) => input::read_text(Some(file))?,
                (None, None) => String::new(),
            };
            let conversation = args.conversation.as_deref().map(|key| {
                let (user, chat) = match key.split_once('/') {
                    Some((user, chat)) => (user, Some(chat.to_owned())),
                    None => (key, None),
                };
                ConversationKey::new(user, chat, &workflow, &file)
            });
            Some((file, text, input, conversation))
        }
    };
    let user_context = args
        .user_context
        .as_deref()
        .map(parse_user_context)
        .transpose()
        .map_err(|error| anyhow!("--user-context: {error}"))?;
    let spec: LlmSpec = spec_text.parse()?;
    let router = spec.router(&settings, registry.clone(), skip)?;
    let mut executor = Executor::new(store, router)
        .with_registry(registry)
        .with_render_options(contexture_engine::system::render_options(args.now))
        .with_limits(limits)
        .with_streaming(args.stream)
        .with_observer(progress.clone());
    for program in &args.hooks {
        let hook = ProgramHook::new(HookProgramSpec::program(program))
            .map_err(|error| anyhow!("--hook {program:?}: {error}"))?;
        executor = executor.with_hook(Arc::new(hook));
    }

    let outcome = match (&args.resume, new_run) {
        (Some(id), _) => executor.resume(id).await,
        (None, Some((workflow_file, workflow_text, input, conversation))) => {
            executor
                .start(RunRequest {
                    workflow_file,
                    workflow_text,
                    input,
                    execution_id: args.execution_id.clone(),
                    llm: Some(spec.to_string()),
                    conversation: conversation.clone(),
                    origin: Default::default(),
                    user_context: user_context.clone(),
                })
                .await
        }
        (None, None) => bail!("no workflow file"),
    };
    let outcome: RunOutcome = outcome.map_err(|error| {
        let id = error.execution_id().map(str::to_owned);
        report(error, id)
    })?;
    if progress.steps {
        eprintln!(
            "done: execution {} in {} steps, {} tokens ({} in, {} out){}",
            outcome.execution_id,
            outcome.steps,
            outcome.usage.input_tokens + outcome.usage.output_tokens,
            outcome.usage.input_tokens,
            outcome.usage.output_tokens,
            match outcome.cost_usd {
                Some(cost) if cost > 0.0 => format!(", {}", super::inspect::dollars(Some(cost))),
                Some(_) => String::new(),
                None => format!(", {}", super::inspect::dollars(None)),
            }
        );
    }
    // The output as the last step gave it, ending with exactly one newline.
    let mut printed = format!(
        "{}\n",
        outcome.output.strip_suffix('\n').unwrap_or(&outcome.output)
    );
    if args.print_context {
        printed.push_str(&serde_json::to_string_pretty(&outcome.store)?);
        printed.push('\n');
    }
    print_output(&printed)
}

/// Writes `text` to standard output; a reader that stopped reading (`| head`) is not an
/// error. (`run` keeps SIGPIPE ignored, so that a tool or hook program that exits early does
/// not end it, and a closed pipe shows up here instead.)
fn print_output(text: &str) -> Result<()> {
    let mut stdout = std::io::stdout().lock();
    match stdout
        .write_all(text.as_bytes())
        .and_then(|()| stdout.flush())
    {
        Err(error) if error.kind() == std::io::ErrorKind::BrokenPipe => Ok(()),
        other => Ok(other?),
    }
}

/// An execution error with how to go on: a failed run can be resumed, a cancelled one
/// cannot (its own error says so when the run ended between steps).
fn report(error: ExecError, execution_id: Option<String>) -> anyhow::Error {
    let resumable = matches!(error, ExecError::StepFailed { .. }) && !error.is_cancelled();
    let cancelled_in_a_step = matches!(error, ExecError::StepFailed { .. }) && error.is_cancelled();
    let error = anyhow::Error::new(error);
    match execution_id {
        Some(id) if resumable => {
            error.context(format!("the run stopped; resume it with `contexture run --resume {id}` (its log is in the store)"))
        }
        Some(_) if cancelled_in_a_step => {
            error.context("the run was cancelled; a cancelled run cannot be resumed (start it again)")
        }
        _ => error,
    }
}

/// Progress lines and traces on standard error.
struct Progress {
    steps: bool,
    trace: bool,
    /// The running step: when it started, its calls and their tokens.
    current: Mutex<StepProgress>,
}

#[derive(Default)]
struct StepProgress {
    started: Option<Instant>,
    calls: u32,
    tokens: u64,
}

impl Progress {
    fn new(steps: bool, trace: bool) -> Progress {
        Progress {
            steps,
            trace,
            current: Mutex::new(StepProgress::default()),
        }
    }

    fn step(&self) -> std::sync::MutexGuard<'_, StepProgress> {
        self.current
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// `in 1.2s, 2 calls, 350 tokens` for the step that just ended.
    fn summary(&self) -> String {
        let step = self.step();
        let elapsed = step
            .started
            .map(|started| format!("in {:.1}s", started.elapsed().as_secs_f64()))
            .unwrap_or_default();
        match step.calls {
            0 => elapsed,
            1 => format!("{elapsed}, 1 call, {} tokens", step.tokens),
            n => format!("{elapsed}, {n} calls, {} tokens", step.tokens),
        }
    }
}

impl Observer for Progress {
    fn on_event(&self, execution_id: &str, event: &Event) {
        match &event.kind {
            EventKind::RunStarted(start) if self.steps => {
                eprintln!("run {execution_id}: {}", start.workflow_file);
            }
            EventKind::StepStarted(step) => {
                *self.step() = StepProgress {
                    started: Some(Instant::now()),
                    ..StepProgress::default()
                };
                if self.steps {
                    let item = step
                        .item
                        .map(|i| format!(" item {}", i + 1))
                        .unwrap_or_default();
                    eprintln!("[{}] {}{item} ...", step.step, step.state_id);
                }
            }
            EventKind::StepFinished(step) if self.steps => {
                let next = step
                    .next
                    .as_deref()
                    .map(|n| format!(" -> {n}"))
                    .unwrap_or_default();
                eprintln!(
                    "[{}] {} done {}{next}",
                    step.step,
                    step.state_id,
                    self.summary()
                );
            }
            EventKind::StepFailed(failure) if self.steps => {
                eprintln!(
                    "[{}] {} failed {}: {}",
                    failure.step,
                    failure.state_id,
                    self.summary(),
                    failure.error
                );
            }
            EventKind::StepCompacted(compaction) if self.trace => {
                eprintln!("--- step {}: {}", compaction.step, compaction.describe());
            }
            EventKind::RequestStarted(request) if self.trace => {
                eprintln!("--- request {}", request.request_id);
                if let Some(budget) = &request.breakdown {
                    eprintln!(
                        "    model {} window {} limit {}: system {} + tools {} + pinned {} + summary {} + messages {} + priming {} = {} used, {} left (reserve {})",
                        budget.model,
                        budget.limits.context_window,
                        budget.limits.limit,
                        budget.system,
                        budget.tools,
                        budget.pinned,
                        budget.summary,
                        budget.messages,
                        budget.reply_priming,
                        budget.used,
                        budget.remaining,
                        budget.limits.reserve_output,
                    );
                }
                if let Some(reason) = request.fit.as_ref().and_then(|fit| fit.reason.as_ref()) {
                    eprintln!("    fitted: {reason}");
                }
                for change in request.fit.iter().flat_map(|fit| fit.tool_result_changes()) {
                    eprintln!("      {change}");
                }
                for message in &request.messages {
                    eprintln!("    {}", openai::to_value(message));
                }
            }
            EventKind::RequestEnded(end) => {
                {
                    let mut step = self.step();
                    step.calls += 1;
                    step.tokens += end.usage.input_tokens + end.usage.output_tokens;
                }
                if !self.trace {
                    return;
                }
                match end.outcome {
                    RequestOutcome::Completed => eprintln!(
                        "    -> {} in / {} out tokens{}",
                        end.usage.input_tokens,
                        end.usage.output_tokens,
                        if end.usage_estimated {
                            " (estimated)"
                        } else {
                            ""
                        }
                    ),
                    _ => eprintln!(
                        "    -> {:?}: {}",
                        end.outcome,
                        end.error.as_deref().unwrap_or("")
                    ),
                }
            }
            _ => {}
        }
    }

    fn on_mcp_server(&self, _execution_id: &str, progress: &McpProgress) {
        if !(self.steps || self.trace) {
            return;
        }
        match progress {
            McpProgress::Starting { server, endpoint } => {
                eprintln!("MCP server `{server}`: starting ({endpoint}) ...");
            }
            McpProgress::Ready {
                server,
                tools,
                elapsed,
            } => eprintln!(
                "MCP server `{server}`: ready in {:.1} s, {} tools ({})",
                elapsed.as_secs_f64(),
                tools.len(),
                tools.join(", ")
            ),
        }
    }

    fn on_delta(&self, _execution_id: &str, _step: u64, delta: &StreamDelta) {
        if self.trace
            && let StreamDelta::Text(text) = delta
        {
            eprint!("{text}");
        }
    }
}
