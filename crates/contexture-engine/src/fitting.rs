//! Fitting: the one way a request's messages are fitted to a model's window, whoever asks
//! (a workflow step, the chat endpoint's turn, a thread read for a model through the API
//! or the command line).
//!
//! [`fit_request`] fits a system prompt, a history and the request's own messages (kept
//! whole) for a [`FitTarget`]: trimmed by the strategy, repaired and validated for the
//! model's rules, counted. [`FitSettings`] is what a thread read for a model chooses (the
//! model, its budget policy, the strategy; the rules follow from the model), and reads a
//! stored thread for it: only its tail when the strategy keeps the newest history.

use contexture_core::budget::{BudgetBreakdown, BudgetError, BudgetPolicy, Limits};
use contexture_core::fit::units::last_units_start;
use contexture_core::fit::{
    self, ClearPolicy, ClearedThinking, CutMemory, FitPolicy, Hysteresis, RequestParts,
    ShrinkPolicy, Strategy, SystemRole, ThinkingPolicy, TrimError, TrimOptions, TruncatePolicy,
    Violation, clear_thinking, place_system_prompt, reasoning_turns, repair, shrink, trim,
    validate,
};
use contexture_core::message::{Content, Part};
use contexture_core::registry::{ModelInfo, Registry, RegistryError};
use contexture_core::thread::{FitRecord, Projection, UnknownContext};
use contexture_core::{Encoding, Message, Role};
use contexture_store::{ProjectionTail, Store, StoreError};
use serde_json::Value;

/// Why a client's reply budget cannot be reserved.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum ReplyReserveError {
    /// The model cannot answer with that many tokens.
    #[error("{tokens} is more than model `{model}` can answer with (at most {most} tokens)")]
    OutOfRange {
        /// Tokens asked for.
        tokens: u64,
        /// The model.
        model: String,
        /// The most it can answer with.
        most: u64,
    },
    /// With that reserve, the budget policy does not work for the model.
    #[error(transparent)]
    Budget(#[from] BudgetError),
}

/// Why a request cannot be fitted.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum FitError {
    /// The budget policy does not work for the model (for example a reserve larger than
    /// the window).
    #[error(transparent)]
    Budget(#[from] BudgetError),
    /// What must be kept (the system prompt, the request's own messages, the tools) does
    /// not fit the budget.
    #[error("the request cannot fit the model's window: {0}")]
    Trim(TrimError),
    /// Fitting is off (`enabled: false`) and the request as it is does not fit the model's
    /// window: it is not sent.
    #[error(
        "fitting is off (`context.enabled: false`) and the request needs {tokens} tokens, over the {limit} that model `{model}`'s {window}-token window leaves after {reserve} reserved for the reply; it was not sent (turn fitting on, or compact the history)"
    )]
    OverWindow {
        /// The model.
        model: String,
        /// The request's tokens.
        tokens: u64,
        /// What the window leaves for the request.
        limit: u32,
        /// The model's window.
        window: u32,
        /// The tokens reserved for the reply.
        reserve: u32,
    },
    /// The fitted messages break the model's rules (only possible for a history that
    /// repair cannot mend).
    #[error("the fitted messages break the provider's rules: {}", violations.iter().map(ToString::to_string).collect::<Vec<_>>().join("; "))]
    Invalid {
        /// What is wrong.
        violations: Vec<Violation>,
    },
}

/// What one request is fitted for.
#[derive(Debug, Clone)]
pub struct FitTarget<'a> {
    /// `false` sends the history as it is (fitting is off: see [`FitPolicy::enabled`]).
    pub enabled: bool,
    /// The model (window, tokenizer, prices).
    pub model: &'a ModelInfo,
    /// The share of the window and the reply reserve.
    pub policy: &'a BudgetPolicy,
    /// Which history messages trimming keeps.
    pub strategy: Strategy,
    /// Whose message rules the request follows.
    pub rules: fit::Rules,
    /// The tool schemas sent.
    pub tools: &'a [Value],
    /// Old tool results cleared once the request passes a number of tokens.
    pub clear: Option<&'a ClearPolicy>,
    /// Tool results cut to their start and end past a number of tokens.
    pub truncate: Option<&'a TruncatePolicy>,
    /// Cut from a high mark down to a low one, what was cut kept cut in a loop's next calls.
    pub hysteresis: Option<&'a Hysteresis>,
    /// The reasoning of older assistant turns left out.
    pub thinking: Option<ThinkingPolicy>,
    /// How the kept history is shaped beyond the strategy (`None`: the defaults).
    pub shape: Option<&'a HistoryShape>,
}

/// How trimming shapes the kept history beyond its strategy: choices one call may make
/// (`contexture fit`'s flags); every request of a workflow or a thread keeps the defaults.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HistoryShape {
    /// Keep the system prompt whatever the budget (default); `false` lets it be dropped
    /// like any other message.
    pub keep_system: bool,
    /// The roles the kept history may start with (after the system prompt); empty: any.
    pub start_on: Vec<Role>,
    /// The roles the kept history may end with; empty: any.
    pub end_on: Vec<Role>,
    /// Use leftover budget for part of one more message, cut at line breaks.
    pub allow_partial: bool,
}

impl Default for HistoryShape {
    fn default() -> HistoryShape {
        HistoryShape {
            keep_system: true,
            start_on: Vec::new(),
            end_on: Vec::new(),
            allow_partial: false,
        }
    }
}

/// A request ready to send.
#[derive(Debug, Clone)]
pub struct FittedRequest {
    /// The messages, system prompt first.
    pub messages: Vec<Message>,
    /// The window arithmetic.
    pub limits: Limits,
    /// The request's tokens part by part.
    pub breakdown: BudgetBreakdown,
    /// What trimming left out.
    pub fit: FitRecord,
    /// How trimming went, beyond what a thread records of it.
    pub trim: TrimSummary,
}

