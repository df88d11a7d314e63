//! Hostile inputs too large to keep as data files: each must end in a clear error or a
//! correct result, quickly, never in a panic, a stack overflow or a hang.

use std::time::{Duration, Instant};

use contexture_core::context::{
    ContextStore, OutputFormat, RenderOptions, TemplateError, parse_output, parse_output_bytes,
    pylit, render,
};
use serde_json::{Value, json};

/// Generous for a debug build on a shared 2-core machine; the real figures are far lower.
const QUICK: Duration = Duration::from_secs(5);

fn timed<T>(what: &str, f: impl FnOnce() -> T) -> T {
    let start = Instant::now();
    let result = f();
    let elapsed = start.elapsed();
    eprintln!("{what}: {elapsed:?}");
    assert!(elapsed < QUICK, "{what} took {elapsed:?}");
    result
}

#[test]
fn ten_thousand_deep_nesting_is_reported_not_overflowed() {
    for (open, close) in [("[", "]"), ("{\"a\":", "}"), ("(", ")")] {
        let text = format!("{}1{}", open.repeat(10_000), close.repeat(10_000));
        let parsed = timed("deep nesting", || parse_output(&text));
        assert_eq!(parsed.format, OutputFormat::PlainText, "{open}");
        assert!(
            parsed
                .notes
                .iter()
                .any(|n| n.contains("nesting deeper than 200") || n.contains("recursion limit")),
            "{open}: {:?}",
            parsed.notes
        );
        let error = pylit::parse(&text).unwrap_err();
        assert!(error.message.contains("nesting deeper than 200"), "{error}");
    }
}

#[test]
fn ten_megabyte_outputs_parse_quickly() {
    // A large valid JSON document.
    let items: Vec<Value> = (0..200_000)
        .map(|i| json!({"i": i, "s": "xxxxxxxx"}))
        .collect();
    let big = serde_json::to_string(&json!({ "items": items })).unwrap();
    assert!(big.len() > 5_000_000);
    let parsed = timed("10 MB JSON", || parse_output(&big));
    assert_eq!(parsed.format, OutputFormat::Json);

    // The same data as a Python literal.
    let python = big.replace("\"", "'");
    let parsed = timed("10 MB Python literal", || parse_output(&python));
    assert_eq!(parsed.format, OutputFormat::PythonLiteral);
    assert_eq!(parsed.value["items"][199_999]["i"], json!(199_999));

    // 10 MB of prose with a brace every few bytes and JSON at the very end.
    let mut prose = "word { and [ more } text ] ".repeat(400_000);
    prose.push_str("finally {\"found\": true}");
    let parsed = timed("10 MB prose with brackets", || parse_output(&prose));
    assert_eq!(parsed.format, OutputFormat::EmbeddedJson);
    assert_eq!(parsed.value, json!({"found": true}));

    // 10 MB of unbalanced open braces.
    let opens = "{".repeat(10_000_000);
    let parsed = timed("10 MB of '{'", || parse_output(&opens));
    assert_eq!(parsed.format, OutputFormat::PlainText);

    // 10 MB of balanced but invalid spans nested a few levels: the search gives up in time.
    let spans = "{x {y {z}}} ".repeat(900_000);
    let parsed = timed("10 MB of bracketed non-JSON", || parse_output(&spans));
    assert_eq!(parsed.format, OutputFormat::PlainText);

    // 10 MB of fence markers on one line, and a fence whose body is one 10 MB line full of
    // markers that do not start a line: both would be quadratic with a naive line search.
    let markers = "```".repeat(3_300_000);
    let parsed = timed("10 MB of ``` markers", || parse_output(&markers));
    assert_eq!(parsed.format, OutputFormat::PlainText);
    let body = format!("```json\n{}", "x```".repeat(2_500_000));
    let parsed = timed("10 MB fence body line", || parse_output(&body));
    assert!(
        parsed.notes.iter().any(|n| n.contains("never closed")),
        "{:?}",
        parsed.notes
    );

    // An unterminated fence at the start of 10 MB.
    let fence = format!("```json\n{}", "{\"a\": 1, ".repeat(1_000_000));
    let parsed = timed("10 MB unterminated fence", || parse_output(&fence));
    assert!(
        parsed.notes.iter().any(|n| n.contains("never closed")),
        "{:?}",
        parsed.notes
    );
}

#[test]
fn invalid_utf8_is_an_error_naming_the_byte() {
    let mut bytes = b"line one\n{\"a\": \"".to_vec();
    bytes.extend_from_slice(&[0xC3, 0x28]);
    bytes.extend_from_slice(b"\"}");
    let error = parse_output_bytes(&bytes).unwrap_err();
    assert_eq!((error.offset, error.line, error.column), (16, 2, 8));
    assert!(error.to_string().contains("not valid UTF-8"));

    let mut huge = vec![b'a'; 10_000_000];
    huge.push(0xFF);
    let error = timed("10 MB then a bad byte", || {
        parse_output_bytes(&huge).unwrap_err()
    });
    assert_eq!(error.offset, 10_000_000);
}

