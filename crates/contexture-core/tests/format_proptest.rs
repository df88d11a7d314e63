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
        text().prop_map(|t| Content::Text(t.into())),
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
                id: id.into(),
                name: name.into(),
                arguments: arguments.into(),
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
        message.tool_call_id = tool_call_id.map(Into::into);
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
            text().prop_map(|t| Some(Content::Text(t.into()))),
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
            message.content = body.map(|t| Content::Text(t.into()));
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

/// JSON built from the formats' own vocabulary (keys, roles, part types), so that random
/// values often get deep into the readers instead of failing at the first field.
fn wire_like() -> impl Strategy<Value = Value> {
    let word = prop_oneof![
        Just("system"),
        Just("developer"),
        Just("user"),
        Just("assistant"),
        Just("tool"),
        Just("text"),
        Just("image_url"),
        Just("image"),
        Just("reasoning"),
        Just("thinking"),
        Just("redacted_thinking"),
        Just("tool_use"),
        Just("tool_result"),
        Just("function"),
        Just("base64"),
        Just("url"),
        Just("data:image/png;base64,AAAA"),
        Just("{\"a\":1}"),
        Just("x"),
    ];
    let key = prop_oneof![
        Just("role"),
        Just("content"),
        Just("name"),
        Just("tool_calls"),
        Just("tool_call_id"),
        Just("type"),
        Just("text"),
        Just("image_url"),
        Just("url"),
        Just("detail"),
        Just("id"),
        Just("function"),
        Just("arguments"),
        Just("source"),
        Just("media_type"),
        Just("data"),
        Just("thinking"),
        Just("signature"),
        Just("input"),
        Just("tool_use_id"),
        Just("is_error"),
        Just("system"),
        Just("messages"),
        Just("x_extra"),
    ];
    let leaf = prop_oneof![
        Just(Value::Null),
        any::<bool>().prop_map(Value::from),
        (-5i64..5).prop_map(Value::from),
        word.prop_map(Value::from),
    ];
    leaf.prop_recursive(5, 64, 6, move |inner| {
        prop_oneof![
            prop::collection::vec(inner.clone(), 0..4).prop_map(Value::Array),
            prop::collection::vec((key.clone(), inner), 0..6).prop_map(|entries| {
                Value::Object(
                    entries
                        .into_iter()
                        .map(|(k, v)| (k.to_owned(), v))
                        .collect(),
                )
            }),
        ]
    })
}

/// Usually `valid`, sometimes any wire-like value, sometimes absent: mostly well-formed input
/// with a few wrong or missing fields, to reach every branch of the readers.
fn field(valid: BoxedStrategy<Value>) -> impl Strategy<Value = Option<Value>> {
    prop_oneof![
        40 => valid.prop_map(Some),
        1 => wire_like().prop_map(Some),
        2 => Just(None),
    ]
}

fn object(fields: Vec<(&'static str, BoxedStrategy<Option<Value>>)>) -> BoxedStrategy<Value> {
    let (keys, values): (Vec<_>, Vec<_>) = fields.into_iter().unzip();
    (
        values,
        prop::collection::vec(("x_[a-z]{1,3}", json_value()), 0..2),
    )
        .prop_map(move |(values, extra)| {
            let mut object: Map<String, Value> = keys
                .iter()
                .zip(values)
                .filter_map(|(key, value)| value.map(|value| ((*key).to_owned(), value)))
                .collect();
            object.extend(extra);
            Value::Object(object)
        })
        .boxed()
}

fn string_of(choices: &'static [&'static str]) -> BoxedStrategy<Value> {
    prop::sample::select(choices).prop_map(Value::from).boxed()
}

fn openai_like_message() -> BoxedStrategy<Value> {
    let part = object(vec![
        (
            "type",
            field(string_of(&[
                "text",
                "image_url",
                "reasoning",
                "input_audio",
            ]))
            .boxed(),
        ),
        ("text", field(text().prop_map(Value::from).boxed()).boxed()),
        (
            "image_url",
            field(object(vec![
                ("url", field(text().prop_map(Value::from).boxed()).boxed()),
                ("detail", field(string_of(&["low", "high"])).boxed()),
            ]))
            .boxed(),
        ),
        (
            "signature",
            field(text().prop_map(Value::from).boxed()).boxed(),
        ),
    ]);
    let call = object(vec![
        ("id", field(text().prop_map(Value::from).boxed()).boxed()),
        ("type", field(string_of(&["function", "custom"])).boxed()),
        (
            "function",
            field(object(vec![
                ("name", field(text().prop_map(Value::from).boxed()).boxed()),
                (
                    "arguments",
                    field(text().prop_map(Value::from).boxed()).boxed(),
                ),
            ]))
            .boxed(),
        ),
    ]);
    let content = prop_oneof![
        text().prop_map(Value::from),
        Just(Value::Null),
        prop::collection::vec(part, 0..3).prop_map(Value::Array),
    ]
    .boxed();
    object(vec![
        (
            "role",
            field(string_of(&[
                "system",
                "developer",
                "user",
                "assistant",
                "tool",
                "function",
            ]))
            .boxed(),
        ),
        (
            "tool_call_id",
            field(text().prop_map(Value::from).boxed()).boxed(),
        ),
        ("name", field(text().prop_map(Value::from).boxed()).boxed()),
        ("content", field(content).boxed()),
        (
            "tool_calls",
            field(
                prop::collection::vec(call, 0..3)
                    .prop_map(Value::Array)
                    .boxed(),
            )
            .boxed(),
        ),
    ])
}