/// How the trimming of one request went, beyond its [`FitRecord`].
#[derive(Debug, Clone, Default, PartialEq)]
pub struct TrimSummary {
    /// True when the request was over its limit and history was left out for it.
    pub over_budget: bool,
    /// The index in the unfitted request of the message kept only in part
    /// ([`HistoryShape::allow_partial`]).
    pub partial: Option<usize>,
    /// The position of the marker the head-tail strategy puts where history was left out,
    /// among the fitted messages before the system prompt is placed for the model.
    pub marker: Option<usize>,
    /// A lower bound of the request's tokens before fitting, when not all of it was
    /// counted (what was left out unread is not).
    pub tokens_before_at_least: u64,
    /// Changes made to the kept history for the provider's rules after the cut; indexes
    /// refer to the kept list before those changes.
    pub repairs: Vec<fit::RepairChange>,
}

/// Fits `system + history + own` to `target`: the one fitting every request goes through
/// (a workflow step's, a chat turn's, a thread read for a model). Tool results past the
/// target's truncation limit are cut to their start and end, then old tool results are
/// cleared when the request passes the clearing trigger (the request's own tool loop
/// included); then the request's own messages are kept whole and the history is trimmed
/// by the strategy. The result passed the provider-rule validator.
pub fn fit_request(
    system: Option<&Message>,
    history: Vec<Message>,
    own: &[Message],
    target: &FitTarget<'_>,
) -> Result<FittedRequest, FitError> {
    fit_request_in_loop(system, history, own, target, &mut CutMemory::default())
}

/// [`fit_request`] for one call of a loop (an assistant's tool loop): what `memory` says the
/// loop's earlier calls cut is cut again first, and with the target's hysteresis, a request
/// past the high mark is cut down to the low one; `memory` then holds what this call cut.
pub fn fit_request_in_loop(
    system: Option<&Message>,
    history: Vec<Message>,
    own: &[Message],
    target: &FitTarget<'_>,
    memory: &mut CutMemory,
) -> Result<FittedRequest, FitError> {
    if !target.enabled {
        return unfitted_request(system, history, own, target);
    }
    let limits = target.policy.limits(target.model)?;
    let counter = &target.model.counter;
    let mut history = history;
    let own_cleared: Vec<Message>;
    let (own, cleared_thinking) = match target.thinking {
        Some(policy) => {
            // The newest turns are the request's own: the history keeps what they leave.
            let in_own = reasoning_turns(own);
            let mut cleared = clear_thinking(
                &mut history,
                ThinkingPolicy {
                    keep_turns: policy.keep_turns.saturating_sub(in_own),
                },
                counter,
            );
            let own = if in_own > policy.keep_turns {
                let mut copy = own.to_vec();
                let more = clear_thinking(&mut copy, policy, counter);
                cleared.turns += more.turns;
                cleared.tokens += more.tokens;
                own_cleared = copy;
                &own_cleared[..]
            } else {
                own
            };
            (own, (!cleared.is_empty()).then_some(cleared))
        }
        None => (own, None),
    };
    let tools_tokens = counter.count_tools(target.tools);
    let system_role = target.model.system_role;
    // A model that reads its system prompt in both places gets it twice: the second copy
    // is set aside before anything is fitted.
    let doubled = match (system_role, system) {
        (SystemRole::Both, Some(system)) => counter.count_message(system),
        _ => 0,
    };
    let limit = limits.limit.saturating_sub(doubled);
    let policy = ShrinkPolicy {
        truncate: target.truncate,
        clear: target.clear,
        hysteresis: target.hysteresis,
        history_oldest_first: target.strategy == Strategy::Last,
    };
    // Counted in place (once; the counts are cached in the messages), so that the copies
    // fitting makes carry the counts instead of counting again on every call of a loop.
    for message in system.into_iter().chain(&history).chain(own) {
        counter.count_message(message);
    }
    let request = RequestParts {
        system,
        history: &history,
        own,
        limit,
        tools_tokens,
    };
    let shrunk = shrink(&request, &policy, memory, counter);
    let system_len = usize::from(system.is_some());
    let history_dropped = shrunk.history_dropped;
    // Indexes in the request as it was before anything was left out.
    let unfitted = |index: usize| {
        if index < system_len {
            index
        } else {
            index + history_dropped
        }
    };
    let truncated = shrunk.truncated;
    let cleared: Vec<_> = shrunk
        .cleared
        .into_iter()
        .map(|mut result| {
            result.index = unfitted(result.index);
            result
        })
        .collect();
    // The request's own messages (a step's task and tool loop, a chat turn's new messages)
    // are kept whole: the system prompt and the history are trimmed to what they leave.
    let mut messages = shrunk.messages;
    // A unit is never split: results among the request's own messages (a chat turn's, which
    // answer the history's last calls) keep the turn that called them, and its other results.
    let mut from = shrunk.own_from;
    if messages
        .get(from)
        .is_some_and(|message| message.role == Role::Tool)
    {
        while from > system_len && messages[from - 1].role == Role::Tool {
            from -= 1;
        }
        if from > system_len && messages[from - 1].role == Role::Assistant {
            from -= 1;
        }
    }
    // The head is moved out and the trimmed head put back in front: the own part (a long
    // loop's hundreds of messages) stays in the one list the request is sent from, never
    // copied into another.
    let head: Vec<Message> = messages.drain(..from).collect();
    let own_tokens: u64 = messages
        .iter()
        .map(|message| u64::from(counter.count_message(message)))
        .sum();
    let shape = target.shape.cloned().unwrap_or_default();
    let options = TrimOptions {
        tools_tokens,
        strategy: target.strategy,
        rules: target.rules,
        keep_system: shape.keep_system,
        start_on: shape.start_on,
        end_on: shape.end_on,
        allow_partial: shape.allow_partial,
        ..TrimOptions::new(u32::try_from(u64::from(limit).saturating_sub(own_tokens)).unwrap_or(0))
    };
    // Consecutive turns of one role (the run's input, then an earlier step's task) are merged
    // first where the provider requires alternation: trimming expects a valid history.
    let (head, repairs) = repair(head, target.rules);
    let trimmed = trim(&head, &options, counter).map_err(|error| {
        FitError::Trim(match error {
            TrimError::FixedTooLarge { required, .. } => TrimError::FixedTooLarge {
                required: required + own_tokens + u64::from(doubled),
                max_tokens: limits.limit,
            },
            other => other,
        })
    })?;
    messages.splice(0..0, trimmed.messages);
    // Placed after fitting, so that trimming keeps the prompt first whatever its role.
    let messages = place_system_prompt(messages, system_role);
    // The kept history's last turn and the request's first may be of one role: mended when
    // the request breaks the rules (it seldom does, and a long loop is not copied for it).
    let (messages, joined) = mended(messages, target.rules)?;
    let breakdown = BudgetBreakdown::compute_with_tools_tokens(
        target.model,
        target.policy,
        &messages,
        tools_tokens,
    )?;
    let mut dropped: Vec<[usize; 2]> = Vec::new();
    if history_dropped > 0 {
        dropped.push([system_len, system_len + history_dropped]);
    }
    dropped.extend(
        trimmed
            .dropped
            .iter()
            .map(|range| [unfitted(range.start), unfitted(range.end)]),
    );
    let dropped_count: usize = trimmed.dropped.iter().map(|range| range.len()).sum();
    let mut reasons = Vec::new();
    if let (Some(hysteresis), true) = (target.hysteresis, history_dropped > 0) {
        reasons.push(format!(
            "{history_dropped} history message{} left out to stay under {} of {} tokens (cut down to {} when the request passed {})",
            if history_dropped == 1 { "" } else { "s" },
            hysteresis.high,
            limits.limit,
            hysteresis.low,
            hysteresis.high,
        ));
    }
    if dropped_count > 0 {
        reasons.push(format!(
            "the history did not fit {} tokens (window {} x ratio {} - {} reserved for the reply): strategy {} left out {dropped_count} message{}",
            limits.limit,
            limits.context_window,
            limits.budget_ratio,
            limits.reserve_output,
            target.strategy,
            if dropped_count == 1 { "" } else { "s" },
        ));
    }
    if !truncated.is_empty() {
        let cut: u64 = truncated
            .iter()
            .map(|result| result.tokens_before.saturating_sub(result.tokens_after))
            .sum();
        reasons.push(format!(
            "{} tool result{} over {} tokens cut to {} ({cut} tokens cut)",
            truncated.len(),
            if truncated.len() == 1 { "" } else { "s" },
            target.truncate.map_or(0, |policy| policy.max_tokens),
            if truncated.len() == 1 {
                "its start and end"
            } else {
                "their start and end"
            },
        ));
    }
    if !cleared.is_empty() {
        let freed: u64 = cleared.iter().map(|result| result.tokens).sum();
        reasons.push(format!(
            "{} old tool result{} cleared ({freed} tokens freed)",
            cleared.len(),
            if cleared.len() == 1 { "" } else { "s" },
        ));
    }
    if let Some(ClearedThinking { turns, tokens }) = cleared_thinking {
        reasons.push(format!(
            "the reasoning of {turns} older assistant turn{} left out ({tokens} tokens freed)",
            if turns == 1 { "" } else { "s" },
        ));
    }
    let changes = repairs.len() + trimmed.repairs.len() + joined.len();
    if changes > 0 {
        reasons.push(repairs_reason(changes, target.rules));
    }
    let fit = FitRecord {
        limit: limits.limit,
        tokens_before: trimmed
            .tokens_before
            .map(|tokens| tokens + own_tokens + u64::from(doubled)),
        tokens_after: trimmed.tokens_after + own_tokens + u64::from(doubled),
        dropped,
        reason: (!reasons.is_empty()).then(|| reasons.join("; ")),
        cleared,
        truncated,
        cleared_thinking,
        prefix: None,
    };
    let trim = TrimSummary {
        over_budget: trimmed.over_budget || history_dropped > 0,
        partial: trimmed.partial.map(unfitted),
        marker: trimmed.marker,
        tokens_before_at_least: trimmed.tokens_before_at_least + own_tokens + u64::from(doubled),
        repairs: trimmed.repairs,
    };
    Ok(FittedRequest {
        messages,
        limits,
        breakdown,
        fit,
        trim,
    })
}

