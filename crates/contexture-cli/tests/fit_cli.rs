//! End-to-end tests of `contexture fit`: the built binary on message files.

use crate::common;

use common::{RunToEnd, contexture, write_file};
use contexture_core::format::openai;
use contexture_core::{Encoding, TokenCounter};
use contexture_store::testing::TempDir;
use serde_json::{Value, json};

fn conversation() -> Value {
    json!([
        {"role": "system", "content": "You are a research assistant. Cite your sources."},
        {"role": "user", "content": "Find the population of Lyon and of Porto."},
        {"role": "assistant", "content": null, "tool_calls": [
            {"id": "c1", "type": "function", "function": {"name": "search", "arguments": "{\"q\":\"Lyon population\"}"}},
            {"id": "c2", "type": "function", "function": {"name": "search", "arguments": "{\"q\":\"Porto population\"}"}}
        ]},
        {"role": "tool", "tool_call_id": "c1", "content": "Lyon: 522,250 inhabitants (2021).\nMetropolis: 1.4 million."},
        {"role": "tool", "tool_call_id": "c2", "content": "Porto: 231,800 inhabitants (2021).\nMetro area: 1.7 million."},
        {"role": "assistant", "content": "Lyon has about 522,000 inhabitants and Porto about 232,000."},
        {"role": "user", "content": "From now on, answer in French."},
        {"role": "assistant", "content": "D'accord."},
        {"role": "user", "content": "Fetch the Lyon article."},
        {"role": "assistant", "content": null, "tool_calls": [
            {"id": "c3", "type": "function", "function": {"name": "fetch", "arguments": "{\"url\":\"https://example.org/lyon\"}"}}
        ]},
        {"role": "tool", "tool_call_id": "c3", "content": "Lyon is the third-largest city of France.\nIt lies at the confluence of the Rhône and the Saône.\nIts historic centre is a UNESCO World Heritage Site."},
        {"role": "assistant", "content": "Lyon est la troisième ville de France."},
        {"role": "user", "content": "Merci ! Laquelle est la plus ancienne ?"}
    ])
}

fn write_input(dir: &TempDir, name: &str, value: &Value) -> String {
    write_file(dir, name, serde_json::to_vec_pretty(value).unwrap())
}

/// The request tokens of an output array, as `contexture tokens count --messages` counts it.
fn request_tokens(messages: &Value) -> u32 {
    let parsed = openai::parse_messages(messages).unwrap();
    TokenCounter::exact(Encoding::O200kBase)
        .count_request(&parsed, &[])
        .total
}

#[test]
fn fits_to_max_tokens_keeping_whole_tool_units() {
    let dir = TempDir::new("contexture-fit-cli");
    let path = write_input(&dir, "fit.json", &conversation());
    let output = contexture([
        "fit",
        "--model",
        "gpt-4o-mini",
        "--max-tokens",
        "120",
        &path,
    ])
    .run();
    let fitted = output.expect_json();
    let roles: Vec<&str> = fitted
        .as_array()
        .unwrap()
        .iter()
        .map(|m| m["role"].as_str().unwrap())
        .collect();
    assert_eq!(
        roles,
        [
            "system",
            "assistant",
            "user",
            "assistant",
            "tool",
            "assistant",
            "user"
        ]
    );
    assert!(request_tokens(&fitted) <= 120);
    // The same count as the tokens command.
    let out_path = write_input(&dir, "fitted.json", &fitted);
    let counted = contexture([
        "tokens",
        "count",
        "--model",
        "gpt-4o-mini",
        "--messages",
        &out_path,
    ])
    .run();
    let total: u32 = counted.expect_success().trim().parse().unwrap();
    assert_eq!(total, request_tokens(&fitted));
}