fn anthropic_like_body() -> BoxedStrategy<Value> {
    let text_value = || field(text().prop_map(Value::from).boxed()).boxed();
    let source = object(vec![
        ("type", field(string_of(&["base64", "url", "file"])).boxed()),
        (
            "media_type",
            field(string_of(&["image/png", "image/jpeg", "a;b"])).boxed(),
        ),
        ("data", text_value()),
        (
            "url",
            field(string_of(&[
                "https://x.example/a.png",
                "data:image/png;base64,AA",
            ]))
            .boxed(),
        ),
    ]);
    let simple_block = object(vec![
        (
            "type",
            field(string_of(&["text", "image", "document"])).boxed(),
        ),
        ("text", text_value()),
        ("source", field(source.clone()).boxed()),
    ]);
    let kind = |name: &'static str| field(Just(Value::from(name)).boxed()).boxed();
    let result_content = field(
        prop_oneof![
            text().prop_map(Value::from),
            prop::collection::vec(simple_block.clone(), 0..3).prop_map(Value::Array),
        ]
        .boxed(),
    )
    .boxed();
    let text_block = object(vec![("type", kind("text")), ("text", text_value())]);
    let user_block = prop_oneof![
        text_block.clone(),
        object(vec![
            ("type", kind("image")),
            ("source", field(source).boxed())
        ]),
        object(vec![
            ("type", kind("tool_result")),
            ("tool_use_id", text_value()),
            ("content", result_content),
            (
                "is_error",
                field(any::<bool>().prop_map(Value::from).boxed()).boxed()
            ),
        ]),
    ];
    let assistant_block = prop_oneof![
        text_block,
        object(vec![
            ("type", kind("thinking")),
            ("thinking", text_value()),
            ("signature", text_value()),
        ]),
        object(vec![
            ("type", kind("redacted_thinking")),
            ("data", text_value())
        ]),
        object(vec![
            ("type", kind("tool_use")),
            ("id", text_value()),
            ("name", text_value()),
            ("input", field(json_value().boxed()).boxed()),
        ]),
        object(vec![
            ("type", kind("server_tool_use")),
            ("id", text_value())
        ]),
    ];
    let content = |blocks: BoxedStrategy<Value>| {
        field(
            prop_oneof![
                1 => text().prop_map(Value::from),
                3 => prop::collection::vec(blocks, 0..4).prop_map(Value::Array),
            ]
            .boxed(),
        )
        .boxed()
    };
    let strip_extra = |turn: Value| match turn {
        // Only turns without tool results may keep turn-level fields: keep some of both.
        Value::Object(mut object) if object.keys().any(|k| k.starts_with("x_")) => {
            let has_results = object
                .get("content")
                .and_then(Value::as_array)
                .is_some_and(|blocks| blocks.iter().any(|b| b["type"] == "tool_result"));
            if has_results {
                object.retain(|k, _| !k.starts_with("x_"));
            }
            Value::Object(object)
        }
        other => other,
    };
    let turn = prop_oneof![
        4 => object(vec![("role", kind("user")), ("content", content(user_block.boxed()))])
            .prop_map(strip_extra),
        4 => object(vec![("role", kind("assistant")), ("content", content(assistant_block.boxed()))]),
        1 => object(vec![("role", kind("system")), ("content", content(simple_block.clone()))]),
    ];
    object(vec![
        (
            "system",
            field(
                prop_oneof![
                    text().prop_map(Value::from),
                    prop::collection::vec(simple_block, 0..3).prop_map(Value::Array),
                ]
                .boxed(),
            )
            .boxed(),
        ),
        (
            "messages",
            field(
                prop::collection::vec(turn, 0..5)
                    .prop_map(Value::Array)
                    .boxed(),
            )
            .boxed(),
        ),
    ])
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(4096))]

    /// Any input the OpenAI reader accepts is written back as an equal value.
    #[test]
    fn openai_reader_accepts_only_what_it_can_write_back(
        value in prop_oneof![
            1 => wire_like(),
            3 => openai_like_message(),
            3 => prop::collection::vec(openai_like_message(), 0..4).prop_map(Value::Array),
        ]
    ) {
        let messages = match &value {
            Value::Array(_) => openai::parse_messages(&value),
            _ => openai::parse_message(&value).map(|message| vec![message]),
        };
        if let Ok(messages) = messages {
            let written = match &value {
                Value::Array(_) => openai::to_values(&messages),
                _ => openai::to_value(&messages[0]),
            };
            prop_assert_eq!(written, value);
        }
    }

    /// The Anthropic reader and writer never panic, whatever they are given, and what the
    /// writer produces is read back and written again unchanged (writing normalizes once:
    /// consecutive user turns holding tool results merge, tool_use blocks move last).
    #[test]
    fn anthropic_writer_output_is_a_fixed_point(
        value in prop_oneof![1 => wire_like(), 4 => anthropic_like_body()]
    ) {
        if let Ok(messages) = anthropic::parse_request(&value)
            && let Ok(written) = anthropic::to_request(&messages)
        {
            let reread = anthropic::parse_request(&written);
            prop_assert!(reread.is_ok(), "{:?}", reread);
            let rewritten = anthropic::to_request(&reread.unwrap());
            prop_assert_eq!(rewritten, Ok(written));
        }
        if let Ok(messages) = openai::parse_messages(&value) {
            let _ = anthropic::to_request(&messages);
        }
    }
}
