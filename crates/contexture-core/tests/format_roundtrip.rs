//! Round trips of realistic wire samples (`tests/data/formats/`) through the neutral model.
//!
//! Every `openai_*.json` (an array of chat-completions messages) and every `anthropic_*.json`
//! (a Messages API request body) must come back from the neutral model exactly: equal as JSON
//! values and, pretty-printed, byte for byte (so key order is kept too).

use std::path::{Path, PathBuf};

use contexture_core::format::{WireFormat, anthropic, openai};
use contexture_core::{Content, Message, Part, Role};
use serde_json::{Map, Value};

fn data_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/data/formats")
}

fn samples(prefix: &str) -> Vec<(String, Value)> {
    let mut found: Vec<(String, Value)> = std::fs::read_dir(data_dir())
        .expect("tests/data/formats exists")
        .map(|entry| entry.expect("directory entry").path())
        .filter(|path| {
            let name = path.file_name().and_then(|n| n.to_str()).unwrap_or("");
            name.starts_with(prefix) && name.ends_with(".json")
        })
        .map(|path| {
            let text = std::fs::read_to_string(&path).expect("sample is readable");
            let value =
                serde_json::from_str(&text).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
            (path.display().to_string(), value)
        })
        .collect();
    found.sort_by(|a, b| a.0.cmp(&b.0));
    assert!(
        found.len() >= 3,
        "expected several {prefix}*.json samples, found {}",
        found.len()
    );
    found
}

fn sample(name: &str) -> Value {
    sample_at(&data_dir().join(name))
}

