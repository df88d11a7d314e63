//! Running a compaction: plan it ([`contexture_core::compact`]), summarize
//! the covered part (a model through the router, map-reduce when it exceeds the summarizer's
//! window or the policy's `mapreduce_tokens`; or the offline extractive summarizer), and record the result as one replace event.
//!
//! It is all or nothing: every summarizer call is recorded (`request_started` /
//! `request_ended`, purpose `compaction`), and when the summarizer fails, times out or
//! returns an empty text after every retry, nothing is replaced; a `compaction_failed` event
//! records why and the thread goes on as it was (requests are still fitted by trimming).

use std::sync::Arc;

use contexture_core::Message;
use contexture_core::budget::{BudgetBreakdown, BudgetPolicy};
use contexture_core::compact::{
    CompactionPolicy, DEFAULT_PROMPT, MAX_RETRIES, MAX_TIMEOUT_SECS, Plan, chunk_transcripts,
    extractive_summary, merge_prompt, plan, prompt_hash, replacement, summary_prompt, summary_text,
    transcript,
};
use contexture_core::registry::{ModelInfo, Registry};
use contexture_core::thread::{
    CompactionFailure, ContextReplace, Event, EventKind, ProjectedMessage, Provenance,
    RecordedBudget, ReplaceReason, RequestRecord, StepCompaction, Thread,
};
use contexture_core::tokens::TokenCounter;
use contexture_llm::{ChatRequest, RetryPolicy};
use contexture_store::{NewEvent, Store};

use contexture_core::compact::CompactionInfo;
pub use contexture_core::compact::{CompactionOutcome, CompactionReport};
use contexture_store::StoreError;

use crate::calls::request_end;
use crate::hooks::{Hook, HookFailed, HookPoint};
use crate::llm::Router;