#[test]
fn report_goes_to_standard_error() {
    let dir = TempDir::new("contexture-fit-cli");
    let path = write_input(&dir, "report.json", &conversation());
    let output = contexture([
        "fit",
        "--model",
        "gpt-4o-mini",
        "--max-tokens",
        "150",
        "--pin",
        "6",
        "--start-on",
        "user",
        "--clear-keep",
        "1",
        "--report",
        &path,
    ])
    .run();
    let fitted = output.expect_json();
    let report: Value = serde_json::from_str(&output.stderr).unwrap();
    insta::assert_json_snapshot!("fit_cli_report", report);
    assert_eq!(
        report["messages_out"],
        json!(fitted.as_array().unwrap().len())
    );
    assert_eq!(report["tokens_after"], json!(request_tokens(&fitted)));
    // The pinned message is kept.
    assert!(
        fitted
            .as_array()
            .unwrap()
            .iter()
            .any(|m| m["content"] == "From now on, answer in French.")
    );
}

/// The same policies as an assistant's `context`: a long result cut to its start and end,
/// then old results cleared once the request passes a number of tokens.
#[test]
fn tool_results_are_cut_then_cleared_past_a_trigger_as_an_assistants_context_does() {
    let dir = TempDir::new("contexture-fit-cli");
    let mut conversation = conversation();
    let long: String = (0..400)
        .map(|i| format!("row {i} of the Lyon table\n"))
        .collect();
    conversation[10]["content"] = json!(long);
    let path = write_input(&dir, "loop.json", &conversation);
    let output = contexture([
        "fit",
        "--model",
        "gpt-4o-mini",
        "--truncate-tool-results",
        "300",
        "--clear-keep",
        "1",
        "--clear-trigger-tokens",
        "400",
        "--report",
        &path,
    ])
    .run();
    let fitted = output.expect_json();
    let report: Value = serde_json::from_str(&output.stderr).unwrap();
    assert_eq!(report["truncated"][0]["tool_call_id"], "c3", "{report}");
    let cleared: Vec<&str> = report["cleared"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| c["tool_call_id"].as_str().unwrap())
        .collect();
    assert_eq!(cleared, ["c1", "c2"], "{report}");
    let lyon = fitted[10]["content"].as_str().unwrap();
    assert!(
        lyon.starts_with("row 0 of the Lyon table") && lyon.contains("tokens of this result cut"),
        "{lyon}"
    );
    assert!(
        request_tokens(&fitted) <= 400 + 300,
        "{}",
        request_tokens(&fitted)
    );
    assert_eq!(
        fitted[3]["content"],
        "[cleared `search` result (c1, 27 tokens)]"
    );
    // Bad values are named.
    let error = contexture([
        "fit",
        "--model",
        "gpt-4o-mini",
        "--truncate-tool-results",
        "5",
        &path,
    ])
    .run()
    .expect_failure();
    assert!(
        error.contains("--truncate-tool-results: must be at least 48"),
        "{error}"
    );
    let error = contexture([
        "fit",
        "--model",
        "gpt-4o-mini",
        "--clear-keep",
        "1",
        "--clear-trigger-tokens",
        "0",
        &path,
    ])
    .run()
    .expect_failure();
    assert!(
        error.contains("--clear-trigger-tokens: must be at least 1"),
        "{error}"
    );

    // The same settings as a fit policy file (an assistant's `context:`) give the same
    // request; its mistakes are named by file and field.
    let policy = dir.join("policy.yaml");
    std::fs::write(
        &policy,
        "truncate_tool_results: {max_tokens: 300}\nclear_tool_results: {trigger_tokens: 400, keep: 1}\n",
    )
    .unwrap();
    let policy = policy.display().to_string();
    let from_file = contexture(["fit", "--model", "gpt-4o-mini", "--policy", &policy, &path])
        .run()
        .expect_json();
    assert_eq!(from_file, fitted);
    let bad = dir.join("bad.yaml");
    std::fs::write(&bad, "hysteresis: {high: 0.5, low: 0.8}\n").unwrap();
    let bad = bad.display().to_string();
    let error = contexture(["fit", "--model", "gpt-4o-mini", "--policy", &bad, &path])
        .run()
        .expect_failure();
    assert!(
        error.contains("bad.yaml: hysteresis.low: low (0.8) must be below high (0.5)"),
        "{error}"
    );
    std::fs::write(&bad, "windw: 100\n").unwrap();
    let error = contexture(["fit", "--model", "gpt-4o-mini", "--policy", &bad, &path])
        .run()
        .expect_failure();
    assert!(error.contains("unknown field `windw`"), "{error}");
    assert!(error.contains("bad.yaml:1:1: "), "{error}");
    // A policy's window and hysteresis: over the budget, the history is cut down to the low
    // share of it.
    std::fs::write(
        &bad,
        "window: 2000\nreserve: 1000\nhysteresis: {high: 0.9, low: 0.3}\n",
    )
    .unwrap();
    let output = contexture([
        "fit",
        "--model",
        "gpt-4o-mini",
        "--policy",
        &bad,
        "--report",
        &path,
    ])
    .run();
    let report: Value = serde_json::from_str(&output.stderr).unwrap();
    assert_eq!(report["max_tokens"], 1000, "{report}");
    assert_eq!(report["low_water"], 300, "{report}");
}

