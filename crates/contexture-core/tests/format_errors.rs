//! Bad input tables: every malformed wire message is a typed error that names the place,
//! never a panic; every neutral conversation Anthropic cannot express is a typed error too.

use contexture_core::format::{FormatError, anthropic, openai};
use contexture_core::{Message, ToolCall};
use serde_json::{Value, json};

fn openai_error(input: Value) -> FormatError {
    openai::parse_messages(&input).expect_err("input is invalid")
}

fn anthropic_error(input: Value) -> FormatError {
    anthropic::parse_request(&input).expect_err("input is invalid")
}

#[test]
fn openai_errors_name_the_place() {
    let call = |function: Value| {
        json!([{"role": "assistant", "content": null, "tool_calls": [
            {"id": "c1", "type": "function", "function": {"name": "f", "arguments": "{}"}},
            {"id": "c2", "type": "function", "function": function}
        ]}])
    };
    let cases: Vec<(Value, &str)> = vec![
        (
            json!({"role": "user"}),
            "messages: expected an array, found an object",
        ),
        (
            json!(["hello"]),
            "messages[0]: expected an object, found a string",
        ),
        (
            json!([{"content": "hi"}]),
            "messages[0].role: missing required field",
        ),
        (
            json!([{"role": 7}]),
            "messages[0].role: expected a string, found a number",
        ),
        (
            json!([{"role": "user", "content": "a"}, {"role": "function", "content": "x"}]),
            "messages[1].role: unknown role `function` (expected one of system, developer, user, assistant, tool)",
        ),
        (
            json!([{"role": "user", "content": 42}]),
            "messages[0].content: expected a string, an array of parts or null, found a number",
        ),
        (
            json!([{"role": "user", "content": ["plain"]}]),
            "messages[0].content[0]: expected an object, found a string",
        ),
        (
            json!([{"role": "user", "content": [{"text": "no type"}]}]),
            "messages[0].content[0].type: missing required field",
        ),
        (
            json!([{"role": "user", "content": [{"type": "text", "text": ["x"]}]}]),
            "messages[0].content[0].text: expected a string, found an array",
        ),
        (
            json!([{"role": "user", "content": [{"type": "image_url"}]}]),
            "messages[0].content[0].image_url: missing required field",
        ),
        (
            json!([{"role": "user", "content": [{"type": "image_url", "image_url": "https://x/y.png"}]}]),
            "messages[0].content[0].image_url: expected an object, found a string",
        ),
        (
            json!([{"role": "user", "content": [{"type": "image_url", "image_url": {"detail": "low"}}]}]),
            "messages[0].content[0].image_url.url: missing required field",
        ),
        (
            json!([{"role": "user", "content": "x", "name": 3}]),
            "messages[0].name: expected a string, found a number",
        ),
        (
            json!([{"role": "tool", "content": "x", "tool_call_id": {"id": "c1"}}]),
            "messages[0].tool_call_id: expected a string, found an object",
        ),
        (
            json!([{"role": "assistant", "tool_calls": {"id": "c1"}}]),
            "messages[0].tool_calls: expected an array, found an object",
        ),
        (
            json!([{"role": "assistant", "tool_calls": ["c1"]}]),
            "messages[0].tool_calls[0]: expected an object, found a string",
        ),
        (
            json!([{"role": "assistant", "tool_calls": [{"type": "function", "function": {}}]}]),
            "messages[0].tool_calls[0].id: missing required field",
        ),
        (
            json!([{"role": "assistant", "tool_calls": [{"id": "c1", "function": {}}]}]),
            "messages[0].tool_calls[0].type: missing required field",
        ),
        (
            json!([{"role": "assistant", "tool_calls": [{"id": "c1", "type": "custom", "custom": {"name": "f", "input": "x"}}]}]),
            "messages[0].tool_calls[0].type: unsupported tool call type `custom` (only `function` calls are supported)",
        ),
        (
            json!([{"role": "assistant", "tool_calls": [{"id": "c1", "type": "function"}]}]),
            "messages[0].tool_calls[0].function: missing required field",
        ),
        (
            call(json!({"arguments": "{}"})),
            "messages[0].tool_calls[1].function.name: missing required field",
        ),
        (
            call(json!({"name": "f", "arguments": {"q": 1}})),
            "messages[0].tool_calls[1].function.arguments: expected a string, found an object",
        ),
        (
            json!([{"role": "user", "content": "a"}, {"role": "user", "content": "b"}, {"role": "user", "content": "c"},
                   {"role": "assistant", "tool_calls": [{"id": "c", "type": "function", "function": {"name": "f", "arguments": 1}}]}]),
            "messages[3].tool_calls[0].function.arguments: expected a string, found a number",
        ),
    ];
    for (input, expected) in cases {
        let error = openai_error(input.clone());
        assert_eq!(error.to_string(), expected, "input: {input}");
        assert!(expected.starts_with(error.path()), "path of {expected}");
    }
}

#[test]
fn openai_single_message_errors_say_message() {
    let error = openai::parse_message(&json!({"role": "user", "content": true})).unwrap_err();
    assert_eq!(
        error.to_string(),
        "message.content: expected a string, an array of parts or null, found a boolean"
    );
}