/// `messages` as they go out: as they are when they keep `rules` (the usual case, and a long
/// loop's request is not copied for it), else repaired, and refused when repair cannot
/// mend them; with the changes repair made.
fn mended(
    messages: Vec<Message>,
    rules: fit::Rules,
) -> Result<(Vec<Message>, Vec<fit::RepairChange>), FitError> {
    if validate(&messages, rules).is_empty() {
        return Ok((messages, Vec::new()));
    }
    let (messages, changes) = repair(messages, rules);
    let violations = validate(&messages, rules);
    if !violations.is_empty() {
        return Err(FitError::Invalid { violations });
    }
    Ok((messages, changes))
}

/// What a fit record says of `changes` made for `rules`.
fn repairs_reason(changes: usize, rules: fit::Rules) -> String {
    format!(
        "{changes} change{} for {rules} rules (merged turns, answered or dropped tool messages)",
        if changes == 1 { "" } else { "s" },
    )
}

/// `system + history + own` as they are, for a target whose fitting is off: nothing left
/// out, cleared or truncated; repaired and validated for the provider's rules, and refused
/// when it does not fit the model's whole window less the reply's reserve.
fn unfitted_request(
    system: Option<&Message>,
    history: Vec<Message>,
    own: &[Message],
    target: &FitTarget<'_>,
) -> Result<FittedRequest, FitError> {
    // The real window: the share a policy asks for is a fitting choice, and fitting is off.
    let budget = BudgetPolicy {
        budget_ratio: 1.0,
        reserve_output: target.policy.reserve_output,
    };
    let limits = budget.limits(target.model)?;
    let counter = &target.model.counter;
    let tools_tokens = counter.count_tools(target.tools);
    let mut messages: Vec<Message> = system.cloned().into_iter().collect();
    messages.extend(history);
    messages.extend_from_slice(own);
    let messages = place_system_prompt(messages, target.model.system_role);
    let (messages, repairs) = mended(messages, target.rules)?;
    let breakdown =
        BudgetBreakdown::compute_with_tools_tokens(target.model, &budget, &messages, tools_tokens)?;
    let tokens = u64::from(breakdown.used);
    if tokens > u64::from(limits.limit) {
        return Err(FitError::OverWindow {
            model: target.model.id.clone(),
            tokens,
            limit: limits.limit,
            window: limits.context_window,
            reserve: limits.reserve_output,
        });
    }
    let mut reasons =
        vec!["fitting is off (`context.enabled: false`): the history is sent as it is".to_owned()];
    if !repairs.is_empty() {
        reasons.push(repairs_reason(repairs.len(), target.rules));
    }
    let fit = FitRecord {
        limit: limits.limit,
        tokens_before: Some(tokens),
        tokens_after: tokens,
        dropped: Vec::new(),
        reason: Some(reasons.join("; ")),
        cleared: Vec::new(),
        truncated: Vec::new(),
        cleared_thinking: None,
        prefix: None,
    };
    Ok(FittedRequest {
        messages,
        limits,
        breakdown,
        fit,
        trim: TrimSummary {
            tokens_before_at_least: tokens,
            ..TrimSummary::default()
        },
    })
}

