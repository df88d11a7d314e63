//! Property: any neutral message the OpenAI format can hold survives neutral → OpenAI →
//! (JSON text) → neutral unchanged, and any conversation in the Anthropic shape survives
//! neutral → Anthropic → neutral unchanged.
//!
//! "Can hold" excludes only what the formats document as theirs: `extra` keys that are the
//! format's own field names, and [`Part::Other`] values that look like known parts.
//! [`contexture_core::Metadata`] is Contexture's own and never travels in a wire format.

use contexture_core::format::{anthropic, openai};
use contexture_core::{Content, Message, Part, Role, ToolCall};
use proptest::prelude::*;
use serde_json::{Map, Value};

fn text() -> impl Strategy<Value = String> {
    prop_oneof![
        Just(String::new()),
        "[a-zA-Z0-9 _.,:{}\"\\\\-]{0,24}",
        any::<String>().prop_map(|s| s.chars().take(16).collect()),
        Just("données 数据 🦀\r\n\t".to_owned()),
    ]
}

fn json_value() -> impl Strategy<Value = Value> {
    let leaf = prop_oneof![
        Just(Value::Null),
        any::<bool>().prop_map(Value::from),
        any::<i64>().prop_map(Value::from),
        (-1000i32..1000).prop_map(|n| Value::from(f64::from(n) / 8.0)),
        text().prop_map(Value::from),
    ];
    leaf.prop_recursive(3, 16, 4, |inner| {
        prop_oneof![
            prop::collection::vec(inner.clone(), 0..4).prop_map(Value::Array),
            prop::collection::vec(("[a-z_]{1,6}", inner), 0..4)
                .prop_map(|entries| Value::Object(entries.into_iter().collect())),
        ]
    })
}

/// An `extra` map without the given reserved keys.
fn extra(reserved: &'static [&'static str]) -> impl Strategy<Value = Map<String, Value>> {
    prop::collection::vec(("x_[a-z]{1,5}|[a-z]{1,8}", json_value()), 0..3).prop_map(
        move |entries| {
            entries
                .into_iter()
                .filter(|(key, _)| !reserved.contains(&key.as_str()))
                .collect()
        },
    )
}

fn part() -> impl Strategy<Value = Part> {
    prop_oneof![
        (text(), extra(&["type", "text"])).prop_map(|(text, extra)| Part::Text { text, extra }),
        (
            text(),
            prop::option::of(prop_oneof![Just("low"), Just("high"), Just("auto")]),
            extra(&["type", "image_url"])
        )
            .prop_map(|(url, detail, extra)| Part::Image {
                url,
                detail: detail.map(str::to_owned),
                extra
            }),
        (
            text(),
            prop::option::of(text()),
            prop::option::of(text()),
            extra(&["type", "text", "signature", "redacted"])
        )
            .prop_map(|(text, signature, redacted, extra)| Part::Reasoning {
                text,
                signature,
                redacted,
                extra
            }),
        ("input_audio|file|x_[a-z]{1,6}", extra(&["type"])).prop_map(|(kind, mut fields)| {
            fields.shift_insert(0, "type".into(), Value::from(kind));
            Part::Other {
                value: Value::Object(fields),
            }
        }),
    ]
}

fn content() -> impl Strategy<Value = Content> {
    prop_oneof![
        text().prop_map(Content::Text),
        prop::collection::vec(part(), 0..4).prop_map(Content::Parts),
    ]
}

fn tool_call() -> impl Strategy<Value = ToolCall> {
    (
        text(),
        text(),
        text(),
        extra(&["id", "type", "function"]),
        prop::option::of(extra(&["name", "arguments"])),
    )
        .prop_map(|(id, name, arguments, mut extra, function_extra)| {
            if let Some(function_extra) = function_extra.filter(|f| !f.is_empty()) {
                extra.insert("function".into(), Value::Object(function_extra));
            }
            ToolCall {
                id,
                name,
                arguments,
                extra,
            }
        })
}

fn role() -> impl Strategy<Value = Role> {
    prop_oneof![
        Just(Role::System),
        Just(Role::Developer),
        Just(Role::User),
        Just(Role::Assistant),
        Just(Role::Tool),
    ]
}

const MESSAGE_FIELDS: &[&str] = &["role", "content", "name", "tool_calls", "tool_call_id"];

prop_compose! {
    fn message()(
        role in role(),
        content in prop::option::of(content()),
        content_omitted in any::<bool>(),
        name in prop::option::of(text()),
        tool_calls in prop::collection::vec(tool_call(), 0..3),
        tool_call_id in prop::option::of(text()),
        extra in extra(MESSAGE_FIELDS),
    ) -> Message {
        let mut message = Message::new(role, "");
        message.content_omitted = content.is_none() && content_omitted;
        message.content = content;
        message.name = name;
        message.tool_calls = tool_calls;
        message.tool_call_id = tool_call_id;
        message.extra = extra;
        message
    }
}