#[test]
fn head_tail_inserts_one_marker() {
    let dir = TempDir::new("contexture-fit-cli");
    let path = write_input(&dir, "head_tail.json", &conversation());
    let output = contexture([
        "fit",
        "--model",
        "gpt-4o-mini",
        "--max-tokens",
        "110",
        "--strategy",
        "head-tail",
        &path,
    ])
    .run();
    let fitted = output.expect_json();
    let markers: Vec<&Value> = fitted
        .as_array()
        .unwrap()
        .iter()
        .filter(|m| {
            m["content"]
                .as_str()
                .is_some_and(|t| t.contains("earlier messages omitted"))
        })
        .collect();
    assert_eq!(markers.len(), 1, "{fitted:#}");
    assert_eq!(
        fitted[1]["content"],
        "Find the population of Lyon and of Porto."
    );
}

#[test]
fn anthropic_rules_start_on_a_user_turn() {
    let dir = TempDir::new("contexture-fit-cli");
    let path = write_input(&dir, "anthropic.json", &conversation());
    let output = contexture([
        "fit",
        "--model",
        "gpt-4o-mini",
        "--max-tokens",
        "120",
        "--provider",
        "anthropic",
        &path,
    ])
    .run();
    let fitted = output.expect_json();
    assert_eq!(fitted[1]["role"], "user");
}

#[test]
fn without_max_tokens_the_model_window_applies_and_nothing_is_dropped() {
    let dir = TempDir::new("contexture-fit-cli");
    let path = write_input(&dir, "window.json", &conversation());
    let output = contexture(["fit", "--model", "gpt-4o-mini", "--report", &path]).run();
    let fitted = output.expect_json();
    assert_eq!(fitted, conversation());
    let report: Value = serde_json::from_str(&output.stderr).unwrap();
    // 128,000-token window minus a 16,384-token reserve.
    assert_eq!(report["max_tokens"], json!(128_000 - 16_384));
    assert_eq!(report["dropped_count"], json!(0));
    assert_eq!(report["tokens_before"], report["tokens_after"]);
}

#[test]
fn reads_standard_input() {
    let output = contexture(["fit", "--model", "gpt-4o-mini", "--max-tokens", "60", "-"])
        .run_with_input(conversation().to_string().as_bytes());
    let fitted = output.expect_json();
    assert!(request_tokens(&fitted) <= 60);
    assert_eq!(fitted[0]["role"], "system");
}

#[test]
fn fails_clearly_when_system_and_pinned_cannot_fit() {
    let dir = TempDir::new("contexture-fit-cli");
    let path = write_input(&dir, "too_small.json", &conversation());
    let output = contexture([
        "fit",
        "--model",
        "gpt-4o-mini",
        "--max-tokens",
        "20",
        "--pin",
        "1",
        &path,
    ])
    .run();
    let stderr = output.expect_failure();
    assert!(output.stdout.is_empty());
    assert!(stderr.contains("cannot fit"), "{stderr}");
    assert!(
        stderr.contains("system prompt and pinned messages need"),
        "{stderr}"
    );
}