/// Why a compaction could not run to its end (a summarizer that fails is not an error: its
/// compaction ends as [`CompactionOutcome::Failed`], recorded, and nothing is replaced).
#[derive(Debug, thiserror::Error)]
pub enum CompactionError {
    /// The store failed reading or writing the thread.
    #[error(transparent)]
    Store(#[from] StoreError),
    /// A hook before or after the compaction failed.
    #[error(transparent)]
    Hook(#[from] HookFailed),
    /// The summarizer's request does not fit its model's window.
    #[error("the summarizer's request does not fit its model: {0}")]
    Budget(#[source] contexture_core::budget::BudgetError),
}

/// One compaction to run.
#[derive(Debug, Clone, PartialEq)]
pub struct CompactRequest {
    /// What stays verbatim, the summarizer, its prompt and retries.
    pub policy: CompactionPolicy,
    /// Verbatim content kept before the summary, never shown to the summarizer.
    pub notes: Option<String>,
    /// `false` keeps only the notes (and pinned messages): no summary is written.
    pub preserve_history: bool,
    /// More lines for the summarizer to read after the covered messages (the context
    /// manager tool's `history` argument).
    pub extra_history: Vec<String>,
    /// Why it runs (a trigger's reason, `manual`, `tool`), for hooks and the report.
    pub reason: String,
    /// The model whose tokenizer measures the thread before and after.
    pub measure_model: String,
    /// The workflow step it runs in, if any (recorded with the summarizer's calls).
    pub step: Option<u64>,
}

impl CompactRequest {
    /// A compaction under `policy` for `reason`, keeping the history as a summary.
    pub fn new(policy: CompactionPolicy, reason: impl Into<String>) -> CompactRequest {
        CompactRequest {
            policy,
            notes: None,
            preserve_history: true,
            extra_history: Vec::new(),
            reason: reason.into(),
            measure_model: "gpt-4o".to_owned(),
            step: None,
        }
    }
}

/// A caller's changes to a compaction policy for one compaction, and what it keeps besides:
/// what `contexture thread compact` and `POST /v1/threads/{id}/compact` take, turned into a
/// request the same way for both.
#[derive(Debug, Clone, Default)]
pub struct CompactOptions {
    /// The summarizer model (default: the policy's).
    pub summarizer: Option<String>,
    /// Keep at most this many recent tokens verbatim. With `keep_messages`, replaces the
    /// policy's whole `keep` when either is set.
    pub keep_tokens: Option<u64>,
    /// Keep at most this many recent messages verbatim.
    pub keep_messages: Option<usize>,
    /// The summary's length limit, in tokens (default: the policy's).
    pub summary_tokens: Option<u32>,
    /// How often a failed summarizer call is retried (default: the policy's).
    pub max_retries: Option<u32>,
    /// The summarizer's prompt (default: the policy's).
    pub prompt: Option<String>,
    /// The seconds one summarizer call may take (default: the policy's).
    pub timeout_secs: Option<u64>,
    /// Verbatim content kept before the summary, never shown to the summarizer.
    pub notes: Option<String>,
    /// `Some(false)` keeps only the notes (default: the history is summarized).
    pub preserve_history: Option<bool>,
    /// The model whose tokenizer measures before and after (default gpt-4o).
    pub measure_model: Option<String>,
}

/// A compaction setting that cannot be used.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("invalid compaction settings ({field}): {problem}")]
pub struct InvalidCompaction {
    /// The setting.
    pub field: &'static str,
    /// What is wrong with it.
    pub problem: String,
}

impl CompactOptions {
    /// The compaction `policy` changed by these options, checked, as a request for `reason`.
    pub fn request(
        self,
        mut policy: CompactionPolicy,
        reason: impl Into<String>,
    ) -> Result<CompactRequest, InvalidCompaction> {
        if self.summarizer.is_some() {
            policy.summarizer = self.summarizer;
        }
        if self.keep_tokens.is_some() || self.keep_messages.is_some() {
            policy.keep.tokens = self.keep_tokens;
            policy.keep.messages = self.keep_messages;
        }
        if let Some(tokens) = self.summary_tokens {
            policy.summary_tokens = tokens;
        }
        if let Some(retries) = self.max_retries {
            policy.max_retries = retries;
        }
        if self.prompt.is_some() {
            policy.prompt = self.prompt;
        }
        if let Some(seconds) = self.timeout_secs {
            policy.timeout_secs = seconds;
        }
        if let Some((field, problem)) = policy.problems().into_iter().next() {
            return Err(InvalidCompaction { field, problem });
        }
        let mut request = CompactRequest::new(policy, reason);
        request.notes = self.notes;
        request.preserve_history = self.preserve_history.unwrap_or(true);
        if let Some(model) = self.measure_model {
            request.measure_model = model;
        }
        Ok(request)
    }
}

/// An assistant's own tool loop as its requests send it: its own messages (its task first,
/// then its log: tool calls and results), the first `covered` of which an earlier compaction's
/// replacement stands for.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct LoopView {
    own: Vec<Message>,
    covered: usize,
    replacement: Vec<Message>,
    view: Vec<Message>,
}

impl LoopView {
    /// A loop that starts with `messages` (its task, when it has one).
    pub fn new(messages: Vec<Message>) -> LoopView {
        LoopView {
            view: messages.clone(),
            own: messages,
            covered: 0,
            replacement: Vec::new(),
        }
    }

    /// Adds the loop's next message.
    pub fn push(&mut self, message: Message) {
        self.own.push(message.clone());
        self.view.push(message);
    }

    /// Every message of the loop, as its log holds them.
    pub fn own(&self) -> &[Message] {
        &self.own
    }

    /// What requests send of the loop: the replacement, then the messages it does not cover.
    pub fn messages(&self) -> &[Message] {
        &self.view
    }

    /// The messages that stand for the part an earlier compaction covered (none before
    /// one).
    pub fn replacement(&self) -> &[Message] {
        &self.replacement
    }

    /// The tokens of what requests send of the loop.
    pub fn tokens(&self, counter: &TokenCounter) -> u64 {
        self.view
            .iter()
            .map(|message| u64::from(counter.count_message(message)))
            .sum()
    }

    /// `replacement` stands for the first `end` messages of the view from now on.
    fn cut(&mut self, end: usize, replacement: Vec<Message>) {
        // The view's first messages are the earlier replacement, which stood for `covered`.
        self.covered += end.saturating_sub(self.replacement.len());
        self.replacement = replacement;
        self.view = self.replacement.clone();
        self.view.extend_from_slice(&self.own[self.covered..]);
    }
}

/// A thread a compaction works on: it reads the thread and appends events to it.
pub trait CompactionTarget: Send {
    /// The thread's id.
    fn thread_id(&self) -> &str;
    /// The thread as it is now.
    fn thread(&self) -> &Thread;
    /// What goes wrong: the target's own errors, which a compaction's own (its store's and
    /// hooks' among them) convert into.
    type Error: From<CompactionError> + From<StoreError> + From<HookFailed> + Send;
    /// Appends events in one transaction (and folds them into [`CompactionTarget::thread`]).
    fn append(
        &mut self,
        events: Vec<EventKind>,
    ) -> impl Future<Output = Result<(), Self::Error>> + Send;
}

/// A stored thread as a compaction target.
pub struct StoredThread<'s, S> {
    store: &'s S,
    id: String,
    thread: Thread,
}

impl<'s, S: Store> StoredThread<'s, S> {
    /// Loads `id` from `store`.
    pub async fn load(store: &'s S, id: &str) -> Result<StoredThread<'s, S>, CompactionError> {
        let thread = store.load(id).await?;
        Ok(StoredThread {
            store,
            id: id.to_owned(),
            thread,
        })
    }

    /// The thread as it is now.
    pub fn into_thread(self) -> Thread {
        self.thread
    }
}

/// A compaction target nothing stores: messages a stateless client sent, compacted in
/// memory (the summarizer's calls are folded into a thread no one keeps).
struct UnstoredLoop {
    thread: Thread,
}

impl CompactionTarget for UnstoredLoop {
    type Error = CompactionError;

