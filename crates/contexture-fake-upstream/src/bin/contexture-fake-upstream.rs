//! The fake upstream in a process of its own, for benchmarks of the chat endpoint and for
//! the tests of programs in other languages (the Python package's):
//!
//! ```text
//! contexture-fake-upstream [ADDRESS] [--script FILE] [--record FILE]
//! ```
//!
//! It listens on ADDRESS (default `127.0.0.1:18090`) and runs until it is stopped. Call N to
//! a model is answered by the script's Nth reply when there is one, else by a short text
//! with its usage, whole or streamed as the request asks. The script is a JSON array of
//! replies, each `{"text": "..."}` and/or `{"tool_calls": [{"id", "name", "arguments"}]}`.
//! With `--record`, each call's request body is appended to FILE as one JSON line, so a
//! test can read what a client sent; without it no request is kept.

use std::io::Write;
use std::sync::{Arc, Mutex};

use contexture_fake_upstream::{FakeUpstream, Reply};
use serde_json::Value;

/// What the command line asks for.
struct Options {
    address: String,
    script: Vec<Value>,
    record: Option<std::fs::File>,
}

fn options() -> Result<Options, String> {
    let mut options = Options {
        address: "127.0.0.1:18090".to_owned(),
        script: Vec::new(),
        record: None,
    };
    let mut arguments = std::env::args().skip(1);
    while let Some(argument) = arguments.next() {
        match argument.as_str() {
            "--script" => {
                let path = arguments.next().ok_or("--script: a FILE is needed")?;
                let text = std::fs::read_to_string(&path)
                    .map_err(|error| format!("--script {path}: {error}"))?;
                options.script = match serde_json::from_str(&text) {
                    Ok(Value::Array(replies)) => replies,
                    Ok(_) => return Err(format!("--script {path}: not a JSON array of replies")),
                    Err(error) => return Err(format!("--script {path}: {error}")),
                };
            }
            "--record" => {
                let path = arguments.next().ok_or("--record: a FILE is needed")?;
                let file = std::fs::OpenOptions::new()
                    .create(true)
                    .append(true)
                    .open(&path)
                    .map_err(|error| format!("--record {path}: {error}"))?;
                options.record = Some(file);
            }
            flag if flag.starts_with("--") => return Err(format!("unknown option {flag}")),
            address => options.address = address.to_owned(),
        }
    }
    Ok(options)
}

/// The script's reply `entry` as a reply.
fn scripted(entry: &Value) -> Reply {
    let text = entry.get("text").and_then(Value::as_str);
    let calls = entry
        .get("tool_calls")
        .and_then(Value::as_array)
        .cloned()
        .unwrap_or_default();
    let mut reply = match (text, calls.is_empty()) {
        (Some(text), _) => Reply::text(text),
        (None, false) => return with_calls(None, &calls),
        (None, true) => Reply::error(500, "a scripted reply needs `text` or `tool_calls`"),
    };
    if !calls.is_empty() {
        reply = with_calls(Some(reply), &calls);
    }
    reply
}

fn with_calls(reply: Option<Reply>, calls: &[Value]) -> Reply {
    let field = |call: &Value, name: &str| {
        call.get(name)
            .and_then(Value::as_str)
            .unwrap_or_default()
            .to_owned()
    };
    let mut reply = reply;
    for call in calls {
        let (id, name) = (field(call, "id"), field(call, "name"));
        let arguments = call.get("arguments").cloned().unwrap_or(Value::Null);
        reply = Some(match reply {
            None => Reply::tool_call(&id, &name, arguments),
            Some(reply) => reply.with_tool_call(&id, &name, arguments),
        });
    }
    reply.unwrap_or_else(|| Reply::error(500, "no reply"))
}

fn main() {
    let options = match options() {
        Ok(options) => options,
        Err(problem) => {
            eprintln!("contexture-fake-upstream: {problem}");
            std::process::exit(2);
        }
    };
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()
        .expect("a tokio runtime");
    runtime.block_on(async {
        let address = &options.address;
        let upstream = match FakeUpstream::start_at(address).await {
            Ok(upstream) => upstream,
            Err(error) => {
                eprintln!("contexture-fake-upstream: cannot listen on {address}: {error}");
                std::process::exit(1);
            }
        };
        let script = options.script;
        let record = options.record.map(Mutex::new).map(Arc::new);
        upstream
            .forget_requests()
            .otherwise(move |number, request| {
                if let Some(record) = &record
                    && let Ok(mut file) = record.lock()
                {
                    let _ = writeln!(file, "{}", request.json);
                }
                match script.get(number - 1) {
                    Some(entry) => scripted(entry),
                    None => Reply::text(format!("Noted, turn {number}.")).usage(120, 6),
                }
            });
        eprintln!("contexture-fake-upstream: serving {}", upstream.base_url());
        std::future::pending::<()>().await;
    });
}