#[test]
fn bad_input_is_named() {
    let dir = TempDir::new("contexture-fit-cli");
    let path = write_input(
        &dir,
        "bad.json",
        &json!([{"role": "robot", "content": "hi"}]),
    );
    let output = contexture(["fit", "--model", "gpt-4o-mini", &path]).run();
    let stderr = output.expect_failure();
    assert!(stderr.contains("bad.json"), "{stderr}");
    let good = write_input(&dir, "pin.json", &conversation());
    let output = contexture(["fit", "--model", "gpt-4o-mini", "--pin", "99", &good]).run();
    let stderr = output.expect_failure();
    assert!(
        stderr.contains("--pin 99") && stderr.contains("13 messages"),
        "{stderr}"
    );
}

/// `contexture fit` runs the fit a request gets: with a thread's policy given as `--policy`,
/// it prints what `thread messages --model` reads of that thread.
#[test]
fn fit_with_a_policy_gives_what_a_thread_with_that_policy_reads() {
    use contexture_core::fit::FitPolicy;
    use contexture_core::thread::{EventKind, PolicyChange, ThreadPolicy};
    use contexture_store::{NewEvent, Store};

    let dir = TempDir::new("contexture-fit-cli");
    let path = write_input(&dir, "history.json", &conversation());
    let db = common::sqlite_url(&dir, "threads.db");
    let policies = [
        "window: 250\nreserve: 50\ntruncate_tool_results: {max_tokens: 48}\nclear_tool_results: {trigger_tokens: 100, keep: 1}\nhysteresis: {high: 0.9, low: 0.5}\n",
        "window: 200\nreserve: 80\nstrategy: head-tail\n",
        "window: 200\nreserve: 60\nstrategy: first\n",
    ];
    let runtime = tokio::runtime::Runtime::new().expect("runtime");
    for (n, policy_text) in policies.iter().enumerate() {
        let thread = format!("t{n}");
        contexture(["thread", "append", "--thread", &thread, "--db", &db, &path])
            .run()
            .expect_success();
        let policy: FitPolicy = yaml_serde::from_str(policy_text).unwrap();
        runtime.block_on(async {
            let store = contexture_store::SqliteStore::open(dir.join("threads.db"))
                .await
                .unwrap();
            let set = PolicyChange {
                policy: Some(ThreadPolicy {
                    fit: Some(policy),
                    ..ThreadPolicy::default()
                }),
            };
            store
                .append(&thread, vec![NewEvent::new(EventKind::PolicySet(set))])
                .await
                .unwrap();
        });
        let policy_file = dir.join(&format!("policy{n}.yaml"));
        std::fs::write(&policy_file, policy_text).unwrap();
        let fitted = contexture([
            "fit",
            "--model",
            "gpt-4o-mini",
            "--policy",
            &policy_file.display().to_string(),
            &path,
        ])
        .run()
        .expect_json();
        let read = contexture([
            "thread",
            "messages",
            "--thread",
            &thread,
            "--model",
            "gpt-4o-mini",
            "--db",
            &db,
        ])
        .run()
        .expect_json();
        assert_eq!(fitted, read, "policy {policy_text}");
        assert!(
            fitted.as_array().unwrap().len() < conversation().as_array().unwrap().len(),
            "policy {policy_text} left everything in: the comparison shows nothing"
        );
    }
}

/// `--low-water` is the hysteresis' low mark: past the budget, the history is cut down to
/// it, not just under the budget; a mark the budget cannot hold is refused by name.
#[test]
fn low_water_cuts_the_history_down_to_the_mark() {
    let dir = TempDir::new("contexture-fit-cli");
    let path = write_input(&dir, "low_water.json", &conversation());
    let fit = |extra: &[&str]| {
        let mut args = vec!["fit", "--model", "gpt-4o-mini", "--max-tokens", "150"];
        args.extend_from_slice(extra);
        args.extend(["--report", path.as_str()]);
        contexture(args).run()
    };
    let plain = fit(&[]);
    let plain_fitted = plain.expect_json();
    let low = fit(&["--low-water", "90"]);
    let low_fitted = low.expect_json();
    let report: Value = serde_json::from_str(&low.stderr).unwrap();
    assert_eq!(report["low_water"], 90, "{report}");
    assert!(request_tokens(&low_fitted) <= 90, "{low_fitted:#}");
    assert!(request_tokens(&plain_fitted) > 90, "{plain_fitted:#}");
    let error = fit(&["--low-water", "150"]).expect_failure();
    assert!(
        error.contains("--low-water: must be at least 1 and below the 150 tokens"),
        "{error}"
    );
}

