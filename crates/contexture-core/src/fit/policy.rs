//! One policy for fitting requests to a model's window ([`FitPolicy`]): the budget (window,
//! share, reply reserve), which history survives trimming, and what is made smaller first
//! (tool results truncated and cleared, with hysteresis). Workflows, chat threads and the
//! command line all take it.

use serde::{Deserialize, Serialize};

use crate::budget::BudgetPolicy;
use crate::fit::clear::ClearPolicy;
use crate::fit::shrink::Hysteresis;
use crate::fit::system_role::SystemRole;
use crate::fit::thinking::ThinkingPolicy;
use crate::fit::trim::Strategy;
use crate::fit::truncate::TruncatePolicy;
use crate::registry::ModelInfo;

/// How requests are fitted to a model's window: an assistant's `context:` in a workflow, the
/// server's `[context]` for chat threads, a thread's own policy, `contexture fit`'s options.
/// One type, so that each door offers the same settings checked the same way.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct FitPolicy {
    /// `false` switches fitting off (AWorld's `OptimizationConfig.enabled`): the history is
    /// sent as it is, nothing trimmed, cleared or truncated; the request is still repaired
    /// and validated for the provider's rules, and one over the model's window (less the
    /// reply's reserve) is refused before it is sent. Default `true`.
    #[serde(skip_serializing_if = "is_true")]
    pub enabled: bool,
    /// Which messages trimming keeps: `last`, `first`, `head-tail` (the run's input and the
    /// newest turns) or `head-tail:N`.
    pub strategy: Strategy,
    /// Tokens reserved for the reply; default: the model's output limit, at most a quarter
    /// of the window. Also read as `reserve_output`.
    #[serde(alias = "reserve_output", skip_serializing_if = "Option::is_none")]
    pub reserve: Option<u32>,
    /// The share of the window a request may use, in (0, 1].
    pub budget_ratio: f64,
    /// The context window requests are fitted to, in place of the model registry's (a
    /// smaller one keeps requests cheap; default: the registry's).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub window: Option<u32>,
    /// Old tool results replaced by placeholders once a request passes a number of tokens
    /// (a step's own tool loop, or a client's, included); default: none.
    #[serde(
        skip_serializing_if = "Option::is_none",
        deserialize_with = "crate::map_only::optional"
    )]
    pub clear_tool_results: Option<ClearPolicy>,
    /// Tool results past a number of tokens cut to their start and end; default: none.
    #[serde(
        skip_serializing_if = "Option::is_none",
        deserialize_with = "crate::map_only::optional"
    )]
    pub truncate_tool_results: Option<TruncatePolicy>,
    /// Once a request passes `high` of its limit, it is cut down to `low`, and the next
    /// calls of the loop keep that cut (a stable prefix) until `high` is passed again;
    /// default: cut just enough on every call.
    #[serde(
        skip_serializing_if = "Option::is_none",
        deserialize_with = "crate::map_only::optional"
    )]
    pub hysteresis: Option<Hysteresis>,
    /// The reasoning ("thinking") of all but the newest `keep_turns` assistant turns that
    /// hold some left out of requests; default: every turn keeps its reasoning.
    #[serde(
        skip_serializing_if = "Option::is_none",
        deserialize_with = "crate::map_only::optional"
    )]
    pub clear_thinking: Option<ThinkingPolicy>,
    /// Where the model reads its system prompt, in place of the registry's: `native`, `user`
    /// (sent as the first user message, for providers that ignore the system role) or
    /// `both`; default: the registry's.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub system_role: Option<SystemRole>,
}

impl Default for FitPolicy {
    fn default() -> Self {
        FitPolicy {
            enabled: true,
            strategy: Strategy::Last,
            reserve: None,
            budget_ratio: 1.0,
            window: None,
            clear_tool_results: None,
            truncate_tool_results: None,
            hysteresis: None,
            clear_thinking: None,
            system_role: None,
        }
    }
}

impl FitPolicy {
    /// The budget policy of the requests (the window's share and the reply reserve).
    pub fn budget(&self) -> BudgetPolicy {
        BudgetPolicy {
            budget_ratio: self.budget_ratio,
            reserve_output: self.reserve,
        }
    }

    /// `model` as requests under this policy see it: with the policy's window in place of
    /// the registry's, when it sets one.
    pub fn model(&self, model: ModelInfo) -> ModelInfo {
        let model = self.placing_system_prompt(model);
        match self.window {
            Some(window) => ModelInfo {
                context_window: window,
                ..model
            },
            None => model,
        }
    }

