//! OpenAI Responses items: read into messages and written back as they were (round trips),
//! one assistant turn of several items as one message, and bad items named by their place.

use contexture_core::format::{openai, responses};
use contexture_core::message::{Content, Part, Role};
use serde_json::{Value, json};

/// A conversation as the OpenAI Agents SDK sends it: a developer prompt, a user turn with an
/// image, an assistant turn of reasoning, text and two function calls, their outputs, and
/// the final answer as the API returned it (ids, status, annotations).
fn agent_items() -> Value {
    json!([
        {"type": "message", "role": "developer", "content": "You are a weather agent."},
        {"type": "message", "role": "user", "content": [
            {"type": "input_text", "text": "Weather in Lisbon and Porto? Here is a map."},
            {"type": "input_image", "image_url": "https://example.com/map.png", "detail": "low"}
        ]},
        {"type": "reasoning", "id": "rs_1", "summary": [{"type": "summary_text", "text": "Two cities: two calls."}], "encrypted_content": "gAAAA-opaque"},
        {"type": "message", "id": "msg_1", "status": "completed", "role": "assistant", "content": [
            {"type": "output_text", "text": "Checking both.", "annotations": []}
        ]},
        {"type": "function_call", "id": "fc_1", "call_id": "call_a", "name": "weather", "arguments": "{\"city\":\"Lisbon\"}", "status": "completed"},
        {"type": "function_call", "id": "fc_2", "call_id": "call_b", "name": "weather", "arguments": "{\"city\":\"Porto\"}", "status": "completed"},
        {"type": "function_call_output", "call_id": "call_a", "output": "Sunny, 24C"},
        {"type": "function_call_output", "call_id": "call_b", "output": [{"type": "input_text", "text": "Rain, 17C"}]},
        {"type": "message", "id": "msg_2", "status": "completed", "role": "assistant", "content": [
            {"type": "output_text", "text": "Lisbon is sunny; Porto has rain.", "annotations": [], "logprobs": []}
        ]},
        {"type": "message", "role": "user", "content": [
            {"type": "input_file", "file_id": "file-123"}
        ]}
    ])
}

#[test]
fn items_come_back_as_they_were_read() {
    let items = agent_items();
    let messages = responses::parse_items(&items, "input").unwrap();
    assert_eq!(Value::Array(responses::to_items(&messages)), items);
}

#[test]
fn one_assistant_turn_of_several_items_is_one_message() {
    let messages = responses::parse_items(&agent_items(), "input").unwrap();
    let roles: Vec<Role> = messages.iter().map(|message| message.role).collect();
    assert_eq!(
        roles,
        [
            Role::Developer,
            Role::User,
            Role::Assistant,
            Role::Tool,
            Role::Tool,
            Role::Assistant,
            Role::User
        ]
    );
    let turn = &messages[2];
    assert_eq!(turn.tool_calls.len(), 2);
    assert_eq!(&*turn.tool_calls[1].id, "call_b");
    let Some(Content::Parts(parts)) = &turn.content else {
        panic!("parts")
    };
    assert!(
        matches!(&parts[0], Part::Reasoning { text, redacted: Some(opaque), .. }
        if text == "Two cities: two calls." && opaque == "gAAAA-opaque")
    );
    assert_eq!(turn.text(), "Checking both.");
    assert_eq!(messages[3].tool_call_id.as_deref(), Some("call_a"));
    assert_eq!(messages[4].text(), "Rain, 17C");
    // The same conversation in chat completions: calls and results pair up.
    let chat = openai::to_values(&messages);
    assert_eq!(chat[2]["tool_calls"][1]["function"]["name"], "weather");
    assert_eq!(chat[4]["tool_call_id"], "call_b");
}