/// A tool-calling history of `turns` four-message turns after a system prompt.
fn long_history(turns: usize) -> Vec<Value> {
    let mut messages =
        vec![json!({"role": "system", "content": "You answer questions about orders."})];
    for turn in 0..turns {
        messages.extend([
            json!({"role": "user", "content": format!("Where is order {turn}?")}),
            json!({"role": "assistant", "content": null, "tool_calls": [{"id": format!("call_{turn}"),
                "type": "function", "function": {"name": "lookup", "arguments": format!("{{\"order\":{turn}}}")}}]}),
            json!({"role": "tool", "tool_call_id": format!("call_{turn}"),
                "content": format!("Order {turn}: shipped, \"in transit\".\nCarrier: DHL.")}),
            json!({"role": "assistant", "content": format!("Order {turn} is in transit with DHL.")}),
        ]);
    }
    messages
}

/// A long history is read from its end, as far back as the fit needs; a fit that reads every
/// message (here: one with a pin) keeps the same messages.
#[test]
fn a_long_history_read_from_its_end_fits_as_when_read_whole() {
    let dir = TempDir::new("contexture-fit-cli");
    let path = write_input(&dir, "long.json", &Value::Array(long_history(2_000)));
    let fit = |extra: &[&str]| {
        let mut args = vec![
            "fit",
            "--model",
            "gpt-4o-mini",
            "--max-tokens",
            "400",
            "--start-on",
            "user",
            "--report",
        ];
        args.extend_from_slice(extra);
        args.push(&path);
        let output = contexture(args).run();
        let report: Value = serde_json::from_str(&output.stderr).unwrap();
        (output.expect_json(), report)
    };
    let (from_end, report) = fit(&[]);
    let (whole, whole_report) = fit(&["--pin", "0"]);
    assert_eq!(from_end, whole);
    assert!(request_tokens(&from_end) <= 400);
    assert_eq!(from_end[0]["role"], "system");
    assert_eq!(from_end[1]["role"], "user");
    assert_eq!(
        from_end.as_array().unwrap().last().unwrap()["content"],
        "Order 1999 is in transit with DHL."
    );
    // Only the end was read, so the count before the fit is a lower bound.
    assert_eq!(report["tokens_before"], Value::Null);
    assert!(report["tokens_before_at_least"].as_u64().unwrap() > 400);
    assert_eq!(report["dropped_count"], whole_report["dropped_count"]);
}

