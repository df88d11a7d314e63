//! The agent loop both loop-fit benchmarks fit a call of: a step's task and its tool uses.

use contexture_core::{Message, ToolCall};

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
