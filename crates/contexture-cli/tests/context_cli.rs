//! End-to-end tests of `contexture output parse`, `contexture template render` and
//! `contexture expr eval`: the real binary, real files, exact stdout, stderr and exit codes.

use crate::common;

use std::io::Write;
use std::process::Stdio;

use common::{RunToEnd, contexture, write_file};
use contexture_store::testing::TempDir;
use serde_json::{Value, json};

#[test]
fn output_parse_prints_value_and_stored() {
    let run = contexture(["output", "parse"])
        .run_with_input(b"[{ 'file': 'a.txt', 'size': 100 }, { 'file': 'b.txt', 'size': 200 }]");
    assert_eq!(
        run.expect_json(),
        json!({
            "value": [{"file": "a.txt", "size": 100}, {"file": "b.txt", "size": 200}],
            "stored": {"file": "b.txt", "size": 200}
        })
    );

    let dir = TempDir::new("contexture-ctx-cli-parse");
    let file = write_file(&dir, "out.txt", b"The analysis completed successfully");
    let run = contexture(["output", "parse", &file]).run();
    assert_eq!(
        run.expect_json(),
        json!({"value": "The analysis completed successfully", "stored": {}})
    );
}

#[test]
fn output_parse_reports_bad_input_clearly() {
    let run = contexture(["output", "parse"]).run_with_input(b"Here:\n```json\n{\"cut\": ");
    assert_eq!(run.expect_json()["stored"], json!({}));
    assert!(
        run.stderr
            .contains("```json fence opened at line 2 is never closed"),
        "{}",
        run.stderr
    );

    let run = contexture(["output", "parse"]).run_with_input(b"{\"a\": \"\xff\"}");
    assert!(!run.ok);
    assert!(run.stdout.is_empty());
    assert!(
        run.stderr
            .contains("standard input: output is not valid UTF-8: invalid byte at offset 7"),
        "{}",
        run.stderr
    );

    let deep = format!("{}{}", "[".repeat(10_000), "]".repeat(10_000));
    let run = contexture(["output", "parse"]).run_with_input(deep.as_bytes());
    assert_eq!(run.expect_json()["stored"], json!({}));
    assert!(
        run.stderr.contains("nesting deeper than 200 levels"),
        "{}",
        run.stderr
    );
}

#[test]
fn template_render_prints_exactly_the_text() {
    let dir = TempDir::new("contexture-ctx-cli-render");
    let context = write_file(
        &dir,
        "ctx.json",
        br#"{"user": {"name": "Alice"}, "files": [{"name": "a.txt"}]}"#,
    );
    let template = write_file(
        &dir,
        "t.txt",
        b"Welcome {{user.name}} {{user.missing}} {{files/0/name}} {{ nobody }}\n",
    );
    let run = contexture(["template", "render", "--context", &context, &template]).run();
    assert!(run.ok, "{}", run.stderr);
    assert_eq!(
        String::from_utf8(run.stdout).expect("utf-8"),
        "Welcome Alice {{user.missing}} a.txt {{ nobody }}\n"
    );

    // From standard input, no newline added.
    let run = contexture([
        "template",
        "render",
        "--context",
        &context,
        "--missing",
        "empty",
    ])
    .run_with_input(b"[{{user.name}}][{{user.missing}}]");
    assert_eq!(run.stdout, b"[Alice][]");

    let run = contexture([
        "template",
        "render",
        "--context",
        &context,
        "--missing",
        "error",
        &template,
    ])
    .run();
    assert!(!run.ok);
    assert!(run.stdout.is_empty());
    assert!(
        run.stderr
            .contains("missing variables: nobody, user.missing"),
        "{}",
        run.stderr
    );

    let run = contexture(["template", "render", "--context", &context, "--now", "0"])
        .run_with_input(b"{{ current_date }} {{ current_weekday }}");
    assert_eq!(run.stdout, b"1970-01-01 Thursday");
    // AWorld's names: the month's name, the year (a number), the date and time with a space,
    // a random UUID, the platform as Python names it, and the user (from the system account
    // when no variable names it).
    let run = contexture(["template", "render", "--context", &context, "--now", "1709251199"])
        .env_remove("USER")
        .env_remove("USERNAME")
        .env_remove("LOGNAME")
        .run_with_input(
            b"{{ current_month }} {{ current_year + 1 }} {{ current_datetime_plain }} {{ random_uuid | length }} {{ system_platform }} {{ username | length > 0 }} {{ system_os }}",
        );
    let expected = format!(
        "February 2025 2024-02-29 23:59:59 36 {} true {}",
        if cfg!(target_os = "linux") {
            "Linux"
        } else {
            std::env::consts::OS
        },
        std::env::consts::OS
    );
    assert_eq!(
        String::from_utf8_lossy(&run.stdout),
        expected,
        "{}",
        run.stderr
    );
}