/// What a fit chooses: the model, the fit policy (a server's default, a thread's own, an
/// assistant's) and what the request itself sets over it. The model's rules apply
/// ([`ModelInfo::rules`]) unless the request names others. For a model a request names, a
/// policy's window may only lower the model's: a thread's policy is set by a client, and a
/// request must never pass the real window ([`ModelChoice`]).
#[derive(Debug, Clone)]
pub struct FitSettings {
    /// The model, with the policy's window.
    pub model: ModelInfo,
    /// The policy in effect: the base policy with the request's overrides.
    pub policy: FitPolicy,
    registry_model: ModelInfo,
    base: FitPolicy,
    overrides: FitOverrides,
    window: WindowRule,
}

/// Which model a fit is for, and how far its policy may move the model's window.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ModelChoice<'a> {
    /// The registry's default model (a thread read that names none).
    Default,
    /// A model a request or a command names: one the registry does not know is an error, and
    /// the policy (a server's, a thread's, a request's) may only lower its window.
    Named(&'a str),
    /// The model a workflow's assistant calls, by its route: one the registry does not know
    /// gets the registry's defaults, and the assistant's `window` replaces the registry's
    /// (its author sets it for the model they serve).
    Routed(&'a str),
}

/// How a policy's window applies to the model's.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum WindowRule {
    /// Only when smaller.
    AtMost,
    /// In its place.
    Replaces,
}

/// What one request sets over the fit policy that applies (a query string's or a command
/// line's options, a chat request's `max_tokens`).
#[derive(Debug, Clone, Default, PartialEq)]
pub struct FitOverrides {
    /// Which history survives.
    pub strategy: Option<Strategy>,
    /// The share of the window.
    pub budget_ratio: Option<f64>,
    /// The tokens reserved for the reply.
    pub reserve: Option<u32>,
    /// The most tokens the request may use: what the budget allows above it is reserved,
    /// as if for the reply.
    pub max_tokens: Option<u32>,
    /// Whose message rules the request follows (default: the model's).
    pub rules: Option<fit::Rules>,
    /// How the kept history is shaped beyond the strategy.
    pub shape: HistoryShape,
    /// `false` turns fitting off for the request: the history goes as it is, and a request
    /// over the window is refused ([`FitPolicy::enabled`]).
    pub enabled: Option<bool>,
    /// The context edits the request named, in place of the policy's clearing.
    pub edits: Option<RequestEdits>,
}

/// The context edits one request names (Anthropic's `context_management.edits`): they take
/// the place of the policy's clearing of tool results and of reasoning, each with what it
/// holds, none when it holds none.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct RequestEdits {
    /// Old tool results cleared.
    pub clear_tool_results: Option<ClearPolicy>,
    /// The reasoning of older assistant turns left out.
    pub clear_thinking: Option<ThinkingPolicy>,
}

