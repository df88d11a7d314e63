//! Request budgets: what one LLM request may spend, part by part.
//!
//! The usable window is the model's context window times the budget ratio; the reserve for
//! the reply comes off it, and what is left (the limit) is shared by the request's parts:
//! system prompt, tool schemas, pinned messages, the running summary, the other messages and
//! the reply priming. A [`BudgetBreakdown`] is plain data, printed by the CLI and returned by
//! the server.

use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::message::Message;
use crate::registry::ModelInfo;
use crate::tokens::REPLY_PRIMING;

/// The tag that marks a message as the running summary written by compaction.
pub const SUMMARY_TAG: &str = "summary";

/// How much of a model's window a request may use.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct BudgetPolicy {
    /// The share of the context window a request may use, in (0, 1]. Default 1.0.
    pub budget_ratio: f64,
    /// Tokens kept free for the reply. `None` means the default: the model's
    /// `max_output_tokens`, but at most a quarter of the usable window (so a model whose
    /// output limit equals its window, like `gpt-4`, still has room for a prompt).
    pub reserve_output: Option<u32>,
}

impl Default for BudgetPolicy {
    fn default() -> Self {
        BudgetPolicy {
            budget_ratio: 1.0,
            reserve_output: None,
        }
    }
}

/// A policy that cannot be applied.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum BudgetError {
    /// The ratio is not in (0, 1].
    #[error("budget_ratio must be greater than 0 and at most 1, not {0}")]
    InvalidRatio(f64),
}

impl BudgetPolicy {
    /// Checks the policy's values.
    pub fn validate(&self) -> Result<(), BudgetError> {
        if self.budget_ratio.is_finite() && self.budget_ratio > 0.0 && self.budget_ratio <= 1.0 {
            Ok(())
        } else {
            Err(BudgetError::InvalidRatio(self.budget_ratio))
        }
    }

    /// The usable window and the reply reserve for `model`, and the limit left for the
    /// request itself.
    pub fn limits(&self, model: &ModelInfo) -> Result<Limits, BudgetError> {
        self.validate()?;
        let usable = (f64::from(model.context_window) * self.budget_ratio).floor() as u32;
        let reserve_output = self
            .reserve_output
            .unwrap_or_else(|| model.max_output_tokens.min(usable / 4))
            .min(usable);
        Ok(Limits {
            context_window: model.context_window,
            budget_ratio: self.budget_ratio,
            usable,
            reserve_output,
            limit: usable - reserve_output,
        })
    }
}

/// The window arithmetic of a budget.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct Limits {
    /// The model's context window.
    pub context_window: u32,
    /// The share of the window a request may use.
    pub budget_ratio: f64,
    /// `context_window x budget_ratio`, rounded down.
    pub usable: u32,
    /// Tokens kept free for the reply.
    pub reserve_output: u32,
    /// What the request itself may use: `usable - reserve_output`.
    pub limit: u32,
}

/// A request's tokens, part by part, against its limit.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct BudgetBreakdown {
    /// The model asked for.
    pub model: String,
    /// Whether the counts are exact (the model's own encoding) or estimated.
    pub exact: bool,
    /// The encoding the counts come from.
    pub encoding: String,
    /// The window arithmetic.
    #[serde(flatten)]
    pub limits: Limits,
    /// System and developer messages.
    pub system: u32,
    /// Tool schemas.
    pub tools: u32,
    /// Pinned messages (other than system messages).
    pub pinned: u32,
    /// Running-summary messages (tagged [`SUMMARY_TAG`]).
    pub summary: u32,
    /// All other messages.
    pub messages: u32,
    /// The tokens that prime the reply.
    pub reply_priming: u32,
    /// Everything the request uses: the sum of the parts above.
    pub used: u32,
    /// `limit - used`; negative when the request is over its limit.
    pub remaining: i64,
}

impl BudgetBreakdown {
    /// Counts the parts of a request of `messages` and `tools` for `model` under `policy`.
    /// Message counts come from each message's cache when present.
    pub fn compute(
        model: &ModelInfo,
        policy: &BudgetPolicy,
        messages: &[Message],
        tools: &[Value],
    ) -> Result<BudgetBreakdown, BudgetError> {
        Self::compute_with_tools_tokens(model, policy, messages, model.counter.count_tools(tools))
    }