    fn thread_id(&self) -> &str {
        self.thread.id()
    }

    fn thread(&self) -> &Thread {
        &self.thread
    }

    async fn append(&mut self, events: Vec<EventKind>) -> Result<(), CompactionError> {
        for kind in events {
            let seq = self.thread.last_seq() + 1;
            self.thread
                .apply(Event::new(seq, kind))
                .map_err(|source| CompactionError::Store(thread_error("unstored", source)))?;
        }
        Ok(())
    }
}

/// Compacts `messages` (a stateless client's window: its task first) as `request` asks,
/// storing nothing: the loop after it (its [`LoopView::replacement`], then the messages it
/// does not cover, in [`LoopView::messages`]) and the report. A summarizer that fails
/// leaves the messages as they were, the report saying why.
pub async fn compact_unstored(
    compactor: &Compactor,
    messages: Vec<Message>,
    request: &CompactRequest,
) -> Result<(LoopView, CompactionReport), CompactionError> {
    let mut target = UnstoredLoop {
        thread: Thread::new("unstored"),
    };
    let mut view = LoopView::new(messages);
    let report = compactor
        .compact_loop(&mut target, &mut view, request)
        .await?;
    Ok((view, report))
}

impl<S: Store> CompactionTarget for StoredThread<'_, S> {
    type Error = CompactionError;

    fn thread_id(&self) -> &str {
        &self.id
    }

    fn thread(&self) -> &Thread {
        &self.thread
    }

