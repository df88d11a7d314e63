//! The agent loop both loop-fit benchmarks fit a call of: a step whose own messages are its
//! task and 250 tool uses (results of about 1,500 tokens each), on gpt-4o-mini with a
//! 16,000-token window, clearing old results and their inputs with hysteresis.

use contexture_core::budget::BudgetPolicy;
use contexture_core::fit::{ClearPolicy, CutMemory, Hysteresis, Strategy};
use contexture_core::registry::{ModelInfo, Registry};
use contexture_core::{Message, ToolCall};
use contexture_engine::fitting::{FitTarget, FittedRequest, fit_request_in_loop};
use serde_json::Value;

/// Tool uses in the step.
pub const USES: usize = 250;

/// The step's task and `uses` tool uses, each result about 1,500 tokens.
pub fn own(uses: usize) -> Vec<Message> {
    let mut own = vec![Message::user("Search every source and report.")];
    for use_ in 0..uses {
        let id = format!("call_{use_}");
        own.push(Message::assistant_tool_calls(vec![ToolCall::new(
            id.clone(),
            "search",
            format!(r#"{{"q":"source {use_}"}}"#),
        )]));
        let text: String = (0..170)
            .map(|hit| format!("hit {hit} for source {use_}\n"))
            .collect();
        own.push(Message::tool_result(id, text));
    }
    own
}

/// Everything a call of the step is fitted from, owned (a fit borrows it).
pub struct LoopStep {
    model: ModelInfo,
    policy: BudgetPolicy,
    clear: ClearPolicy,
    hysteresis: Hysteresis,
    tools: Vec<Value>,
    /// The step's system prompt.
    pub system: Message,
    /// The step's own messages, all [`USES`] tool uses of them.
    pub messages: Vec<Message>,
}

impl LoopStep {
    /// The step: `trigger_tokens` 9,000, `keep` 3, `clear_at_least` 2,000, hysteresis
    /// (0.9, 0.6), inputs cleared with their results.
    pub fn new() -> LoopStep {
        LoopStep {
            model: ModelInfo {
                context_window: 16_000,
                ..Registry::builtin().resolve("gpt-4o-mini")
            },
            policy: BudgetPolicy {
                budget_ratio: 1.0,
                reserve_output: Some(1_000),
            },
            clear: ClearPolicy {
                trigger_tokens: Some(9_000),
                trigger_tool_uses: None,
                min_cleared: None,
                keep: 3,
                clear_at_least: Some(2_000),
                exclude_tools: Vec::new(),
                clear_inputs: true.into(),
            },
            hysteresis: Hysteresis {
                high: 0.9,
                low: 0.6,
            },
            tools: vec![
                serde_json::json!({"type": "function", "function": {"name": "search",
            "parameters": {"type": "object", "properties": {"q": {"type": "string"}}}}}),
            ],
            system: Message::system("You are a research agent. Use the search tool."),
            messages: own(USES),
        }
    }

    /// Fits the call whose own messages are the first `own` of the step's.
    pub fn fit(&self, own: usize, memory: &mut CutMemory) -> FittedRequest {
        let target = FitTarget {
            enabled: true,
            model: &self.model,
            policy: &self.policy,
            strategy: Strategy::Last,
            rules: self.model.rules(),
            tools: &self.tools,
            clear: Some(&self.clear),
            truncate: None,
            hysteresis: Some(&self.hysteresis),
            thinking: None,
            shape: None,
        };
        fit_request_in_loop(
            Some(&self.system),
            Vec::new(),
            &self.messages[..own],
            &target,
            memory,
        )
        .unwrap_or_else(|error| panic!("the call of {own} messages: {error}"))
    }

    /// The cut memory the loop leaves for its last call: every call before it fitted in
    /// turn, each counting its new messages once and leaving its memory to the next.
    pub fn memory_before_last_call(&self) -> CutMemory {
        let mut memory = CutMemory::default();
        for calls in 1..USES {
            self.fit(1 + 2 * calls, &mut memory);
        }
        memory
    }
}