#[test]
fn a_string_input_is_one_user_message_and_items_need_no_type() {
    let messages = responses::parse_input(&json!("Hello")).unwrap();
    assert_eq!(messages.len(), 1);
    assert_eq!(messages[0].role, Role::User);
    assert_eq!(messages[0].text(), "Hello");
    // The SDKs' short form: `{role, content}` is a message item.
    let short =
        json!([{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Hello!"}]);
    let messages = responses::parse_input(&short).unwrap();
    assert_eq!(
        Value::Array(responses::to_items(&messages)),
        json!([
            {"type": "message", "role": "user", "content": "Hi"},
            {"type": "message", "role": "assistant", "content": "Hello!"}
        ])
    );
}

#[test]
fn chat_messages_are_written_as_items() {
    let chat = json!([
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "Weather?"},
        {"role": "assistant", "content": null, "tool_calls": [
            {"id": "c1", "type": "function", "function": {"name": "weather", "arguments": "{}"}}
        ]},
        {"role": "tool", "tool_call_id": "c1", "content": "Sunny"},
        {"role": "assistant", "content": "Sunny."}
    ]);
    let messages = openai::parse_messages(&chat).unwrap();
    assert_eq!(
        Value::Array(responses::to_items(&messages)),
        json!([
            {"type": "message", "role": "system", "content": "Be brief."},
            {"type": "message", "role": "user", "content": "Weather?"},
            {"type": "function_call", "call_id": "c1", "name": "weather", "arguments": "{}"},
            {"type": "function_call_output", "call_id": "c1", "output": "Sunny"},
            {"type": "message", "role": "assistant", "content": "Sunny."}
        ])
    );
}

#[test]
fn bad_items_are_named_by_their_place() {
    let cases = [
        (
            json!(42),
            "input: expected a string or an array of items, found a number",
        ),
        (json!([7]), "input[0]: expected an object, found a number"),
        (
            json!([{"type": "message", "role": "tool", "content": "x"}]),
            "input[0].role: unknown role `tool` (expected one of system, developer, user, assistant)",
        ),
        (
            json!([{"type": "message", "role": "user"}]),
            "input[0].content: missing required field",
        ),
        (
            json!([{"role": "user", "content": "a"}, {"type": "function_call", "call_id": "c", "name": "f"}]),
            "input[1].arguments: missing required field",
        ),
        (
            json!([{"type": "function_call_output", "call_id": "c", "output": 3}]),
            "input[0].output: expected a string or an array of parts, found a number",
        ),
        (
            json!([{"type": "web_search_call", "id": "ws_1"}]),
            "input[0].type: item type `web_search_call` is not supported (supported: message, function_call, function_call_output, reasoning, compaction)",
        ),
        (
            json!([{"type": "reasoning", "summary": [{"type": "summary_text"}]}]),
            "input[0].summary[0].text: missing required field",
        ),
        (
            json!([{"role": "user", "content": [{"type": "input_text", "text": 5}]}]),
            "input[0].content[0].text: expected a string, found a number",
        ),
    ];
    for (input, expected) in cases {
        let error = responses::parse_input(&input).unwrap_err();
        assert_eq!(error.to_string(), expected, "{input}");
    }
}

mod conversations {
    //! Property: a conversation in the shape the Responses API has (turns of user text and
    //! images, assistant turns of reasoning, text and function calls, their outputs) survives
    //! neutral → items → neutral unchanged, and its items survive items → neutral → items.

    use contexture_core::format::responses;
    use contexture_core::{Content, Message, Part, ToolCall};
    use proptest::prelude::*;
    use serde_json::{Map, Value, json};

    fn text() -> impl Strategy<Value = String> {
        prop_oneof![
            Just(String::new()),
            "[a-zA-Z0-9 _.,:{}\"-]{1,20}",
            Just("données 数据 🦀\r\n".to_owned()),
        ]
    }

    /// Item fields the model keeps verbatim (`id`, `status`, ...), never an item's own.
    fn bookkeeping() -> impl Strategy<Value = Map<String, Value>> {
        prop::collection::vec(
            (
                prop_oneof![Just("id"), Just("status"), Just("x_note")],
                "[a-z_0-9]{1,8}",
            ),
            0..3,
        )
        .prop_map(|entries| {
            entries
                .into_iter()
                .map(|(key, value)| (key.to_owned(), json!(value)))
                .collect()
        })
    }

    fn user() -> impl Strategy<Value = Message> {
        (
            prop_oneof![
                text().prop_map(|t| Content::Text(t.into())),
                prop::collection::vec(
                    prop_oneof![
                        text().prop_map(Part::text),
                        (text(), prop::option::of(Just("low".to_owned()))).prop_map(
                            |(url, detail)| Part::Image {
                                url: format!("https://example.com/{}", url.len()),
                                detail,
                                extra: Map::new(),
                            }
                        ),
                    ],
                    1..3
                )
                .prop_map(Content::Parts),
            ],
            bookkeeping(),
        )
            .prop_map(|(content, extra)| {
                let mut message = Message::user("");
                message.content = Some(content);
                message.extra = extra;
                message
            })
    }

    /// An assistant turn and the outputs of its calls.
    fn assistant_turn() -> impl Strategy<Value = Vec<Message>> {
        (
            prop::option::of((text(), prop::option::of("[A-Za-z0-9]{4,12}"))),
            prop::option::of(text()),
            prop::collection::vec(("[a-z]{1,6}", bookkeeping()), 0..3),
            bookkeeping(),
        )
            .prop_filter("a turn says something", |(reasoning, said, calls, _)| {
                reasoning.is_some() || said.is_some() || !calls.is_empty()
            })
            .prop_map(|(reasoning, said, calls, extra)| {
                let mut parts = Vec::new();
                if let Some((text, redacted)) = reasoning {
                    parts.push(Part::Reasoning {
                        text,
                        signature: None,
                        redacted,
                        extra: Map::new(),
                    });
                }
                let reasoned = !parts.is_empty();
                // An empty text beside calls is no message item (as the API writes such a turn).
                let said = said.filter(|said| !(said.is_empty() && !reasoned && !calls.is_empty()));
                let has_item = said.is_some();
                let mut message = Message::assistant("");
                message.content = match (said, reasoned) {
                    (Some(said), true) => {
                        parts.push(Part::text(said));
                        Some(Content::Parts(parts))
                    }
                    (None, true) => Some(Content::Parts(parts)),
                    (Some(said), false) => Some(Content::Text(said.into())),
                    (None, false) => None,
                };
                message.tool_calls = calls
                    .iter()
                    .enumerate()
                    .map(|(n, (name, extra))| {
                        let mut call = ToolCall::new(format!("call_{n}"), name.as_str(), "{}");
                        call.extra = extra.clone();
                        call
                    })
                    .collect();
                // Item fields belong to the message item, which a turn without text has not.
                if has_item {
                    message.extra = extra;
                }
                let mut turn = vec![message];
                for n in 0..calls.len() {
                    turn.push(Message::tool_result(
                        format!("call_{n}"),
                        format!("out {n}"),
                    ));
                }
                turn
            })
    }

    fn conversation() -> impl Strategy<Value = Vec<Message>> {
        prop::collection::vec((user(), assistant_turn()), 0..4).prop_map(|turns| {
            turns
                .into_iter()
                .flat_map(|(user, turn)| std::iter::once(user).chain(turn))
                .collect()
        })
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(256))]

        #[test]
        fn conversations_survive_items(messages in conversation()) {
            let items = responses::to_items(&messages);
            let read = responses::parse_items(&Value::Array(items.clone()), "input").unwrap();
            prop_assert_eq!(&read, &messages);
            prop_assert_eq!(responses::to_items(&read), items);
        }
    }
}

#[test]
fn a_compaction_item_is_its_summary_as_a_user_message_and_comes_back_whole() {
    let items = json!([
        {"id": "cmp_1", "type": "compaction", "encrypted_content": "Summary: node-7 was restarted.",
         "created_by": "contexture"},
        {"type": "message", "role": "user", "content": "And now?"}
    ]);
    let messages = responses::parse_items(&items, "input").unwrap();
    assert_eq!(messages.len(), 2);
    assert_eq!(messages[0].role, Role::User);
    assert_eq!(messages[0].text(), "Summary: node-7 was restarted.");
    assert_eq!(
        responses::to_items(&messages),
        items.as_array().unwrap().clone()
    );
    let missing = responses::parse_items(&json!([{"type": "compaction"}]), "input").unwrap_err();
    assert_eq!(missing.path(), "input[0].encrypted_content");
}