    /// [`BudgetBreakdown::compute`] with the tools already counted (`tools`, in tokens):
    /// fitting counts them once for the whole call.
    pub fn compute_with_tools_tokens(
        model: &ModelInfo,
        policy: &BudgetPolicy,
        messages: &[Message],
        tools: u32,
    ) -> Result<BudgetBreakdown, BudgetError> {
        let limits = policy.limits(model)?;
        let counter = model.counter;
        let (mut system, mut pinned, mut summary, mut rest) = (0u32, 0u32, 0u32, 0u32);
        for message in messages {
            let tokens = counter.count_message(message);
            let slot = if message.role.is_system_like() {
                &mut system
            } else if message.metadata.tags.iter().any(|tag| tag == SUMMARY_TAG) {
                &mut summary
            } else if message.is_pinned() {
                &mut pinned
            } else {
                &mut rest
            };
            *slot = slot.saturating_add(tokens);
        }
        let used = [system, tools, pinned, summary, rest, REPLY_PRIMING]
            .into_iter()
            .fold(0u32, u32::saturating_add);
        Ok(BudgetBreakdown {
            model: model.id.clone(),
            exact: counter.is_exact(),
            encoding: counter.encoding().name().to_owned(),
            limits,
            system,
            tools,
            pinned,
            summary,
            messages: rest,
            reply_priming: REPLY_PRIMING,
            used,
            remaining: i64::from(limits.limit) - i64::from(used),
        })
    }

    /// True when the request fits its limit.
    pub fn fits(&self) -> bool {
        self.remaining >= 0
    }
}

/// A request's window in the five parts an inspector draws: system, tools, history (pinned,
/// summary, messages and reply priming), the reserve for the reply, and what is free.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct BudgetParts {
    /// System and developer messages.
    pub system: u64,
    /// Tool schemas.
    pub tools: u64,
    /// Everything else sent: pinned, summary and other messages, and the reply priming.
    pub history: u64,
    /// Held back for the reply.
    pub reserve: u64,
    /// Usable and unused (0 when the request is over its limit).
    pub free: u64,
}

impl BudgetParts {
    /// The parts of `budget`.
    pub fn of(budget: &BudgetBreakdown) -> BudgetParts {
        let system = u64::from(budget.system);
        let tools = u64::from(budget.tools);
        let history = u64::from(budget.pinned)
            + u64::from(budget.summary)
            + u64::from(budget.messages)
            + u64::from(budget.reply_priming);
        let reserve = u64::from(budget.limits.reserve_output);
        let free =
            u64::from(budget.limits.usable).saturating_sub(system + tools + history + reserve);
        BudgetParts {
            system,
            tools,
            history,
            reserve,
            free,
        }
    }

    /// The parts in drawing order: system, tools, history, reserve, free.
    pub fn in_order(&self) -> [u64; 5] {
        [
            self.system,
            self.tools,
            self.history,
            self.reserve,
            self.free,
        ]
    }