/// The whole file is checked as JSON, but a message the fit leaves out is not read: its
/// fields are checked only by a fit that reads it.
#[test]
fn the_file_is_checked_as_json_whole_and_each_message_when_it_is_read() {
    let dir = TempDir::new("contexture-fit-cli");
    let mut history = long_history(500);
    history[3] = json!({"role": "robot", "content": "beep"});
    let path = write_input(&dir, "robot.json", &Value::Array(history.clone()));
    let base = ["fit", "--model", "gpt-4o-mini", "--max-tokens", "300"];
    let fitted = contexture(base.iter().copied().chain([path.as_str()]))
        .run()
        .expect_json();
    assert!(request_tokens(&fitted) <= 300);
    for reads_all in [["--strategy", "first"], ["--pin", "1"]] {
        let stderr = contexture(base.iter().copied().chain(reads_all).chain([path.as_str()]))
            .run()
            .expect_failure();
        assert!(
            stderr.contains("robot.json: not a chat message array")
                && stderr.contains("messages[3].role: unknown role `robot`"),
            "{stderr}"
        );
    }

    // Bad JSON at the very end, far behind what the fit keeps.
    let mut text = serde_json::to_string_pretty(&Value::Array(history)).unwrap();
    text.truncate(text.len() - 1);
    text.push_str(",\n  {\"role\": \"user\", \"content\": tru}\n]");
    let lines = text.lines().count() - 1;
    let path = write_file(&dir, "cut.json", &text);
    let stderr = contexture(base.iter().copied().chain([path.as_str()]))
        .run()
        .expect_failure();
    assert!(
        stderr.contains(&format!("cut.json: invalid JSON at line {lines}")),
        "{stderr}"
    );

    let path = write_file(&dir, "object.json", r#"{"role": "user", "content": "hi"}"#);
    let stderr = contexture(base.iter().copied().chain([path.as_str()]))
        .run()
        .expect_failure();
    assert!(
        stderr.contains("object.json: not a chat message array: expected a JSON array"),
        "{stderr}"
    );
}

/// A file is read a part at a time and its kept messages read again from where they are:
/// a history of several parts, with messages cut by the parts' ends, fits as the same text
/// given on standard input (held whole) does; bad JSON parts into it is placed by line.
#[test]
fn a_history_of_many_parts_fits_as_when_given_whole_on_standard_input() {
    let dir = TempDir::new("contexture-fit-cli");
    let history = Value::Array(long_history(12_000));
    let text = serde_json::to_string_pretty(&history).unwrap();
    assert!(text.len() > 3 << 20, "several parts: {} bytes", text.len());
    let path = write_file(&dir, "parts.json", &text);
    let args = |extra: &[&'static str]| {
        let mut args = vec!["fit", "--model", "gpt-4o-mini", "--max-tokens", "2000"];
        args.extend_from_slice(extra);
        args
    };
    for extra in [&[][..], &["--pin", "7"][..], &["--strategy", "first"][..]] {
        let from_file = contexture(args(extra).into_iter().chain([path.as_str()]))
            .run()
            .expect_json();
        let from_stdin = contexture(args(extra))
            .run_with_input(text.as_bytes())
            .expect_json();
        assert_eq!(from_file, from_stdin, "{extra:?}");
        assert!(request_tokens(&from_file) <= 2000, "{extra:?}");
    }

    // A missing comma two megabytes in, at a message's end.
    let cut = text[2 << 20..].find("\n  },\n").unwrap() + (2 << 20);
    let line = text[..cut].lines().count() + 1;
    let mut bad = text.clone();
    bad.replace_range(cut..cut + 6, "\n  }\n");
    let path = write_file(&dir, "comma.json", &bad);
    let stderr = contexture(args(&[]).into_iter().chain([path.as_str()]))
        .run()
        .expect_failure();
    let stdin_stderr = contexture(args(&[]))
        .run_with_input(bad.as_bytes())
        .expect_failure();
    let expected = format!(
        "invalid JSON at line {}, column 3: expected `,` or `]`",
        line + 1
    );
    assert!(
        stderr.contains(&format!("comma.json: {expected}")),
        "{stderr}"
    );
    assert!(
        stdin_stderr.contains(&format!("standard input: {expected}")),
        "{stdin_stderr}"
    );
}

/// A named input that cannot be read twice (a named pipe) is held and fits as the file does;
/// text that is not JSON says where and why.
#[test]
fn a_named_pipe_fits_as_the_file_does_and_text_that_is_not_json_is_placed() {
    let dir = TempDir::new("contexture-fit-cli");
    let text = serde_json::to_string_pretty(&Value::Array(long_history(300))).unwrap();
    let path = write_file(&dir, "history.json", &text);
    let pipe = dir.join("history.pipe");
    let made = std::process::Command::new("mkfifo")
        .arg(&pipe)
        .status()
        .expect("run mkfifo");
    assert!(made.success());
    let writer = {
        let (pipe, text) = (pipe.clone(), text.clone());
        std::thread::spawn(move || std::fs::write(pipe, text).expect("write the pipe"))
    };
    let args = ["fit", "--model", "gpt-4o-mini", "--max-tokens", "500"];
    let from_pipe = contexture(args.iter().copied().chain([pipe.to_str().unwrap()]))
        .run()
        .expect_json();
    writer.join().unwrap();
    let from_file = contexture(args.iter().copied().chain([path.as_str()]))
        .run()
        .expect_json();
    assert_eq!(from_pipe, from_file);

    let path = write_file(&dir, "prose.json", "\n  hello");
    let stderr = contexture(args.iter().copied().chain([path.as_str()]))
        .run()
        .expect_failure();
    assert!(
        stderr.contains("prose.json: invalid JSON at line 2, column 3: expected value"),
        "{stderr}"
    );
}