    async fn append(&mut self, events: Vec<EventKind>) -> Result<(), CompactionError> {
        let seqs = self
            .store
            .append(
                &self.id,
                events.iter().cloned().map(NewEvent::new).collect(),
            )
            .await?;
        let follows = seqs
            .iter()
            .enumerate()
            .all(|(n, seq)| *seq == self.thread.last_seq() + 1 + n as u64);
        if follows {
            for (seq, kind) in seqs.into_iter().zip(events) {
                self.thread
                    .apply(Event::new(seq, kind))
                    .map_err(|source| CompactionError::Store(thread_error(&self.id, source)))?;
            }
        } else {
            // Another writer appended in between: read the thread again.
            self.thread = self.store.load(&self.id).await?;
        }
        Ok(())
    }
}

fn thread_error(
    id: &str,
    source: contexture_core::thread::ThreadError,
) -> contexture_store::StoreError {
    contexture_store::StoreError::Replay {
        thread: id.to_owned(),
        source,
    }
}

/// Runs compactions: summarizer calls go where the router says.
#[derive(Clone)]
pub struct Compactor {
    router: Arc<dyn Router>,
    registry: Arc<Registry>,
    hooks: Vec<Arc<dyn Hook>>,
}

/// Why a summary could not be written.
struct SummaryFailed {
    error: String,
    attempts: u32,
}

impl Compactor {
    /// Tells every hook that a compaction ran; the first that fails stops the chain.
    fn after_compaction(
        &self,
        info: &CompactionInfo,
        report: &CompactionReport,
    ) -> Result<(), HookFailed> {
        for hook in &self.hooks {
            hook.after_compaction(info, report)
                .map_err(|error| HookFailed::new(&**hook, HookPoint::AfterCompaction, error))?;
        }
        Ok(())
    }

    /// A compactor whose summarizer calls go through `router`, with models from `registry`.
    pub fn new(router: Arc<dyn Router>, registry: Arc<Registry>) -> Compactor {
        Compactor {
            router,
            registry,
            hooks: Vec::new(),
        }
    }

    /// A compactor with no model to call: only the offline extractive summarizer
    /// ([`CompactOptions::summarizer`] `None`); a request that names a summarizer model
    /// fails its call and replaces nothing.
    pub fn offline(registry: Arc<Registry>) -> Compactor {
        let nobody: Arc<dyn contexture_llm::Provider> =
            Arc::new(contexture_llm::ScriptedProvider::texts(Vec::<String>::new()));
        Compactor::new(Arc::new(crate::llm::FixedRouter::new(nobody)), registry)
    }

    /// Builder: the hooks told before and after each compaction.
    pub fn with_hooks(mut self, hooks: Vec<Arc<dyn Hook>>) -> Compactor {
        self.hooks = hooks;
        self
    }

    /// Compacts the target's active context as `request` says.
    pub async fn compact<T: CompactionTarget>(
        &self,
        target: &mut T,
        request: &CompactRequest,
    ) -> Result<CompactionReport, T::Error> {
        let policy = &request.policy;
        let counter = self.registry.resolve(&request.measure_model).counter;
        let projected = target.thread().projected_messages();
        let tokens_before = projection_tokens(target.thread(), &counter);
        let mut report = CompactionReport::new(tokens_before, policy);
        let Some((plan, info, messages)) = self
            .plan_and_write(target, None, &projected, request, &counter, &mut report)
            .await?
        else {
            return Ok(report);
        };
        let template = policy.prompt.as_deref().unwrap_or(DEFAULT_PROMPT);
        let op = ContextReplace {
            op_id: format!(
                "{}/compaction-{}",
                target.thread_id(),
                target.thread().last_seq() + 1
            ),
            context: target.thread().active_context().to_owned(),
            reason: ReplaceReason::Compaction,
            from_seq: plan.from_seq,
            to_seq: plan.to_seq,
            replacement: messages,
            provenance: Some(Provenance {
                summarizer_model: Some(policy.summarizer_name().to_owned()),
                prompt_hash: policy.summarizer.as_ref().map(|_| prompt_hash(template)),
                snapshot_seq: None,
            }),
        };
        target.append(vec![EventKind::ContextReplaced(op)]).await?;
        report.outcome = CompactionOutcome::Compacted {
            replace_seq: target.thread().last_seq(),
            queued: target.thread().in_flight().is_some(),
        };
        report.tokens_after = projection_tokens(target.thread(), &counter);
        self.after_compaction(&info, &report)?;
        Ok(report)
    }