#[test]
fn template_render_rejects_bad_contexts_and_templates() {
    let dir = TempDir::new("contexture-ctx-cli-render-bad");
    let list = write_file(&dir, "list.json", b"[1, 2]");
    let run = contexture(["template", "render", "--context", &list]).run_with_input(b"x");
    assert!(!run.ok);
    assert!(
        run.stderr
            .contains("the context must be a JSON object, not an array"),
        "{}",
        run.stderr
    );

    let cyclic = write_file(&dir, "cyclic.json", br#"{"a": "{{b}}", "b": "{{a}}"}"#);
    let run = contexture(["template", "render", "--context", &cyclic]).run_with_input(b"{{a}}");
    assert!(!run.ok);
    assert!(
        run.stderr
            .contains("template cycle in context values: a -> b -> a"),
        "{}",
        run.stderr
    );

    let empty = write_file(&dir, "empty.json", b"{}");
    let run = contexture(["template", "render", "--context", &empty]).run_with_input(b"{% for %}");
    assert!(!run.ok);
    assert!(
        run.stderr.contains("template syntax error at line 1"),
        "{}",
        run.stderr
    );
}

#[test]
fn expr_eval_prints_json() {
    let dir = TempDir::new("contexture-ctx-cli-expr");
    let context = write_file(
        &dir,
        "ctx.json",
        br#"{"user_role": "admin", "count": 5, "status": "ok"}"#,
    );
    let run = contexture([
        "expr",
        "eval",
        "--context",
        &context,
        "user_role == 'admin'",
    ])
    .run();
    assert_eq!(run.stdout, b"true\n");
    let run = contexture([
        "expr",
        "eval",
        "--context",
        &context,
        "count > 3 and status in ['ok', 'done']",
    ])
    .run();
    assert_eq!(run.stdout, b"true\n");
    let run = contexture(["expr", "eval", "--context", &context, "{'n': count * 2}"]).run();
    assert_eq!(run.stdout, b"{\"n\":10}\n");

    let output = write_file(&dir, "out.txt", b"{'score': 0.9}");
    let run = contexture([
        "expr",
        "eval",
        "--context",
        &context,
        "--output",
        &output,
        "output.score > 0.5",
    ])
    .run();
    assert_eq!(run.stdout, b"true\n");

    let run = contexture(["expr", "eval", "--context", &context, "count > > 3"]).run();
    assert!(!run.ok);
    assert!(
        run.stderr
            .contains("invalid expression \"count > > 3\" at column 9"),
        "{}",
        run.stderr
    );
}

fn worker_line(message: Value) -> String {
    format!("{message}\n")
}

fn render_job(template: &str, context: Value) -> Value {
    json!({"job": {
        "kind": "render",
        "template": template,
        "context": context,
        "settings": {
            "missing": "keep",
            "fuel": 1_000_000,
            "max_output_bytes": 1_000_000,
            "now": {"unix_seconds": 0, "utc_offset_minutes": 0},
            "variables": {},
        },
    }})
}

#[test]
fn the_template_worker_renders_jobs_asking_its_caller_for_ids() {
    let mut child = contexture(["template-worker"])
        .stdin(Stdio::piped())
        .spawn()
        .expect("the contexture binary runs");
    let mut input = child.stdin.take().unwrap();
    let mut output = std::io::BufReader::new(child.stdout.take().unwrap());
    let mut read = || {
        let mut line = String::new();
        std::io::BufRead::read_line(&mut output, &mut line).unwrap();
        serde_json::from_str::<Value>(&line).unwrap()
    };
    let setup = worker_line(json!({"setup": {"max_memory_bytes": 512u64 << 20}}));
    input.write_all(setup.as_bytes()).unwrap();
    let job = worker_line(render_job("{{ a }} {{ uuid }}", json!({"a": 1})));
    input.write_all(job.as_bytes()).unwrap();
    assert_eq!(read(), json!("need_id"));
    input
        .write_all(worker_line(json!({"id": vec![0u8; 16]})).as_bytes())
        .unwrap();
    let outcome = read();
    assert_eq!(
        outcome["outcome"]["result"]["Ok"]["text"], "1 00000000-0000-4000-8000-000000000000",
        "{outcome}"
    );
    // A template error is an outcome like any other; the worker goes on.
    let job = worker_line(render_job("{{ 1 / 0 }}", json!({})));
    input.write_all(job.as_bytes()).unwrap();
    let outcome = read();
    assert!(
        outcome["outcome"]["result"]["Err"]["Render"].is_object(),
        "{outcome}"
    );
    // Anything but a job ends it with a protocol error, never a panic.
    input.write_all(b"{\"setup\": 1}\n").unwrap();
    let status = child.wait().unwrap();
    let mut stderr = String::new();
    std::io::Read::read_to_string(&mut child.stderr.take().unwrap(), &mut stderr).unwrap();
    assert!(!status.success());
    assert!(
        stderr.contains("template worker protocol error"),
        "{stderr}"
    );
    assert!(!stderr.contains("panicked"), "{stderr}");
}

#[test]
fn the_template_worker_needs_its_setup_first() {
    let job = worker_line(render_job("{{ a }}", json!({"a": 1})));
    let run = contexture(["template-worker"]).run_with_input(job.as_bytes());
    assert!(!run.ok);
    assert!(
        run.stderr.contains("the first line must be the setup"),
        "{}",
        run.stderr
    );
    assert!(run.stdout.is_empty());
}

#[test]
fn template_render_reads_the_simple_syntax_with_format_fstring() {
    let dir = TempDir::new("contexture-ctx-cli-fstring");
    let context = write_file(&dir, "ctx.json", br#"{"user": {"name": "Alice"}, "n": 2}"#);
    let render = |format: &str, template: &[u8]| {
        contexture([
            "template",
            "render",
            "--context",
            &context,
            "--format",
            format,
            "--now",
            "0",
        ])
        .run_with_input(template)
    };
    let run = render(
        "fstring",
        b"{user.name} has {n} files {{as JSON: {{\"n\": {n}}}}} on {current_date}, {missing}",
    );
    assert!(run.ok, "{}", run.stderr);
    assert_eq!(
        String::from_utf8(run.stdout).unwrap(),
        "Alice has 2 files {as JSON: {\"n\": 2}} on 1970-01-01, {missing}"
    );
    // A mistake says where, and how to write it instead.
    let run = render("fstring", b"ok\nthen } here");
    assert!(!run.ok);
    assert!(
        run.stderr.contains("template syntax error at line 2, column 6: a single `}` outside a variable (write `}}` for a literal brace)"),
        "{}",
        run.stderr
    );
    let run = render("mustache", b"x");
    assert!(!run.ok);
    assert!(run.stderr.contains("mustache"), "{}", run.stderr);
}
