//! Compaction inside a run: the execution's thread as a compaction target, automatic
//! compaction when an assistant's trigger fires, and the `context_manager` tool.

use contexture_core::compact::{CompactionPolicy, MAX_TIMEOUT_SECS};
use contexture_core::thread::{EventKind, Thread};
use contexture_store::Store;
use serde_json::{Map, Value};

use super::assistant::AssistantSetup;
use super::error::ExecError;
use super::{Executor, Run};
use crate::compaction::{
    CompactRequest, CompactionOutcome, CompactionReport, CompactionTarget, Compactor, LoopView,
};

/// A run's thread, compacted through the executor so its fold stays in step.
struct RunTarget<'a, S> {
    executor: &'a Executor<S>,
    run: &'a mut Run,
}

impl<S: Store> CompactionTarget for RunTarget<'_, S> {
    type Error = ExecError;

    fn thread_id(&self) -> &str {
        &self.run.id
    }

    fn thread(&self) -> &Thread {
        self.run.log.thread()
    }

    async fn append(&mut self, events: Vec<EventKind>) -> Result<(), ExecError> {
        self.executor.append(self.run, events).await
    }
}

impl<S: Store> Executor<S> {
    fn compactor(&self, run: &Run) -> Compactor {
        Compactor::new(self.router.clone(), self.registry.clone()).with_hooks(run.hooks.clone())
    }

    /// Compacts the run's shared history.
    pub(crate) async fn compact_run(
        &self,
        run: &mut Run,
        request: CompactRequest,
    ) -> Result<CompactionReport, ExecError> {
        let compactor = self.compactor(run);
        let mut target = RunTarget {
            executor: self,
            run,
        };
        compactor.compact(&mut target, &request).await
    }

    /// Compacts when the assistant's compaction trigger fires for its next request (its
    /// system prompt, the shared history, the step's `own` loop as requests send it, and its
    /// tools): the shared history first; then, while the trigger still fires, the loop's
    /// older iterations (its task and newest tool uses kept verbatim).
    pub(crate) async fn compact_if_triggered(
        &self,
        run: &mut Run,
        setup: &AssistantSetup<'_>,
        own: &mut LoopView,
    ) -> Result<(), ExecError> {
        let Some(policy) = &setup.assistant.compaction else {
            return Ok(());
        };
        if policy.trigger.is_empty() {
            return Ok(());
        }
        let fires = |run: &Run, own: &LoopView| {
            let projection = run.log.thread().projection();
            let system = setup.system.as_ref().or(projection.system.as_ref());
            policy.trigger.fires_for(
                &setup.model,
                system
                    .into_iter()
                    .chain(&projection.messages)
                    .chain(own.messages()),
                projection.messages.len(),
                &setup.tools,
            )
        };
        let request = |reason: String| {
            let mut request = CompactRequest::new(policy.clone(), reason);
            request.measure_model = setup.model.id.clone();
            request.step = Some(setup.step.info.step);
            request
        };
        let Some(reason) = fires(run, own) else {
            return Ok(());
        };
        // Items of an iteration that run at once share the history as it stood when they
        // started: each compacts only its own loop.
        if run.staging.is_none() {
            self.compact_run(run, request(reason)).await?;
        }
        let Some(reason) = fires(run, own) else {
            return Ok(());
        };
        self.compact_loop(run, own, request(reason)).await?;
        Ok(())
    }

    /// Compacts the older iterations of an assistant's tool loop.
    pub(crate) async fn compact_loop(
        &self,
        run: &mut Run,
        own: &mut LoopView,
        request: CompactRequest,
    ) -> Result<CompactionReport, ExecError> {
        let compactor = self.compactor(run);
        let mut target = RunTarget {
            executor: self,
            run,
        };
        compactor.compact_loop(&mut target, own, &request).await
    }