    /// Compacts an assistant's own tool loop in step `request.step`: `view` is what its
    /// requests send of it (its task, or an earlier compaction's replacement, then its newer
    /// messages), planned as a thread's messages are (the task is the original request, kept
    /// verbatim; the newest whole tool uses within the policy's `keep` stay; notes kept
    /// verbatim), summarized the same way, and recorded as one `step_compacted` event; `view`
    /// then sends the replacement in place of what it covers. The summarizer's calls are
    /// recorded in the target's thread; a failure records a `compaction_failed` event for the
    /// step and leaves `view` as it was.
    pub async fn compact_loop<T: CompactionTarget>(
        &self,
        target: &mut T,
        view: &mut LoopView,
        request: &CompactRequest,
    ) -> Result<CompactionReport, T::Error> {
        let counter = self.registry.resolve(&request.measure_model).counter;
        // Each message of the loop stands for itself: positions from 1 take the place of seqs.
        let projected: Vec<ProjectedMessage> = view
            .messages()
            .iter()
            .enumerate()
            .map(|(index, message)| ProjectedMessage {
                from_seq: index as u64 + 1,
                to_seq: index as u64 + 1,
                message: message.clone(),
            })
            .collect();
        let mut report = CompactionReport::new(view.tokens(&counter), &request.policy);
        let step = request.step.unwrap_or_default();
        let Some((plan, info, replacement)) = self
            .plan_and_write(
                target,
                Some(step),
                &projected,
                request,
                &counter,
                &mut report,
            )
            .await?
        else {
            return Ok(report);
        };
        view.cut(plan.covered.end, replacement);
        report.tokens_after = view.tokens(&counter);
        target
            .append(vec![EventKind::StepCompacted(StepCompaction {
                step,
                covered: view.covered,
                replacement: view.replacement.clone(),
                summarizer: request.policy.summarizer_name().to_owned(),
                tokens_before: report.tokens_before,
                tokens_after: report.tokens_after,
            })])
            .await?;
        report.outcome = CompactionOutcome::Compacted {
            replace_seq: target.thread().last_seq(),
            queued: false,
        };
        self.after_compaction(&info, &report)?;
        Ok(report)
    }

    /// What `request` covers of `projected` (the target's messages, or with `loop_step`
    /// that step's own loop), what hooks are told of it, and the messages that stand for it
    /// ([`Compactor::write`]); `None` (and the report says why) when nothing is covered, a
    /// hook declined or the summarizer failed. The one step both compactions share.
    async fn plan_and_write<T: CompactionTarget>(
        &self,
        target: &mut T,
        loop_step: Option<u64>,
        projected: &[ProjectedMessage],
        request: &CompactRequest,
        counter: &TokenCounter,
        report: &mut CompactionReport,
    ) -> Result<Option<(Plan, CompactionInfo, Vec<Message>)>, T::Error> {
        let Some(plan) = plan(projected, &request.policy.keep, counter) else {
            report.outcome = CompactionOutcome::Skipped {
                reason: "nothing older than the kept tail to summarize".to_owned(),
            };
            return Ok(None);
        };
        report.covered = Some((plan.from_seq, plan.to_seq));
        report.covered_messages = plan.covered.len();
        let info = CompactionInfo {
            thread_id: target.thread_id().to_owned(),
            reason: request.reason.clone(),
            from_seq: plan.from_seq,
            to_seq: plan.to_seq,
            covered_messages: plan.covered.len(),
            loop_step,
        };
        let written = self
            .write(target, &plan, projected, request, &info, report)
            .await?;
        Ok(written.map(|messages| (plan, info, messages)))
    }