/// A conversation in the shape the Anthropic format reads: optional system, then user turns
/// (a text, or text parts and tool results in any order) and assistant turns (content and
/// tool calls with JSON-object arguments).
fn anthropic_conversation() -> impl Strategy<Value = Vec<Message>> {
    let anthropic_part = prop_oneof![
        text().prop_map(Part::text),
        (text(), extra(&["type", "thinking", "signature"])).prop_map(|(text, extra)| {
            Part::Reasoning {
                text,
                signature: Some("sig".into()),
                redacted: None,
                extra,
            }
        }),
        "[a-z]{1,8}".prop_map(|data| Part::Reasoning {
            text: String::new(),
            signature: None,
            redacted: Some(data),
            extra: Map::new(),
        }),
        "[A-Za-z0-9+/]{4,12}".prop_map(|data| Part::image(format!("data:image/png;base64,{data}"))),
        "https://[a-z]{1,8}\\.example/[a-z]{1,8}\\.jpg".prop_map(Part::image),
    ];
    let parts = prop::collection::vec(anthropic_part, 1..3);
    let arguments = prop::collection::vec(("[a-z]{1,6}", json_value()), 0..3).prop_map(|entries| {
        Value::Object(entries.into_iter().collect::<Map<String, Value>>()).to_string()
    });
    let call = ("toolu_[a-z0-9]{4}", "[a-z_]{1,10}", arguments)
        .prop_map(|(id, name, arguments)| ToolCall::new(id, name, arguments));
    let assistant = (
        prop_oneof![
            text().prop_map(|t| Some(Content::Text(t))),
            parts.clone().prop_map(|p| Some(Content::Parts(p))),
        ],
        prop::collection::vec(call, 0..3),
    )
        .prop_map(|(content, calls)| {
            let mut message = Message::assistant("");
            message.content = match content {
                Some(Content::Text(_)) if !calls.is_empty() => Some(Content::Parts(Vec::new())),
                other => other,
            };
            message.tool_calls = calls;
            vec![message]
        });
    let tool_result = ("toolu_[a-z0-9]{4}", prop::option::of(text()), any::<bool>()).prop_map(
        |(id, body, is_error)| {
            let mut message = Message::tool_result(id, "");
            message.content = body.map(Content::Text);
            message.content_omitted = message.content.is_none();
            if is_error {
                message.extra.insert("is_error".into(), Value::Bool(true));
            }
            message
        },
    );
    let with_results = prop::collection::vec(
        prop_oneof![
            tool_result.prop_map(Some),
            parts.clone().prop_map(|p| {
                let mut message = Message::user("");
                message.content = Some(Content::Parts(p));
                Some(message)
            }),
        ],
        1..4,
    )
    .prop_map(|items| {
        // Adjacent user messages inside one turn would be one run of blocks: merge them.
        let mut turn: Vec<Message> = Vec::new();
        let mut has_result = false;
        for message in items.into_iter().flatten() {
            has_result |= message.role == Role::Tool;
            match (turn.last_mut(), &message.content) {
                (Some(last), Some(Content::Parts(more)))
                    if last.role == Role::User && message.role == Role::User =>
                {
                    if let Some(Content::Parts(parts)) = &mut last.content {
                        parts.extend(more.iter().cloned());
                    }
                }
                _ => turn.push(message),
            }
        }
        if !has_result {
            turn.push(Message::tool_result("toolu_last", "done"));
        }
        turn
    });
    let user_turn = prop_oneof![text().prop_map(|t| vec![Message::user(t)]), with_results];
    (
        prop::option::of(text()),
        prop::collection::vec(prop_oneof![user_turn, assistant], 0..6),
    )
        .prop_map(|(system, turns)| {
            let mut messages: Vec<Message> = system.map(Message::system).into_iter().collect();
            for turn in turns {
                // Two tool-result turns in a row would be written as one: keep them apart.
                let touches_results = |m: &Message| matches!(m.role, Role::Tool | Role::User);
                let previous_is_result_turn = messages.last().is_some_and(touches_results)
                    && messages
                        .iter()
                        .rev()
                        .take_while(|m| touches_results(m))
                        .any(|m| m.role == Role::Tool);
                let next_is_user_side = turn.first().is_some_and(touches_results);
                let next_has_results = turn.iter().any(|m| m.role == Role::Tool);
                if next_is_user_side
                    && (previous_is_result_turn
                        || (next_has_results && messages.last().is_some_and(touches_results)))
                {
                    messages.push(Message::assistant("ok"));
                }
                messages.extend(turn);
            }
            messages
        })
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(512))]

    #[test]
    fn neutral_survives_openai(messages in prop::collection::vec(message(), 0..5)) {
        let wire = openai::to_values(&messages);
        let text = serde_json::to_string(&wire).unwrap();
        let reread: Value = serde_json::from_str(&text).unwrap();
        let back = openai::parse_messages(&reread).unwrap();
        prop_assert_eq!(back, messages);
    }

    #[test]
    fn anthropic_shaped_conversations_survive_anthropic(messages in anthropic_conversation()) {
        let body = anthropic::to_request(&messages).unwrap();
        let back = anthropic::parse_request(&body).unwrap();
        prop_assert_eq!(&back, &messages);
        prop_assert_eq!(anthropic::to_request(&back).unwrap(), body);
    }
}