/// Why fit settings cannot be made.
#[derive(Debug, thiserror::Error)]
pub enum SettingsError {
    /// The registry has no such model.
    #[error(transparent)]
    Model(#[from] RegistryError),
    /// The calibration could not be read.
    #[error("cannot read the model's calibration: {0}")]
    Store(#[from] StoreError),
    /// The policy with the overrides does not work for the model.
    #[error(transparent)]
    Budget(#[from] BudgetError),
}

impl FitSettings {
    /// The settings every fit is made with, wherever it is asked for (a chat turn, a
    /// thread read for a model, a workflow's assistant step, `contexture fit`): the model
    /// `choice` names as `registry` knows it, its estimate calibrated by what `learner`'s
    /// calls taught as `calibrations` holds it (see [`crate::estimates::calibrated`]; `None`:
    /// no store, so nothing learnt), under `policy` with `overrides` over it.
    pub async fn for_model<S: Store>(
        calibrations: Option<&S>,
        registry: &Registry,
        choice: ModelChoice<'_>,
        learner: &crate::estimates::Learner,
        policy: FitPolicy,
        overrides: FitOverrides,
    ) -> Result<FitSettings, SettingsError> {
        let (model, window) = match choice {
            ModelChoice::Default => (registry.default_model(), WindowRule::AtMost),
            ModelChoice::Named(model) => (registry.get(model)?, WindowRule::AtMost),
            ModelChoice::Routed(model) => (registry.resolve(model), WindowRule::Replaces),
        };
        let model = match calibrations {
            Some(store) => crate::estimates::calibrated(store, model, learner).await?,
            None => model,
        };
        Ok(FitSettings::with_window(model, policy, overrides, window)?)
    }

    /// Settings for `model` (a model a request names) under `policy`, with `overrides` over
    /// it.
    pub fn new(
        model: ModelInfo,
        policy: FitPolicy,
        overrides: FitOverrides,
    ) -> Result<FitSettings, BudgetError> {
        FitSettings::with_window(model, policy, overrides, WindowRule::AtMost)
    }

    fn with_window(
        model: ModelInfo,
        policy: FitPolicy,
        overrides: FitOverrides,
        window: WindowRule,
    ) -> Result<FitSettings, BudgetError> {
        let (effective, resolved) = resolve(&model, &policy, &overrides, window)?;
        Ok(FitSettings {
            model: effective,
            policy: resolved,
            registry_model: model,
            base: policy,
            overrides,
            window,
        })
    }

    /// What a fit with these settings is made for, with `budget` (the settings'
    /// [`FitSettings::budget`]) and the `tools` sent.
    pub fn target<'a>(&'a self, budget: &'a BudgetPolicy, tools: &'a [Value]) -> FitTarget<'a> {
        FitTarget {
            enabled: self.policy.enabled,
            model: &self.model,
            policy: budget,
            strategy: self.policy.strategy,
            rules: self.rules(),
            tools,
            clear: self.policy.clear_tool_results.as_ref(),
            truncate: self.policy.truncate_tool_results.as_ref(),
            hysteresis: self.policy.hysteresis.as_ref(),
            thinking: self.policy.clear_thinking,
            shape: Some(&self.overrides.shape),
        }
    }

    /// The same model and overrides under `policy` (a thread's own, in place of the
    /// server's default).
    pub fn adopt(&mut self, policy: &FitPolicy) -> Result<(), BudgetError> {
        let (effective, resolved) =
            resolve(&self.registry_model, policy, &self.overrides, self.window)?;
        self.model = effective;
        self.policy = resolved;
        self.base = policy.clone();
        Ok(())
    }

    /// Reserves the `tokens` a client asked its reply may take (a chat request's own
    /// `max_tokens`), whichever policy applies: refused when the model cannot answer with
    /// that many (its output limit, and less than its window).
    pub fn reserve_for_reply(&mut self, tokens: u64) -> Result<(), ReplyReserveError> {
        let model = &self.model;
        let most = u64::from(
            model
                .max_output_tokens
                .min(model.context_window.saturating_sub(1)),
        );
        if tokens == 0 || tokens > most {
            return Err(ReplyReserveError::OutOfRange {
                tokens,
                model: model.id.clone(),
                most,
            });
        }
        // At most the model's output limit, so within u32.
        self.overrides.reserve = Some(tokens as u32);
        let (effective, resolved) = resolve(
            &self.registry_model,
            &self.base,
            &self.overrides,
            self.window,
        )?;
        self.model = effective;
        self.policy = resolved;
        Ok(())
    }

    /// The budget policy in effect.
    pub fn budget(&self) -> BudgetPolicy {
        self.policy.budget()
    }

    /// Whose message rules the fitted request follows: the request's choice, else the
    /// model's ([`ModelInfo::rules`]).
    pub fn rules(&self) -> fit::Rules {
        self.overrides.rules.unwrap_or_else(|| self.model.rules())
    }

    /// What fitting needs of the stored thread `thread`: its projection, or with a strategy
    /// that keeps the newest history, only its tail ([`Store::load_projection_tail`]), long
    /// enough that no fit can tell it from the whole: its newest messages past the window
    /// and `own_tokens` more (the request's own turns, which are part of what is read and
    /// are kept whole), and past `at_least` tokens (a compaction trigger's threshold, which
    /// must see a cut thread as over it).
    pub async fn load<S: Store>(
        &self,
        store: &S,
        thread: &str,
        own_tokens: u64,
        at_least: u64,
    ) -> Result<ProjectionTail, StoreError> {
        let tokens = match self.history_needed() {
            Some(tokens) => tokens.saturating_add(own_tokens).max(at_least),
            None => u64::MAX,
        };
        store
            .load_projection_tail(thread, self.model.counter.encoding(), tokens)
            .await
    }

    /// [`FitSettings::load`], after which the settings follow the thread's own fit policy
    /// when it has one (read again when that policy needs more of the thread).
    pub async fn load_adopting<S: Store>(
        &mut self,
        store: &S,
        thread: &str,
        own_tokens: u64,
    ) -> Result<ProjectionTail, ThreadFitError> {
        let tail = self.load(store, thread, own_tokens, 0).await?;
        let Some(policy) = tail.policy.as_ref().and_then(|policy| policy.fit.as_ref()) else {
            return Ok(tail);
        };
        let before = self.clone();
        self.adopt(policy).map_err(FitError::from)?;
        if tail.unread > 0 && self.reads_more_than(&before) {
            return Ok(self.load(store, thread, own_tokens, 0).await?);
        }
        Ok(tail)
    }

    /// How much of a history a fit with these settings can need: its newest messages
    /// until their counts in the model's encoding pass this many tokens (older ones cannot
    /// change the fit); `None` when it needs all of it (a strategy that keeps old history
    /// too, or fitting off: the whole history is sent).
    pub fn history_needed(&self) -> Option<u64> {
        (self.policy.strategy == Strategy::Last && self.policy.enabled).then(|| self.tail_tokens())
    }

    /// Fits a history of `history_len` messages after `system` that is read from its end:
    /// `read(index)` gives the history's message `index`, asked newest first and only as
    /// far back as the fit can need, so a long history costs about what the fit keeps. What
    /// was not read is reported left out, with the input's indices (the system prompt
    /// first). The fit is the one of the whole history: a policy that makes messages
    /// smaller before trimming (cleared or cut tool results, cleared reasoning) can keep
    /// older history than the window's worth of their sizes, so with one every message is
    /// read.
    pub fn fit_read_back<E>(
        &self,
        system: Option<Message>,
        history_len: usize,
        mut read: impl FnMut(usize) -> Result<Message, E>,
        tools: &[Value],
    ) -> Result<Result<FittedRequest, FitError>, E> {
        let encoding = self.model.counter.encoding();
        let shrinks = self.policy.clear_tool_results.is_some()
            || self.policy.truncate_tool_results.is_some()
            || self.policy.clear_thinking.is_some();
        // These settings are the fit's own (a stored thread's read is also made for
        // settings that may change after it, so it reads the window's worth): what the
        // request may hold, the limit, is all that can be kept.
        let needed = match self.history_needed() {
            Some(_) if !shrinks => self.in_encoding(self.limit_tokens()),
            _ => u64::MAX,
        };
        let mut tail: Vec<Message> = Vec::new();
        let mut counted = 0u64;
        for index in (0..history_len).rev() {
            // The newest messages until their counts pass what is needed (a stored thread's
            // tail rule), and on to the start of the unit there: a tool result is read with
            // the call it answers, so the fit leaves out whole units as it would of the
            // whole history.
            let complete =
                counted > needed && tail.last().is_none_or(|oldest| oldest.role != Role::Tool);
            if complete {
                break;
            }
            let message = read(index)?;
            counted = counted.saturating_add(u64::from(contexture_core::tokens::message_tokens(
                &message, encoding,
            )));
            tail.push(message);
        }
        tail.reverse();
        let unread = history_len - tail.len();
        let has_system = system.is_some();
        let projection = Projection {
            context: contexture_core::thread::DEFAULT_CONTEXT.to_owned(),
            system,
            messages: tail,
        };
        Ok(self.fit(projection, &[], tools).map(|mut fitted| {
            count_unread(&mut fitted.fit, unread, has_system);
            let start = usize::from(has_system);
            if let Some(partial) = &mut fitted.trim.partial
                && *partial >= start
            {
                *partial += unread;
            }
            fitted
        }))
    }

    /// [`FitSettings::fit_read_back`] of a whole message list of `len` messages, `read(index)`
    /// giving message `index`: the first message is the system prompt when it is a system or
    /// developer message (as [`Projection::from_messages`] takes it), and is read once
    /// either way.
    pub fn fit_list_read_back<E>(
        &self,
        len: usize,
        mut read: impl FnMut(usize) -> Result<Message, E>,
        tools: &[Value],
    ) -> Result<Result<FittedRequest, FitError>, E> {
        let mut first = match len {
            0 => None,
            _ => Some(read(0)?),
        };
        let system = first.take_if(|message| message.role.is_system_like());
        let start = usize::from(system.is_some());
        self.fit_read_back(
            system,
            len - start,
            |index| match (index + start, first.take()) {
                (0, Some(message)) => Ok(message),
                (place, unread) => {
                    first = unread;
                    read(place)
                }
            },
            tools,
        )
    }

    /// True when a read for these settings needs more of a thread than one for `other`: the
    /// whole of it where `other` read a tail, or a longer tail.
    pub fn reads_more_than(&self, other: &FitSettings) -> bool {
        let whole = |settings: &FitSettings| {
            settings.policy.strategy != Strategy::Last || !settings.policy.enabled
        };
        (whole(self) && !whole(other)) || self.tail_tokens() > other.tail_tokens()
    }

    /// The tokens a fit's history can hold at most, in the counter's encoding (an estimating
    /// counter that counts fewer tokens than its encoding needs more of them).
    fn tail_tokens(&self) -> u64 {
        let window = u64::from(self.model.context_window);
        self.in_encoding(window.max(self.limit_tokens()))
    }

    /// The most tokens a request may use (the window when the budget does not work).
    fn limit_tokens(&self) -> u64 {
        let window = u64::from(self.model.context_window);
        self.budget()
            .limits(&self.model)
            .map_or(window, |limits| u64::from(limits.limit))
    }

    /// `tokens` as the counter counts them, in its encoding's tokens (an estimating counter
    /// that counts fewer tokens than its encoding needs more of them).
    fn in_encoding(&self, tokens: u64) -> u64 {
        let ratio = self.model.counter.effective_ratio();
        if ratio < 1.0 && ratio > 0.0 {
            (tokens as f64 / ratio).ceil() as u64
        } else {
            tokens
        }
    }

    /// Fits `projection` (its system prompt, then its messages) followed by `own` (kept
    /// whole: the messages of the request being answered) with `tools`.
    pub fn fit(
        &self,
        projection: Projection,
        own: &[Message],
        tools: &[Value],
    ) -> Result<FittedRequest, FitError> {
        self.fit_in_loop(projection, own, tools, &mut CutMemory::default())
    }

    /// [`FitSettings::fit`] as one call of a loop: what `memory` says earlier calls cut is
    /// cut again first (see [`fit_request_in_loop`]).
    pub fn fit_in_loop(
        &self,
        projection: Projection,
        own: &[Message],
        tools: &[Value],
        memory: &mut CutMemory,
    ) -> Result<FittedRequest, FitError> {
        let budget = self.budget();
        let target = self.target(&budget, tools);
        fit_request_in_loop(
            projection.system.as_ref(),
            projection.messages,
            own,
            &target,
            memory,
        )
    }

    /// [`FitSettings::fit`] of a projection read from its end: what fitting left out
    /// counts the messages that were not read too (they come first in the history).
    pub fn fit_tail(
        &self,
        tail: ProjectionTail,
        own: &[Message],
        tools: &[Value],
    ) -> Result<FittedRequest, FitError> {
        self.fit_tail_in_loop(tail, own, tools, &mut CutMemory::default())
    }

    /// [`FitSettings::fit_tail`] as one call of a loop (see [`FitSettings::fit_in_loop`]).
    pub fn fit_tail_in_loop(
        &self,
        tail: ProjectionTail,
        own: &[Message],
        tools: &[Value],
        memory: &mut CutMemory,
    ) -> Result<FittedRequest, FitError> {
        let has_system = tail.projection.system.is_some();
        let mut fitted = self.fit_in_loop(tail.projection, own, tools, memory)?;
        count_unread(&mut fitted.fit, tail.unread, has_system);
        Ok(fitted)
    }
}

/// `policy` with `overrides` over it, for `model`: the model as the policy sees it and the
/// policy in effect.
fn resolve(
    model: &ModelInfo,
    policy: &FitPolicy,
    overrides: &FitOverrides,
    window: WindowRule,
) -> Result<(ModelInfo, FitPolicy), BudgetError> {
    let mut policy = policy.clone();
    if let Some(strategy) = overrides.strategy {
        policy.strategy = strategy;
    }
    if let Some(ratio) = overrides.budget_ratio {
        policy.budget_ratio = ratio;
    }
    if overrides.reserve.is_some() {
        policy.reserve = overrides.reserve;
    }
    if let Some(enabled) = overrides.enabled {
        policy.enabled = enabled;
    }
    if let Some(edits) = &overrides.edits {
        policy.clear_tool_results = edits.clear_tool_results.clone();
        policy.clear_thinking = edits.clear_thinking;
    }
    let model = match window {
        WindowRule::AtMost => policy.model_at_most(model.clone()),
        WindowRule::Replaces => policy.model(model.clone()),
    };
    let limits = policy.budget().limits(&model)?;
    if let Some(max_tokens) = overrides.max_tokens
        && max_tokens < limits.limit
    {
        policy.reserve = Some(limits.reserve_output + (limits.limit - max_tokens));
    }
    Ok((model, policy))
}

/// Why a stored thread cannot be read for a model.
#[derive(Debug, thiserror::Error)]
pub enum ThreadFitError {
    /// The store failed (or has no such thread).
    #[error(transparent)]
    Store(#[from] StoreError),
    /// The thread's projection cannot be fitted.
    #[error(transparent)]
    Fit(#[from] FitError),
}

/// Why [`thread_messages`] could not read a thread.
#[derive(Debug, thiserror::Error)]
pub enum ThreadReadError {
    /// The store failed (or has no such thread), or the view cannot be fitted.
    #[error(transparent)]
    Thread(#[from] ThreadFitError),
    /// The view names a context the thread does not have.
    #[error(transparent)]
    UnknownContext(#[from] UnknownContext),
}

impl From<StoreError> for ThreadReadError {
    fn from(error: StoreError) -> ThreadReadError {
        ThreadReadError::Thread(error.into())
    }
}

impl From<FitError> for ThreadReadError {
    fn from(error: FitError) -> ThreadReadError {
        ThreadReadError::Thread(error.into())
    }
}

/// The active projection of the stored thread `thread` fitted for `settings` (under the
/// thread's own fit policy when it has one): what a request to that model would be sent of
/// it. A thread that does not exist is
/// [`StoreError::NotFound`].
pub async fn fit_thread<S: Store>(
    store: &S,
    thread: &str,
    settings: &FitSettings,
) -> Result<FittedRequest, ThreadFitError> {
    Ok(fit_thread_reporting(store, thread, settings).await?.1)
}

/// [`fit_thread`], with the settings the fit was made by (the thread's own fit policy
/// adopted over `settings`), which its report needs.
pub async fn fit_thread_reporting<S: Store>(
    store: &S,
    thread: &str,
    settings: &FitSettings,
) -> Result<(FitSettings, FittedRequest), ThreadFitError> {
    let (settings, tail) = load_for_fit(store, thread, settings).await?;
    let fitted = settings.fit_tail(tail, &[], &[])?;
    Ok((settings, fitted))
}

/// [`fit_thread`] with the fit run on `pool` under `key`'s share (see [`crate::cpu`]): the
/// read stays on the caller's task, the CPU work goes to a blocking thread.
pub async fn fit_thread_on<S: Store>(
    store: &S,
    thread: &str,
    settings: &FitSettings,
    pool: &crate::cpu::CpuPool,
    key: &str,
) -> Result<FittedRequest, ThreadFitError> {
    let (settings, tail) = load_for_fit(store, thread, settings).await?;
    let weight = fit_weight(&tail.projection.messages, settings.model.counter.encoding());
    Ok(pool
        .run_weighed(key, weight, move || settings.fit_tail(tail, &[], &[]))
        .await?)
}

/// About how much work fitting `messages` is, in the units of [`crate::cpu::INLINE_WEIGHT`]:
/// one per message, one per 256 bytes of a message whose tokens under `encoding` are not
/// counted yet (counting is most of what a fit does), and one per 4 KiB of a counted one (a
/// long message may still have to be cut at a token boundary, which reads it).
pub fn fit_weight(messages: &[Message], encoding: Encoding) -> usize {
    messages
        .iter()
        .map(|message| {
            let text: usize = match &message.content {
                Some(Content::Text(text)) => text.len(),
                Some(Content::Parts(parts)) => parts
                    .iter()
                    .map(|part| match part {
                        Part::Text { text, .. } => text.len(),
                        _ => 0,
                    })
                    .sum(),
                None => 0,
            };
            let calls: usize = message
                .tool_calls
                .iter()
                .map(|call| call.name.len() + call.arguments.len())
                .sum();
            let bytes_per_unit = if message.cached_tokens(encoding).is_some() {
                4096
            } else {
                256
            };
            1 + (text + calls) / bytes_per_unit
        })
        .sum()
}

/// What [`fit_thread`] fits: the settings under the thread's own policy, and the tail of
/// its active projection they need.
async fn load_for_fit<S: Store>(
    store: &S,
    thread: &str,
    settings: &FitSettings,
) -> Result<(FitSettings, ProjectionTail), ThreadFitError> {
    let mut settings = settings.clone();
    let tail = settings.load_adopting(store, thread, 0).await?;
    if tail.projection.system.is_none() && tail.projection.messages.is_empty() && tail.unread == 0 {
        // An empty projection is a thread with nothing to show, or no thread at all.
        if !store.exists(thread).await? {
            return Err(StoreError::NotFound {
                thread: thread.to_owned(),
            }
            .into());
        }
    }
    Ok((settings, tail))
}

/// Which messages of a stored thread to read: the view `contexture thread messages` prints.
#[derive(Debug, Clone, Default)]
pub struct MessageView {
    /// A named context instead of the active one.
    pub context: Option<String>,
    /// Only the last this many units of the conversation: a message, or an assistant turn
    /// with its tool results counted as one, so a view never holds a result without its call
    /// (the system prompt is not counted).
    pub limit: Option<usize>,
    /// Fitted for a model, as a request to it would be sent.
    pub fit: Option<FitSettings>,
}

/// The messages of the stored thread `thread` that `view` asks for. The active context
/// fitted, with no limit, is [`fit_thread`]'s read (only the tail the fit keeps); the active
/// context otherwise is the store's projection (which decodes only what the last replace
/// left); a named context replays the thread.
pub async fn thread_messages<S: Store>(
    store: &S,
    thread: &str,
    view: &MessageView,
) -> Result<Vec<Message>, ThreadReadError> {
    if let (None, None, Some(settings)) = (&view.context, view.limit, &view.fit) {
        return Ok(fit_thread(store, thread, settings).await?.messages);
    }
    let (projection, policy) = match (&view.context, &view.fit) {
        (None, None) => (store.load_projection(thread).await?, None),
        (None, Some(settings)) => {
            // The whole projection, with the thread's policy.
            let tail = store
                .load_projection_tail(thread, settings.model.counter.encoding(), u64::MAX)
                .await?;
            (tail.projection, tail.policy)
        }
        (Some(context), _) => {
            let folded = store.load(thread).await?;
            folded.check_context(context)?;
            (
                folded.projection_of(context, view.limit),
                folded.policy().cloned(),
            )
        }
    };
    let mut projection = projection;
    if let (None, Some(limit)) = (&view.context, view.limit) {
        let start = last_units_start(&projection.messages, limit);
        projection.messages.drain(..start);
    }
    Ok(match &view.fit {
        Some(settings) => {
            let mut settings = settings.clone();
            if let Some(policy) = policy.and_then(|policy| policy.fit) {
                settings.adopt(&policy).map_err(FitError::from)?;
            }
            settings.fit(projection, &[], &[])?.messages
        }
        None => projection.into_messages(),
    })
}

/// Puts the `unread` oldest history messages of a tail read into `fit`: the history starts
/// after the system prompt (when there is one), so the ranges left out move up by `unread`
/// and one more covers the unread ones; the tokens before trimming are no longer known.
pub fn count_unread(fit: &mut FitRecord, unread: usize, has_system: bool) {
    if unread == 0 {
        return;
    }
    let start = usize::from(has_system);
    let mut dropped = vec![[start, start + unread]];
    for [from, to] in fit.dropped.iter().copied() {
        let (from, to) = if from >= start {
            (from + unread, to + unread)
        } else {
            (from, to)
        };
        match dropped.last_mut() {
            Some(last) if last[1] == from => last[1] = to,
            _ => dropped.push([from, to]),
        }
    }
    dropped.sort_unstable();
    fit.dropped = dropped;
    fit.tokens_before = None;
    let note = format!("{unread} older messages were not read: the newest fill the window");
    fit.reason = Some(match fit.reason.take() {
        Some(reason) => format!("{note}; {reason}"),
        None => note,
    });
}

#[cfg(test)]
mod tests {
    use super::*;
    use contexture_core::ToolCall;
    use contexture_core::registry::Registry;

    #[test]
    fn a_fit_weighs_its_messages_and_the_text_it_must_still_count() {
        let encoding = Encoding::O200kBase;
        let counted = Message::user("x".repeat(100_000));
        counted.set_cached_tokens(encoding, 12_500);
        // Counted already: a unit per 4 KiB (cutting it would still read it).
        assert_eq!(
            fit_weight(std::slice::from_ref(&counted), encoding),
            1 + 100_000 / 4096
        );
        // A huge counted message sends the fit to the pool, whatever else it holds.
        let huge = Message::user("z".repeat(4 << 20));
        huge.set_cached_tokens(encoding, 500_000);
        assert!(fit_weight(&[huge], encoding) > crate::cpu::INLINE_WEIGHT);
        // Not yet counted under this encoding: a unit per 256 bytes.
        assert_eq!(
            fit_weight(&[counted], Encoding::Cl100kBase),
            1 + 100_000 / 256
        );
        let call =
            Message::assistant_tool_calls(vec![ToolCall::new("call_1", "search", "y".repeat(512))]);
        assert_eq!(fit_weight(&[call], encoding), 1 + (6 + 512) / 256);
        let short: Vec<Message> = (0..300)
            .map(|i| Message::user(format!("turn {i}")))
            .collect();
        assert_eq!(fit_weight(&short, encoding), 300);
        assert!(fit_weight(&short, encoding) <= crate::cpu::INLINE_WEIGHT);
    }

    /// The settings for a model a request names and for one a workflow's route names: an
    /// unknown name is refused for the first and gets the registry's defaults for the
    /// second; a policy's window only lowers the first's, and replaces the second's.
    #[tokio::test]
    async fn a_named_model_keeps_its_window_and_a_routed_one_takes_the_assistants() {
        let registry = Registry::builtin();
        let no_store: Option<&contexture_store::SqliteStore> = None;
        let learner = crate::estimates::Learner::Operator;
        let settings = |choice, window| {
            let policy = FitPolicy {
                window: Some(window),
                ..FitPolicy::default()
            };
            FitSettings::for_model(
                no_store,
                &registry,
                choice,
                &learner,
                policy,
                FitOverrides::default(),
            )
        };
        let real = registry.get("gpt-4o-mini").unwrap().context_window;
        let named = settings(ModelChoice::Named("gpt-4o-mini"), real * 2).await;
        assert_eq!(named.unwrap().model.context_window, real);
        let named = settings(ModelChoice::Named("gpt-4o-mini"), 4000).await;
        assert_eq!(named.unwrap().model.context_window, 4000);
        let routed = settings(ModelChoice::Routed("gpt-4o-mini"), real * 2).await;
        assert_eq!(routed.unwrap().model.context_window, real * 2);
        assert!(matches!(
            settings(ModelChoice::Named("no-such-model-anywhere"), 4000).await,
            Err(SettingsError::Model(_))
        ));
        let local = settings(ModelChoice::Routed("no-such-model-anywhere"), 32_000)
            .await
            .unwrap();
        assert_eq!(local.model.context_window, 32_000);
        assert_eq!(local.model.id, "no-such-model-anywhere");
    }

    /// A chat turn's new messages may be the results of the history's last calls: the turn
    /// that called them is kept whole with them, as sent, under every provider's rules.
    #[test]
    fn results_among_the_own_messages_keep_the_turn_that_called_them() {
        let model = Registry::builtin().resolve("gpt-4o-mini");
        let budget = BudgetPolicy::default();
        let history = vec![
            Message::user("Look up two cities."),
            Message::assistant_tool_calls(vec![
                ToolCall::new("a", "lookup", "{\"q\":\"Paris\"}"),
                ToolCall::new("b", "lookup", "{\"q\":\"Rome\"}"),
            ]),
            Message::tool_result("a", "Paris: 2.1 million"),
        ];
        let own = [Message::tool_result("b", "Rome: 2.8 million")];
        for rules in [fit::Rules::OpenAi, fit::Rules::Anthropic] {
            let target = FitTarget {
                enabled: true,
                model: &model,
                policy: &budget,
                strategy: Strategy::Last,
                rules,
                tools: &[],
                clear: None,
                truncate: None,
                hysteresis: None,
                thinking: None,
                shape: None,
            };
            let fitted = fit_request(None, history.clone(), &own, &target).unwrap();
            let mut expected = history.clone();
            expected.extend(own.iter().cloned());
            assert_eq!(fitted.messages, expected, "{rules}");
            assert_eq!(fitted.fit.reason, None, "{rules}: nothing changed");
        }
    }
}