    /// Runs the `context_manager` tool with `arguments`; the result text says what happened.
    /// It compacts the shared history, and called from an assistant's tool loop (`own`), that
    /// loop's older iterations too (the notes are kept verbatim in whichever it compacts
    /// first).
    pub(crate) async fn context_manager(
        &self,
        run: &mut Run,
        policy: Option<&CompactionPolicy>,
        arguments: &Map<String, Value>,
        measure_model: &str,
        step: u64,
        own: Option<&mut LoopView>,
    ) -> Result<String, String> {
        let notes = match arguments.get("notes") {
            None | Some(Value::Null) => None,
            Some(Value::String(notes)) => Some(notes.clone()),
            Some(other) => Some(other.to_string()),
        };
        let preserve = match arguments.get("is_history_preserved") {
            None | Some(Value::Null) => true,
            Some(Value::Bool(flag)) => *flag,
            Some(other) => {
                return Err(format!(
                    "is_history_preserved must be true or false, not {other}"
                ));
            }
        };
        let extra_history = match arguments.get("history") {
            None | Some(Value::Null) => Vec::new(),
            Some(Value::String(text)) => vec![text.clone()],
            Some(Value::Array(items)) => items
                .iter()
                .map(|item| match item {
                    Value::String(text) => text.clone(),
                    Value::Object(message) => message
                        .get("content")
                        .and_then(Value::as_str)
                        .map_or_else(|| item.to_string(), str::to_owned),
                    other => other.to_string(),
                })
                .collect(),
            Some(other) => {
                return Err(format!(
                    "history must be a string or a list of strings, not {other}"
                ));
            }
        };
        let mut policy = policy.cloned().unwrap_or_default();
        match arguments.get("summarizer") {
            None | Some(Value::Null) => {}
            Some(Value::String(model)) => policy.summarizer = Some(model.clone()),
            Some(other) => return Err(format!("summarizer must be a model id, not {other}")),
        }
        let positive =
            |key: &str| -> Result<Option<u64>, String> {
                match arguments.get(key) {
                    None | Some(Value::Null) => Ok(None),
                    Some(value) => value.as_u64().filter(|n| *n > 0).map(Some).ok_or_else(|| {
                        format!("{key} must be a positive whole number, not {value}")
                    }),
                }
            };
        if let Some(tokens) = positive("keep_tokens")? {
            policy.keep.tokens = Some(tokens);
        }
        if let Some(messages) = positive("keep_messages")? {
            policy.keep.messages = Some(usize::try_from(messages).unwrap_or(usize::MAX));
        }
        if let Some(seconds) = positive("timeout_secs")? {
            if seconds > MAX_TIMEOUT_SECS {
                return Err(format!(
                    "timeout_secs must be at most {MAX_TIMEOUT_SECS}, not {seconds}"
                ));
            }
            policy.timeout_secs = seconds;
        }
        let mut request = CompactRequest::new(policy, "the context_manager tool");
        request.notes = notes;
        request.preserve_history = preserve;
        request.extra_history = extra_history;
        request.measure_model = measure_model.to_owned();
        request.step = Some(step);
        if run.staging.is_some() {
            // The shared history is the other items' too: an item running alongside them
            // compacts its own loop only.
            let Some(own) = own else {
                return Err(SHARED_HISTORY_IN_ITEM.to_owned());
            };
            let in_loop = self
                .compact_loop(run, own, request)
                .await
                .map_err(|error| error.to_string())?;
            return Ok(describe_loop(&in_loop));
        }
        let report = self
            .compact_run(run, request.clone())
            .await
            .map_err(|error| error.to_string())?;
        let Some(own) = own else {
            return Ok(describe(&report));
        };
        // The notes are kept once: in the history when it was compacted, else in the loop.
        if matches!(report.outcome, CompactionOutcome::Compacted { .. }) {
            request.notes = None;
        }
        let in_loop = self
            .compact_loop(run, own, request)
            .await
            .map_err(|error| error.to_string())?;
        Ok(match (&report.outcome, &in_loop.outcome) {
            (_, CompactionOutcome::Skipped { .. }) => describe(&report),
            (CompactionOutcome::Skipped { .. }, _) => describe_loop(&in_loop),
            _ => format!("{} {}", describe(&report), describe_loop(&in_loop)),
        })
    }
}

/// Why an item of an iteration whose items run at once does not compact the shared history.
const SHARED_HISTORY_IN_ITEM: &str = "the shared history is not compacted from an item of an iteration whose items run at once (max_concurrency above 1); compact it before the iteration";

/// What a compaction of a tool loop did, in one line for a model or a log.
pub(crate) fn describe_loop(report: &CompactionReport) -> String {
    match &report.outcome {
        CompactionOutcome::Compacted { .. } => format!(
            "This step's earlier tool calls and results ({} messages) were replaced by {}; the step's messages went from {} to {} tokens.",
            report.covered_messages,
            replaced_by(report),
            report.tokens_before,
            report.tokens_after
        ),
        _ => describe(report),
    }
}

/// What a compaction did, in one line for a model or a log.
pub(crate) fn describe(report: &CompactionReport) -> String {
    match &report.outcome {
        CompactionOutcome::Compacted { .. } => {
            let (from, to) = report.covered.unwrap_or_default();
            format!(
                "Context compacted: {} earlier messages (seqs {from}-{to}) were replaced by {}; the history went from {} to {} tokens.",
                report.covered_messages,
                replaced_by(report),
                report.tokens_before,
                report.tokens_after
            )
        }
        CompactionOutcome::Skipped { reason } => format!("Nothing was compacted: {reason}."),
        CompactionOutcome::Failed { error } => {
            format!("Compaction failed and nothing was replaced: {error}")
        }
    }
}

/// What a compaction put in place of what it covered.
fn replaced_by(report: &CompactionReport) -> &'static str {
    if report.summary.is_some() {
        "a summary"
    } else {
        "the notes"
    }
}