    /// The parts as `width` cells of a bar, in drawing order: proportional, and every part
    /// that is not empty gets at least one cell (the largest part gives or takes what
    /// rounding leaves over).
    pub fn cells(&self, width: usize) -> [usize; 5] {
        let values = self.in_order();
        let total: u64 = values.iter().sum::<u64>().max(1);
        let mut cells = values.map(|v| {
            let share = (v as f64 / total as f64 * width as f64).round() as usize;
            if v > 0 { share.max(1) } else { 0 }
        });
        while cells.iter().sum::<usize>() != width {
            let largest = (0..cells.len()).max_by_key(|&i| cells[i]).unwrap_or(0);
            if cells.iter().sum::<usize>() > width {
                if cells[largest] <= 1 {
                    break;
                }
                cells[largest] -= 1;
            } else {
                cells[largest] += 1;
            }
        }
        cells
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::registry::Registry;

    #[test]
    fn parts_add_up_and_match_the_request_count() {
        let model = Registry::builtin().resolve("gpt-4o");
        let messages = vec![
            Message::system("You are terse."),
            Message::user("Remember: the code is 1234.").pinned(),
            Message::user("What is the code?"),
            Message::assistant("1234"),
        ];
        let tools = vec![
            serde_json::json!({"type": "function", "function": {"name": "lookup", "description": "Look up a code.", "parameters": {"type": "object", "properties": {"key": {"type": "string", "description": "The key."}}}}}),
        ];
        let budget =
            BudgetBreakdown::compute(&model, &BudgetPolicy::default(), &messages, &tools).unwrap();
        let request = model.counter.count_request(&messages, &tools);
        assert_eq!(budget.used, request.total);
        assert_eq!(
            budget.system
                + budget.tools
                + budget.pinned
                + budget.summary
                + budget.messages
                + budget.reply_priming,
            budget.used
        );
        assert!(budget.system > 0 && budget.pinned > 0 && budget.messages > 0 && budget.tools > 0);
        assert_eq!(budget.limits.reserve_output, 16384);
        assert_eq!(budget.limits.limit, 128_000 - 16384);
        assert_eq!(
            budget.remaining,
            i64::from(budget.limits.limit) - i64::from(budget.used)
        );
    }

    #[test]
    fn reserve_defaults_to_a_quarter_at_most() {
        let model = Registry::builtin().resolve("gpt-4");
        let limits = BudgetPolicy::default().limits(&model).unwrap();
        assert_eq!(limits.reserve_output, 2048);
        assert_eq!(limits.limit, 8192 - 2048);
    }

    #[test]
    fn ratio_and_explicit_reserve() {
        let model = Registry::builtin().resolve("gpt-4o");
        let policy = BudgetPolicy {
            budget_ratio: 0.5,
            reserve_output: Some(1000),
        };
        let limits = policy.limits(&model).unwrap();
        assert_eq!(limits.usable, 64_000);
        assert_eq!(limits.limit, 63_000);
        let bad = BudgetPolicy {
            budget_ratio: 1.5,
            reserve_output: None,
        };
        assert_eq!(bad.limits(&model), Err(BudgetError::InvalidRatio(1.5)));
    }

    #[test]
    fn over_budget_is_negative_remaining() {
        let mut model = Registry::builtin().resolve("gpt-4o");
        model.context_window = 40;
        let policy = BudgetPolicy {
            budget_ratio: 1.0,
            reserve_output: Some(10),
        };
        let messages = vec![Message::user("word ".repeat(100))];
        let budget = BudgetBreakdown::compute(&model, &policy, &messages, &[]).unwrap();
        assert!(!budget.fits());
        assert!(budget.remaining < 0);
    }
}

/// A chat request counted part by part for a model: each message's tokens, the reply
/// priming, the tool schemas, the total, and the model's budget for it. What `contexture
/// tokens count --messages --json` prints and the Python package's `count_messages` returns.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct RequestReport {
    /// The encoding the counts come from.
    pub encoding: &'static str,
    /// Whether the counts are exact (the model's own encoding) or estimated.
    pub exact: bool,
    /// Each message's tokens, in order, overhead included.
    pub messages: Vec<MessageTokens>,
    /// The tokens that prime the reply.
    pub reply_priming: u32,
    /// The tokens of the tool schemas.
    pub tools: u32,
    /// Everything together.
    pub total: u32,
    /// The model's budget, part by part.
    pub budget: BudgetBreakdown,
}

/// One message's tokens in a [`RequestReport`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct MessageTokens {
    /// Its place in the request.
    pub index: usize,
    /// Its role.
    pub role: &'static str,
    /// Its tokens, overhead included.
    pub tokens: u32,
}

impl RequestReport {
    /// Counts `messages` and `tools` as `model` does (its counter), with the budget
    /// `policy` gives it.
    pub fn count(
        model: &ModelInfo,
        policy: &BudgetPolicy,
        messages: &[Message],
        tools: &[Value],
    ) -> Result<RequestReport, BudgetError> {
        let counter = model.counter;
        let request = counter.count_request(messages, tools);
        let budget = BudgetBreakdown::compute(model, policy, messages, tools)?;
        Ok(RequestReport {
            encoding: counter.encoding().name(),
            exact: counter.is_exact(),
            messages: messages
                .iter()
                .zip(&request.per_message)
                .enumerate()
                .map(|(index, (message, &tokens))| MessageTokens {
                    index,
                    role: message.role.as_str(),
                    tokens,
                })
                .collect(),
            reply_priming: request.reply_priming,
            tools: request.tools,
            total: request.total,
            budget,
        })
    }
}