#[test]
fn anthropic_read_errors_name_the_place() {
    let turn = |content: Value| json!({"messages": [{"role": "user", "content": content}]});
    let cases: Vec<(Value, &str)> = vec![
        (json!([]), "request: expected an object, found an array"),
        (json!({"system": "s"}), "messages: missing required field"),
        (
            json!({"messages": {}}),
            "messages: expected an array, found an object",
        ),
        (
            json!({"system": 1, "messages": []}),
            "system: expected a string or an array of blocks, found a number",
        ),
        (
            json!({"system": [{"type": "tool_use", "id": "t", "name": "f", "input": {}}], "messages": []}),
            "system[0]: tool blocks are not allowed in the system prompt",
        ),
        (
            json!({"messages": [{"role": "system", "content": "x"}]}),
            "messages[0].role: unknown role `system` (expected user or assistant)",
        ),
        (
            json!({"messages": [{"role": "user"}]}),
            "messages[0].content: missing required field",
        ),
        (
            turn(json!(5)),
            "messages[0].content: expected a string or an array of blocks, found a number",
        ),
        (
            turn(json!([{"type": "text"}])),
            "messages[0].content[0].text: missing required field",
        ),
        (
            turn(json!([{"type": "image"}])),
            "messages[0].content[0].source: missing required field",
        ),
        (
            turn(
                json!([{"type": "image", "source": {"type": "base64", "media_type": "image/png"}}]),
            ),
            "messages[0].content[0].source.data: missing required field",
        ),
        (
            turn(json!([{"type": "tool_use", "id": "t", "name": "f", "input": {}}])),
            "messages[0].content[0]: tool_use blocks belong in an assistant turn",
        ),
        (
            json!({"messages": [{"role": "assistant", "content": [{"type": "tool_use", "id": "t", "name": "f"}]}]}),
            "messages[0].content[0].input: missing required field",
        ),
        (
            json!({"messages": [{"role": "assistant", "content": [{"type": "tool_result", "tool_use_id": "t"}]}]}),
            "messages[0].content[0]: tool_result blocks belong in a user turn",
        ),
        (
            turn(json!([{"type": "text", "text": "ok"}, {"type": "tool_result", "content": "x"}])),
            "messages[0].content[1].tool_use_id: missing required field",
        ),
        (
            turn(
                json!([{"type": "tool_result", "tool_use_id": "t", "content": [{"type": "tool_result", "tool_use_id": "u"}]}]),
            ),
            "messages[0].content[0].content[0]: tool blocks are not allowed inside a tool_result",
        ),
        (
            json!({"messages": [{"role": "user", "content": [{"type": "tool_result", "tool_use_id": "t"}], "x_id": 1}]}),
            "messages[0]: a user turn with tool_result blocks cannot keep turn-level fields other than role and content",
        ),
        (
            json!({"messages": [{"role": "assistant", "content": [{"type": "thinking", "thinking": 1}]}]}),
            "messages[0].content[0].thinking: expected a string, found a number",
        ),
    ];
    for (input, expected) in cases {
        let error = anthropic_error(input.clone());
        assert_eq!(error.to_string(), expected, "input: {input}");
    }
}

#[test]
fn anthropic_write_errors_name_the_message() {
    let mut cases: Vec<(Vec<Message>, &str)> = vec![
        (
            vec![Message::user("hi"), Message::system("late")],
            "messages[1]: cannot be written in the anthropic format: a system or developer message after the conversation began (the format has only one system prompt, before all turns)",
        ),
        (
            vec![
                Message::user("hi"),
                Message::assistant_tool_calls(vec![ToolCall::new("c1", "f", "{}")]),
                Message::new(contexture_core::Role::Tool, "result"),
            ],
            "messages[2].tool_call_id: cannot be written in the anthropic format: a tool result needs the id of the call it answers",
        ),
        (
            vec![
                Message::system("s"),
                Message::user("hi"),
                Message::assistant_tool_calls(vec![
                    ToolCall::new("c1", "f", "{}"),
                    ToolCall::new("c2", "f", r#"{"n":"#),
                ]),
            ],
            "messages[2].tool_calls[1].arguments: cannot be written in the anthropic format: tool_use input must be JSON, and the arguments are not (EOF while parsing a value at line 1 column 5)",
        ),
        (
            vec![
                Message::assistant_tool_calls(vec![ToolCall::new("c1", "f", "{}")]),
                Message::tool_result("c1", "ok"),
                {
                    let mut user = Message::user("next");
                    user.extra.insert("x_id".into(), json!(1));
                    user
                },
            ],
            "messages[2].extra: cannot be written in the anthropic format: a user message merged into a tool-result turn cannot keep message-level fields",
        ),
    ];
    let mut user_with_calls = Message::user("hi");
    user_with_calls.tool_calls = vec![ToolCall::new("c1", "f", "{}")];
    cases.push((
        vec![user_with_calls],
        "messages[0].tool_calls: cannot be written in the anthropic format: only assistant messages can carry tool calls",
    ));
    for (messages, expected) in cases {
        let error = anthropic::to_request(&messages).expect_err("not expressible");
        assert_eq!(error.to_string(), expected);
    }
}

#[test]
fn invalid_arguments_from_openai_sample_stop_the_anthropic_export() {
    let path = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/tests/data/formats/openai_reasoning_vendor.json"
    );
    let wire: Value = serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap();
    let messages = openai::parse_messages(&wire).unwrap();
    let error = anthropic::to_request(&messages).unwrap_err();
    assert_eq!(error.path(), "messages[4].tool_calls[0].arguments");
}