    /// The messages that stand for `plan`'s covered part: after the hooks agreed, the
    /// summary written (or the notes alone), or `None` when a hook declined (the report says
    /// so) or the summarizer failed (a `compaction_failed` event records why, and the report).
    async fn write<T: CompactionTarget>(
        &self,
        target: &mut T,
        plan: &Plan,
        projected: &[ProjectedMessage],
        request: &CompactRequest,
        info: &CompactionInfo,
        report: &mut CompactionReport,
    ) -> Result<Option<Vec<Message>>, T::Error> {
        let policy = &request.policy;
        let counter = self.registry.resolve(&request.measure_model).counter;
        for hook in &self.hooks {
            let goes_on = hook
                .before_compaction(info)
                .map_err(|error| HookFailed::new(&**hook, HookPoint::BeforeCompaction, error))?;
            if !goes_on {
                report.outcome = CompactionOutcome::Skipped {
                    reason: format!("hook `{}` declined it", hook.name()),
                };
                return Ok(None);
            }
        }
        let summary = if !request.preserve_history {
            None
        } else {
            match &policy.summarizer {
                None => Some(self.extractive(plan, projected, request, &counter)),
                Some(model) => {
                    match self
                        .summarize(target, model, plan, projected, request, report)
                        .await?
                    {
                        Ok(summary) => Some(summary),
                        Err(failed) => {
                            target
                                .append(vec![EventKind::CompactionFailed(CompactionFailure {
                                    from_seq: plan.from_seq,
                                    to_seq: plan.to_seq,
                                    step: info.loop_step,
                                    summarizer: model.clone(),
                                    error: failed.error.clone(),
                                    attempts: failed.attempts,
                                })])
                                .await?;
                            report.outcome = CompactionOutcome::Failed {
                                error: failed.error,
                            };
                            self.after_compaction(info, report)?;
                            return Ok(None);
                        }
                    }
                }
            }
        };
        let messages = replacement(
            plan,
            projected,
            summary.as_deref(),
            request.notes.as_deref(),
        );
        report.summary = summary;
        Ok(Some(messages))
    }

    /// The offline summary: an earlier summary carried over (within half the budget), then
    /// the extract of the newer messages.
    fn extractive(
        &self,
        plan: &Plan,
        projected: &[ProjectedMessage],
        request: &CompactRequest,
        counter: &TokenCounter,
    ) -> String {
        let budget = request.policy.summary_tokens;
        let messages = covered_messages(plan, projected, request);
        let refs: Vec<&Message> = messages.iter().collect();
        match plan.previous_summary {
            None => extractive_summary(&refs, budget, counter),
            Some(index) => {
                let previous = summary_text(&projected[index].message);
                let previous = contexture_core::compact::cut_to_fit(&previous, budget / 2, counter);
                let used = counter.count_text(&previous) + 2;
                let newer = extractive_summary(&refs, budget.saturating_sub(used), counter);
                format!("{previous}\n\n{newer}")
            }
        }
    }