#[test]
fn templates_stop_runaway_work() {
    let store = ContextStore::new();
    let options = RenderOptions::fixed(0);
    let endless =
        "{% for i in range(100000) %}{% for j in range(100000) %}{{ i }}{% endfor %}{% endfor %}";
    let error = timed("runaway loop", || {
        render(endless, &store, &options).unwrap_err()
    });
    assert!(matches!(error, TemplateError::OutOfFuel { .. }), "{error}");

    let deep = format!("{{{{ {}1{} }}}}", "(".repeat(10_000), ")".repeat(10_000));
    let error = timed("deep template expression", || {
        render(&deep, &store, &options).unwrap_err()
    });
    assert!(matches!(error, TemplateError::Syntax { .. }), "{error}");

    // A long chain of values that render each other stops at the nesting limit.
    let mut chain = serde_json::Map::new();
    for i in 0..100 {
        chain.insert(format!("k{i}"), json!(format!("{{{{k{}}}}}", i + 1)));
    }
    let store = ContextStore::from_map(chain);
    let error = timed("value chain", || {
        render("{{k0}}", &store, &options).unwrap_err()
    });
    assert!(matches!(error, TemplateError::TooDeep { .. }), "{error}");

    // A 2 MB template with 100,000 tags renders in time; a smaller fuel budget stops it with a
    // clear error.
    let big = "{{ a }} plain text ".repeat(100_000);
    let store = ContextStore::from_map(json!({"a": 1}).as_object().unwrap().clone());
    let rendered = timed("2 MB template", || render(&big, &store, &options).unwrap());
    assert_eq!(rendered.text.len(), "1 plain text ".len() * 100_000);
    let options = options.with_fuel(10_000);
    let error = timed("2 MB template", || {
        render(&big, &store, &options).unwrap_err()
    });
    assert!(
        matches!(error, TemplateError::OutOfFuel { fuel: 10_000 }),
        "{error}"
    );
}

#[test]
fn a_template_that_writes_too_much_stops_at_the_output_limit() {
    let store = ContextStore::new();
    // A gigabyte of output, in 10 KB pieces: stopped at the limit, while writing.
    let flood = r#"{% for i in range(100000) %}{{ "y" * 10000 }}{% endfor %}"#;
    let error = timed("output flood", || {
        render(flood, &store, &RenderOptions::fixed(0)).unwrap_err()
    });
    assert_eq!(
        error,
        TemplateError::OutputTooLarge {
            limit: 16 * 1024 * 1024
        }
    );
    assert_eq!(
        error.to_string(),
        "template output exceeds 16777216 bytes (a loop or repetition that writes too much?)"
    );
    // A smaller limit, and an output just under it.
    let options = RenderOptions::fixed(0).with_max_output_bytes(1000);
    let error = render(r#"{{ "x" * 1001 }}"#, &store, &options).unwrap_err();
    assert_eq!(error, TemplateError::OutputTooLarge { limit: 1000 });
    let text = render(r#"{{ "x" * 1000 }}"#, &store, &options)
        .unwrap()
        .text;
    assert_eq!(text.len(), 1000);
    // A value's own template is held to the limit too.
    let store = ContextStore::from_map(
        json!({"big": "{{ 'z' * 2000 }}"})
            .as_object()
            .unwrap()
            .clone(),
    );
    let error = render("{{ big }}", &store, &options).unwrap_err();
    assert!(error.to_string().contains("exceeds 1000 bytes"), "{error}");
}

/// The most memory this test process has held, in kB (`VmHWM`).
fn peak_memory_kb() -> u64 {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|status| {
            status
                .lines()
                .find_map(|line| line.strip_prefix("VmHWM:"))
                .and_then(|value| value.trim().trim_end_matches("kB").trim().parse().ok())
        })
        .unwrap_or(0)
}

#[test]
fn a_template_cannot_grow_its_memory_past_what_its_fuel_pays_for() {
    let store = ContextStore::new();
    for template in [
        // Doubling a string 40 times would make 10 TB.
        r#"{% set ns = namespace(s="xxxxxxxxxx") %}{% for i in range(40) %}{% set ns.s = ns.s ~ ns.s %}{% endfor %}{{ ns.s | length }}"#,
        // The same without a loop: 128 MB by the last line.
        r#"{% set a = "x" * 1000000 %}{% set b = a ~ a %}{% set c = b ~ b %}{% set d = c ~ c %}{% set e = d ~ d %}{% set f = e ~ e %}{% set g = f ~ f %}{% set h = g ~ g %}{{ h | length }}"#,
        // One repetition of 100 million characters.
        r#"{{ ("x" * 99999999) | length }}"#,
        // A replacement that squares a string's length: 10 GB.
        r#"{% set s = "x" * 100000 %}{{ s | replace("x", s) | length }}"#,
        // A list that repeats one long string costs little to make and 10 GB as text: every
        // way of turning it into text measures first.
        r#"{% set s = "x" * 100000 %}{{ ([s] * 100000) | join | length }}"#,
        r#"{% set s = "x" * 100000 %}{{ ([s] * 100000) | join(",") | length }}"#,
        r#"{% set s = "x" * 100000 %}{{ ([s] * 100000) | tojson | length }}"#,
        r#"{% set s = "x" * 100000 %}{{ ([s] * 100000) | tojson(indent=100) | length }}"#,
        r#"{% set s = "x" * 100000 %}{{ dict(a=[s] * 100000) | tojson | length }}"#,
        r#"{% set s = "x" * 100000 %}{{ ([s] * 100000) | string | length }}"#,
        r#"{% set s = "x" * 100000 %}{{ ([s] * 100000) | pprint | length }}"#,
        r#"{% set s = "x" * 100000 %}{{ [s] * 100000 }}"#,
        r#"{% set s = "x" * 100000 %}{% set big %}{{ [s] * 100000 }}{% endset %}{{ big | length }}"#,
    ] {
        let error = timed("memory bomb", || {
            render(template, &store, &RenderOptions::fixed(0)).unwrap_err()
        });
        assert!(
            matches!(
                error,
                TemplateError::OutOfFuel { .. } | TemplateError::OutputTooLarge { .. }
            ),
            "{template}: {error}"
        );
    }
    // Each stopped near the 64 MB its fuel pays for, long before the gigabytes it asked for.
    let peak = peak_memory_kb();
    assert!(peak < 1024 * 1024, "the process grew to {peak} kB");
}