    /// `model` with the policy's system-prompt placement, when it sets one.
    fn placing_system_prompt(&self, model: ModelInfo) -> ModelInfo {
        ModelInfo {
            system_role: self.system_role.unwrap_or(model.system_role),
            ..model
        }
    }

    /// `model` under a policy that may only lower its window (a chat thread's own, which a
    /// client sets): the policy's window when it is smaller than the registry's.
    pub fn model_at_most(&self, model: ModelInfo) -> ModelInfo {
        let model = self.placing_system_prompt(model);
        match self.window {
            Some(window) if window < model.context_window => ModelInfo {
                context_window: window,
                ..model
            },
            _ => model,
        }
    }

    /// True when it makes tool results smaller (truncates or clears them) or cuts with
    /// hysteresis: settings that only matter to requests carrying tool results or to a
    /// loop of calls.
    pub fn shrinks(&self) -> bool {
        self.clear_tool_results.is_some()
            || self.truncate_tool_results.is_some()
            || self.hysteresis.is_some()
    }

    /// What is wrong with the policy, as `(field, problem)` pairs (the field's path inside
    /// the policy, such as `clear_tool_results.keep`).
    pub fn problems(&self) -> Vec<(String, String)> {
        let mut problems = Vec::new();
        if !(self.budget_ratio > 0.0 && self.budget_ratio <= 1.0) {
            problems.push((
                "budget_ratio".into(),
                format!(
                    "budget_ratio must be greater than 0 and at most 1, not {}",
                    self.budget_ratio
                ),
            ));
        }
        if self.window == Some(0) {
            problems.push(("window".into(), "window must be at least 1 token".into()));
        }
        if let (Some(window), Some(reserve)) = (self.window, self.reserve)
            && reserve >= window
        {
            problems.push((
                "reserve".into(),
                format!(
                    "reserve ({reserve}) leaves nothing of the window ({window}) for the request"
                ),
            ));
        }
        if let Some(clear) = &self.clear_tool_results {
            for (field, problem) in clear.problems() {
                problems.push((format!("clear_tool_results.{field}"), problem));
            }
            if let (Some(window), Some(trigger)) = (self.window, clear.trigger_tokens)
                && trigger >= u64::from(window)
            {
                problems.push((
                    "clear_tool_results.trigger_tokens".into(),
                    format!(
                        "trigger_tokens ({trigger}) is not below the window ({window}): results would never be cleared"
                    ),
                ));
            }
        }
        if let Some(truncate) = &self.truncate_tool_results {
            for (field, problem) in truncate.problems() {
                problems.push((format!("truncate_tool_results.{field}"), problem));
            }
            if let Some(window) = self.window
                && truncate.max_tokens >= window
            {
                problems.push((
                    "truncate_tool_results.max_tokens".into(),
                    format!(
                        "max_tokens ({}) is not below the window ({window}): one result could fill it",
                        truncate.max_tokens
                    ),
                ));
            }
        }
        if let (Some(window), Some(clear), Some(truncate)) = (
            self.window,
            &self.clear_tool_results,
            &self.truncate_tool_results,
        ) {
            let kept = (clear.keep as u64).saturating_mul(u64::from(truncate.max_tokens));
            let room = u64::from(window.saturating_sub(self.reserve.unwrap_or(0)));
            if kept > room {
                problems.push((
                    "clear_tool_results.keep".into(),
                    format!(
                        "keep ({}) results of up to truncate_tool_results.max_tokens ({}) each take {kept} tokens, more than the {room} the window ({window}) leaves for a request",
                        clear.keep, truncate.max_tokens
                    ),
                ));
            }
        }
        if let Some(hysteresis) = &self.hysteresis {
            for (field, problem) in hysteresis.problems() {
                problems.push((format!("hysteresis.{field}"), problem));
            }
        }
        if !self.enabled {
            // Settings that would never apply are a mistake to point out, not to ignore.
            for (field, set) in [
                ("clear_tool_results", self.clear_tool_results.is_some()),
                (
                    "truncate_tool_results",
                    self.truncate_tool_results.is_some(),
                ),
                ("hysteresis", self.hysteresis.is_some()),
                ("clear_thinking", self.clear_thinking.is_some()),
            ] {
                if set {
                    problems.push((
                        field.into(),
                        format!("{field} has no effect with `enabled: false` (fitting is off): remove one of them"),
                    ));
                }
            }
        }
        problems
    }
}

/// For serde: `enabled` is written only when it is off.
fn is_true(value: &bool) -> bool {
    *value
}