fn sample_at(path: &Path) -> Value {
    let text = std::fs::read_to_string(path).expect("sample is readable");
    serde_json::from_str(&text).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

fn assert_exact(name: &str, expected: &Value, actual: &Value) {
    assert_eq!(actual, expected, "{name}: values differ");
    assert_eq!(
        serde_json::to_string_pretty(actual).unwrap(),
        serde_json::to_string_pretty(expected).unwrap(),
        "{name}: key order differs"
    );
}

/// The `system` and `messages` of a request body, which is what the format reads and writes.
fn conversation_of(body: &Value) -> Value {
    let mut kept = Map::new();
    for key in ["system", "messages"] {
        if let Some(value) = body.get(key) {
            kept.insert(key.to_owned(), value.clone());
        }
    }
    Value::Object(kept)
}

#[test]
fn openai_samples_round_trip_exactly() {
    for (name, wire) in samples("openai_") {
        let messages = openai::parse_messages(&wire).unwrap_or_else(|e| panic!("{name}: {e}"));
        assert_exact(&name, &wire, &openai::to_values(&messages));
        // Each message also round trips alone.
        for (message, original) in messages.iter().zip(wire.as_array().unwrap()) {
            assert_eq!(&openai::to_value(message), original, "{name}");
            assert_eq!(&openai::parse_message(original).unwrap(), message, "{name}");
        }
    }
}

#[test]
fn neutral_messages_survive_the_storage_form() {
    // What the store saves (serde of Message) must also keep everything a wire format read.
    for (name, wire) in samples("openai_") {
        let messages = openai::parse_messages(&wire).unwrap();
        let stored = serde_json::to_string(&messages).unwrap();
        let loaded: Vec<Message> = serde_json::from_str(&stored).unwrap();
        assert_eq!(loaded, messages, "{name}");
        assert_exact(&name, &wire, &openai::to_values(&loaded));
    }
    for (name, body) in samples("anthropic_") {
        let messages = anthropic::parse_request(&body).unwrap();
        let stored = serde_json::to_string(&messages).unwrap();
        let loaded: Vec<Message> = serde_json::from_str(&stored).unwrap();
        assert_eq!(loaded, messages, "{name}");
    }
}

#[test]
fn anthropic_samples_round_trip_exactly() {
    for (name, body) in samples("anthropic_") {
        let messages = anthropic::parse_request(&body).unwrap_or_else(|e| panic!("{name}: {e}"));
        let written = anthropic::to_request(&messages).unwrap_or_else(|e| panic!("{name}: {e}"));
        assert_exact(&name, &conversation_of(&body), &written);
    }
}

#[test]
fn anthropic_samples_through_openai_and_back() {
    // Anthropic -> neutral -> OpenAI -> neutral -> Anthropic loses nothing either.
    for (name, body) in samples("anthropic_") {
        let messages = anthropic::parse_request(&body).unwrap();
        let via_openai = openai::parse_messages(&openai::to_values(&messages)).unwrap();
        assert_eq!(via_openai, messages, "{name}");
        assert_exact(
            &name,
            &conversation_of(&body),
            &anthropic::to_request(&via_openai).unwrap(),
        );
    }
}

#[test]
fn anthropic_agent_loop_maps_to_calls_and_results() {
    let body = sample("anthropic_agent_loop.json");
    let messages = anthropic::parse_request(&body).unwrap();
    let roles: Vec<Role> = messages.iter().map(|m| m.role).collect();
    assert_eq!(
        roles,
        [
            Role::System,
            Role::User,
            Role::Assistant,
            Role::Tool,
            Role::Tool,
            Role::User,
            Role::Assistant,
            Role::User
        ]
    );
    let calls = &messages[2].tool_calls;
    assert_eq!(calls.len(), 2);
    assert_eq!(&*calls[0].id, "toolu_01A09q90qw90lq917835lq9");
    assert_eq!(
        &*calls[0].arguments,
        r#"{"service":"checkout-api","query":"level:error","since_minutes":60}"#
    );
    let Some(Content::Parts(parts)) = &messages[2].content else {
        panic!("assistant content is parts");
    };
    assert!(matches!(
        &parts[0],
        Part::Reasoning {
            signature: Some(_),
            ..
        }
    ));
    assert_eq!(
        messages[3].tool_call_id.as_deref(),
        Some("toolu_01A09q90qw90lq917835lq9")
    );
    assert_eq!(messages[4].extra.get("is_error"), Some(&Value::Bool(true)));
    assert_eq!(
        messages[5].text(),
        "Also, the status page mentioned a Stripe incident."
    );
}

#[test]
fn openai_converts_to_anthropic() {
    let wire = sample("openai_portable.json");
    let expected = sample("converted/openai_portable.anthropic.json");
    let messages = openai::parse_messages(&wire).unwrap();
    let written = anthropic::to_request(&messages).unwrap();
    assert_exact("openai_portable -> anthropic", &expected, &written);

    // Reading the Anthropic form back gives the OpenAI conversation minus what does not map:
    // the user's `name`, the image `detail`, the developer role and the split system prompt.
    let back = anthropic::parse_request(&written).unwrap();
    assert_eq!(back.len(), messages.len() - 1);
    assert_eq!(back[0].role, Role::System);
    assert_eq!(back[1].name, None);
    assert_eq!(messages[2].name.as_deref(), Some("maria"));
    for (converted, original) in back[2..].iter().zip(&messages[3..]) {
        assert_eq!(converted.role, original.role);
        assert_eq!(converted.tool_call_id, original.tool_call_id);
        assert_eq!(converted.text(), original.text());
        let ids = |m: &Message| {
            m.tool_calls
                .iter()
                .map(|c| c.id.clone())
                .collect::<Vec<_>>()
        };
        assert_eq!(ids(converted), ids(original));
    }
}

#[test]
fn openai_vendor_sample_keeps_unknown_fields() {
    let wire = sample("openai_reasoning_vendor.json");
    let messages = openai::parse_messages(&wire).unwrap();
    assert!(messages[2].extra.contains_key("reasoning_content"));
    assert_eq!(
        messages[2].tool_calls[0].extra.get("index"),
        Some(&Value::from(0))
    );
    assert!(messages[4].content_omitted);
    assert_eq!(messages[4].content, None);
    assert_eq!(messages[3].name.as_deref(), Some("is_prime"));
    // The second call's arguments are not valid JSON: kept verbatim, not repaired.
    assert_eq!(
        &*messages[4].tool_calls[0].arguments,
        r#"{"n":"2305843009213693953""#
    );
}

#[test]
fn wire_formats_by_name() {
    for format in WireFormat::ALL {
        assert_eq!(WireFormat::from_name(format.name()), Ok(format));
        assert_eq!(format.to_string().parse::<WireFormat>(), Ok(format));
    }
    let error = WireFormat::from_name("gemini").unwrap_err();
    assert_eq!(
        error.to_string(),
        "unknown message format `gemini` (known formats: openai, anthropic)"
    );

    let wire = sample("openai_agent_loop.json");
    let messages = WireFormat::OpenAi.parse(&wire).unwrap();
    assert_eq!(WireFormat::OpenAi.write(&messages).unwrap(), wire);
    let body = serde_json::json!({"model": "gpt-4.1", "messages": wire.clone(), "tools": []});
    assert_eq!(WireFormat::OpenAi.parse(&body).unwrap(), messages);
    assert_eq!(
        WireFormat::OpenAi
            .parse(&serde_json::json!({"model": "gpt-4.1"}))
            .unwrap_err()
            .to_string(),
        "messages: missing required field"
    );

    let body = sample("anthropic_multimodal.json");
    let messages = WireFormat::Anthropic.parse(&body).unwrap();
    assert_eq!(
        WireFormat::Anthropic.write(&messages).unwrap(),
        conversation_of(&body)
    );
    assert_eq!(
        WireFormat::Anthropic.parse(&wire).unwrap_err().to_string(),
        "request: expected an object, found an array"
    );
}

#[test]
fn neutral_forms_are_pinned() {
    // The neutral (storage) form of every sample, as a reviewable snapshot of the mapping.
    insta::glob!("data/formats/openai_*.json", |path| {
        let wire = sample_at(path);
        let messages = openai::parse_messages(&wire).unwrap();
        insta::assert_json_snapshot!(messages);
    });
    insta::glob!("data/formats/anthropic_*.json", |path| {
        let body = sample_at(path);
        let messages = anthropic::parse_request(&body).unwrap();
        insta::assert_json_snapshot!(messages);
    });
}