    /// Summarizes with `model`: in one call when the covered part fits its window (and the
    /// policy's `mapreduce_tokens`), else by map-reduce. `Ok(Err(..))` when the summarizer failed.
    async fn summarize<T: CompactionTarget>(
        &self,
        target: &mut T,
        model: &str,
        plan: &Plan,
        projected: &[ProjectedMessage],
        request: &CompactRequest,
        report: &mut CompactionReport,
    ) -> Result<Result<String, SummaryFailed>, T::Error> {
        let policy = &request.policy;
        let info = self.registry.resolve(model);
        let counter = info.counter;
        let template = policy.prompt.as_deref().unwrap_or(DEFAULT_PROMPT);
        let previous = plan
            .previous_summary
            .map(|i| summary_text(&projected[i].message));
        let messages = covered_messages(plan, projected, request);
        let refs: Vec<&Message> = messages.iter().collect();
        // What one call may spend on the transcript: the window, less the summary's room, the
        // prompt around the transcript and the chat overhead.
        let room = |previous: Option<&str>| -> u32 {
            let overhead = counter.count_text(&summary_prompt(template, "", previous)) + 16;
            info.context_window
                .saturating_sub(policy.summary_tokens)
                .saturating_sub(overhead)
        };
        // The policy's map-reduce threshold bounds one call's transcript below the window.
        let threshold = |room: u32| {
            policy.mapreduce_tokens.map_or(room, |tokens| {
                room.min(u32::try_from(tokens).unwrap_or(u32::MAX))
            })
        };
        let whole = transcript(&refs);
        if counter.count_text(&whole) <= threshold(room(previous.as_deref())) {
            let prompt = summary_prompt(template, &whole, previous.as_deref());
            return self
                .call(target, model, &info, prompt, request, report)
                .await;
        }
        // Map: each chunk summarized on its own.
        let limit = threshold(room(None));
        if limit < 64 {
            return Ok(Err(SummaryFailed {
                error: format!(
                    "the summarizer `{model}` has a {}-token window: too small for a prompt and a {}-token summary",
                    info.context_window, policy.summary_tokens
                ),
                attempts: 0,
            }));
        }
        let mut partials: Vec<String> = previous.into_iter().collect();
        for chunk in chunk_transcripts(&refs, limit, &counter) {
            let prompt = summary_prompt(template, &chunk, None);
            match self
                .call(target, model, &info, prompt, request, report)
                .await?
            {
                Ok(summary) => partials.push(summary),
                Err(failed) => return Ok(Err(failed)),
            }
        }
        // Reduce: merge the partial summaries, in groups that fit, until one is left.
        let merge_room = info.context_window.saturating_sub(policy.summary_tokens);
        while partials.len() > 1 {
            let mut groups: Vec<Vec<String>> = vec![Vec::new()];
            for partial in partials {
                let partial =
                    contexture_core::compact::cut_to_fit(&partial, merge_room / 2, &counter);
                let mut candidate = groups.last().cloned().unwrap_or_default();
                candidate.push(partial.clone());
                if groups.last().is_some_and(|g| !g.is_empty())
                    && counter.count_text(&merge_prompt(&candidate)) + 16 > merge_room
                {
                    groups.push(vec![partial]);
                } else if let Some(group) = groups.last_mut() {
                    group.push(partial);
                }
            }
            let mut merged = Vec::new();
            for group in groups {
                if group.len() == 1 {
                    merged.extend(group);
                    continue;
                }
                let prompt = merge_prompt(&group);
                match self
                    .call(target, model, &info, prompt, request, report)
                    .await?
                {
                    Ok(summary) => merged.push(summary),
                    Err(failed) => return Ok(Err(failed)),
                }
            }
            partials = merged;
        }
        Ok(Ok(partials.pop().unwrap_or_default()))
    }

    /// One summarizer call with its retries, each attempt recorded. An empty reply counts as
    /// a failure.
    async fn call<T: CompactionTarget>(
        &self,
        target: &mut T,
        model: &str,
        info: &ModelInfo,
        prompt: String,
        request: &CompactRequest,
        report: &mut CompactionReport,
    ) -> Result<Result<String, SummaryFailed>, T::Error> {
        let route = self.router.route(model);
        let messages = vec![Message::user(prompt)];
        let policy = BudgetPolicy {
            budget_ratio: 1.0,
            reserve_output: Some(request.policy.summary_tokens),
        };
        let breakdown = BudgetBreakdown::compute(info, &policy, &messages, &[])
            .map_err(|error| T::Error::from(CompactionError::Budget(error)))?;
        let mut last_error = String::new();
        // A policy stored before the bound was checked is held to it too.
        let attempts = request.policy.max_retries.min(MAX_RETRIES) + 1;
        for attempt in 0..attempts {
            if attempt > 0 {
                tokio::time::sleep(SUMMARY_RETRIES.backoff(attempt - 1)).await;
            }
            report.calls += 1;
            let request_id = format!(
                "{}/compaction-{}/call-{}",
                target.thread_id(),
                target.thread().last_seq() + 1,
                report.calls
            );
            target
                .append(vec![EventKind::RequestStarted(RequestRecord {
                    request_id: request_id.clone(),
                    model: Some(route.model.clone()),
                    messages: messages.clone(),
                    budget: Some(RecordedBudget {
                        context_window: info.context_window,
                        max_output_tokens: request.policy.summary_tokens,
                        input_tokens: breakdown.used,
                    }),
                    step: request.step,
                    tools: Vec::new(),
                    breakdown: Some(breakdown.clone()),
                    fit: None,
                    purpose: Some("compaction".to_owned()),
                    client_digest: None,
                    pruned: None,
                    input_from: None,
                    client: None,
                    reasoning_not_sent: None,
                })])
                .await?;
            let mut chat = ChatRequest::new(route.model.clone(), messages.clone());
            chat.max_tokens = Some(request.policy.summary_tokens);
            // A policy stored before the bound was checked is held to it too.
            chat.timeout = Some(std::time::Duration::from_secs(
                request.policy.timeout_secs.clamp(1, MAX_TIMEOUT_SECS),
            ));
            let response = route.provider.complete(&chat).await;
            let mut end = request_end(&request_id, &response, info, breakdown.used);
            let text = response
                .as_ref()
                .ok()
                .map(|r| r.message.text().trim().to_owned());
            if text.as_deref() == Some("") {
                end.error = Some("the summarizer returned an empty text".to_owned());
            }
            target
                .append(vec![EventKind::RequestEnded(end.clone())])
                .await?;
            match text {
                Some(text) if !text.is_empty() => return Ok(Ok(text)),
                _ => {
                    last_error = end
                        .error
                        .unwrap_or_else(|| "the summarizer returned nothing".to_owned())
                }
            }
        }
        Ok(Err(SummaryFailed {
            error: format!("{last_error} (after {attempts} attempts)"),
            attempts,
        }))
    }
}

/// The waits between a summarizer's attempts: doubling from a tenth of a second up to 1.6 s,
/// so a failing summarizer is not called again at once (how many there are is the policy's).
const SUMMARY_RETRIES: RetryPolicy = RetryPolicy {
    max_retries: MAX_RETRIES,
    initial_delay: std::time::Duration::from_millis(100),
    max_delay: std::time::Duration::from_millis(1600),
};

/// The tokens of a thread's projection: its system prompt and messages.
fn projection_tokens(thread: &Thread, counter: &TokenCounter) -> u64 {
    thread
        .projection()
        .to_messages()
        .iter()
        .map(|m| u64::from(counter.count_message(m)))
        .sum()
}

/// Compacts the stored thread `thread_id` (a convenience over [`StoredThread`]).
pub async fn compact_stored<S: Store>(
    compactor: &Compactor,
    store: &S,
    thread_id: &str,
    request: &CompactRequest,
) -> Result<CompactionReport, CompactionError> {
    let mut target = StoredThread::load(store, thread_id).await?;
    compactor.compact(&mut target, request).await
}

/// What a compaction summarizes: the covered messages, then the request's extra history as
/// user lines.
fn covered_messages(
    plan: &Plan,
    projected: &[ProjectedMessage],
    request: &CompactRequest,
) -> Vec<Message> {
    plan.to_summarize
        .iter()
        .map(|&i| projected[i].message.clone())
        .chain(request.extra_history.iter().map(Message::user))
        .collect()
}
