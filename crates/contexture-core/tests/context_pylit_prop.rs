//! Property test: the Python-literal parser agrees with CPython's `ast.literal_eval`.
//!
//! Proptest generates Python literals (every quote style, escapes, raw strings, numbers in
//! four bases with underscores, floats, True/False/None, tuples, lists, dicts, trailing commas,
//! comments, line breaks) plus mutated copies of them (truncated, a character deleted or
//! inserted) that are mostly invalid. All of them go to one `python3` process in one batch;
//! for each, CPython either evaluates it (our parser must give the same JSON value), rejects it
//! (ours must reject it too), or produces something without a JSON form (a set, bytes, a
//! complex number: skipped).

use std::io::Write;
use std::process::{Command, Stdio};

use contexture_core::context::pylit;
use proptest::prelude::*;
use proptest::strategy::ValueTree;
use proptest::test_runner::{Config, TestRunner};
use serde_json::Value;

/// How a string literal is written.
#[derive(Debug, Clone, Copy)]
enum Quote {
    Single,
    Double,
    TripleSingle,
    TripleDouble,
    Raw,
}

fn escape_char(c: char, how: u8, out: &mut String) {
    match (c, how % 4) {
        ('\n', _) => out.push_str("\\n"),
        ('\\', _) => out.push_str("\\\\"),
        ('\'', _) => out.push_str("\\'"),
        ('"', _) => out.push_str("\\\""),
        ('\t', 0) => out.push_str("\\t"),
        (c, 1) if (c as u32) < 0x100 => out.push_str(&format!("\\x{:02x}", c as u32)),
        (c, 2) if (c as u32) < 0x10000 => out.push_str(&format!("\\u{:04x}", c as u32)),
        (c, 3) => out.push_str(&format!("\\U{:08x}", c as u32)),
        (c, _) if (c as u32) < 0o400 && how > 200 => {
            out.push_str(&format!("\\{:o}", c as u32));
        }
        (c, _) => out.push(c),
    }
}

fn string_literal(content: &[(char, u8)], quote: Quote) -> String {
    let text: String = content.iter().map(|(c, _)| *c).collect();
    let raw_safe = !text.contains(['\'', '\\', '\n']);
    let quote = match quote {
        Quote::Raw if !raw_safe => Quote::Single,
        q => q,
    };
    let (open, close) = match quote {
        Quote::Single => ("'", "'"),
        Quote::Double => ("\"", "\""),
        Quote::TripleSingle => ("'''", "'''"),
        Quote::TripleDouble => ("\"\"\"", "\"\"\""),
        Quote::Raw => ("r'", "'"),
    };
    let mut out = open.to_owned();
    for &(c, how) in content {
        let plain = how < 128 && !matches!(c, '\n' | '\\' | '\'' | '"');
        if matches!(quote, Quote::Raw) || plain {
            out.push(c);
        } else {
            escape_char(c, how, &mut out);
        }
    }
    out.push_str(close);
    out
}

fn quote_strategy() -> impl Strategy<Value = Quote> {
    prop_oneof![
        Just(Quote::Single),
        Just(Quote::Double),
        Just(Quote::TripleSingle),
        Just(Quote::TripleDouble),
        Just(Quote::Raw),
    ]
}

fn string_strategy() -> impl Strategy<Value = String> {
    let chars = prop_oneof![
        prop::char::range('a', 'z'),
        Just(' '),
        Just('\''),
        Just('"'),
        Just('\\'),
        Just('\n'),
        Just('\t'),
        Just('é'),
        Just('€'),
        Just('😀'),
        Just('{'),
        Just('#'),
    ];
    (
        prop::collection::vec((chars, any::<u8>()), 0..8),
        quote_strategy(),
    )
        .prop_map(|(content, quote)| string_literal(&content, quote))
}

fn int_strategy() -> impl Strategy<Value = String> {
    prop_oneof![
        any::<i32>().prop_map(|n| n.to_string()),
        (0u32..100_000).prop_map(|n| {
            // Decimal with underscores between groups of three.
            let digits = n.to_string();
            let mut out = String::new();
            for (i, c) in digits.chars().enumerate() {
                if i > 0 && (digits.len() - i) % 3 == 0 {
                    out.push('_');
                }
                out.push(c);
            }
            out
        }),
        any::<u16>().prop_map(|n| format!("0x{n:X}")),
        any::<u16>().prop_map(|n| format!("0o{n:o}")),
        any::<u8>().prop_map(|n| format!("0b{n:b}")),
        any::<i16>().prop_map(|n| format!("- {}", n.unsigned_abs())),
    ]
}

fn float_strategy() -> impl Strategy<Value = String> {
    prop_oneof![
        (any::<i16>(), 0u32..10_000).prop_map(|(a, b)| format!("{a}.{b}")),
        (0u32..1000, -20i32..20).prop_map(|(a, e)| format!("{a}e{e}")),
        (0u32..1000).prop_map(|b| format!(".{b}")),
        (0u32..1000).prop_map(|a| format!("{a}.")),
        (1u32..1000, 0u32..100, -5i32..5).prop_map(|(a, b, e)| format!("-{a}.{b}E{e:+}")),
    ]
}

fn leaf_strategy() -> impl Strategy<Value = String> {
    prop_oneof![
        3 => string_strategy(),
        2 => int_strategy(),
        1 => float_strategy(),
        1 => prop_oneof![Just("True".to_owned()), Just("False".to_owned()), Just("None".to_owned())],
    ]
}

/// Separators inside containers: plain, spaced, line breaks, comments.
fn sep_strategy() -> impl Strategy<Value = &'static str> + Clone {
    prop::sample::select(vec![
        ", ",
        ",",
        " ,\n  ",
        ",  # a comment, with ] brackets\n",
    ])
}

fn join(items: &[String], seps: &[&str]) -> String {
    let mut out = String::new();
    for (i, item) in items.iter().enumerate() {
        if i > 0 {
            out.push_str(seps[i % seps.len()]);
        }
        out.push_str(item);
    }
    out
}

fn literal_strategy() -> impl Strategy<Value = String> {
    leaf_strategy().prop_recursive(4, 48, 5, |inner| {
        let seps = prop::collection::vec(sep_strategy(), 1..3);
        prop_oneof![
            (
                prop::collection::vec(inner.clone(), 0..5),
                seps.clone(),
                any::<bool>()
            )
                .prop_map(|(items, seps, trailing)| {
                    let comma = if trailing && !items.is_empty() {
                        ","
                    } else {
                        ""
                    };
                    format!("[{}{comma}]", join(&items, &seps))
                }),
            (
                prop::collection::vec(inner.clone(), 0..4),
                seps.clone(),
                any::<bool>()
            )
                .prop_map(|(items, seps, trailing)| match items.len() {
                    0 => "()".to_owned(),
                    1 => format!("({},)", items[0]),
                    _ => format!(
                        "({}{})",
                        join(&items, &seps),
                        if trailing { "," } else { "" }
                    ),
                }),
            (
                prop::collection::vec(
                    (prop_oneof![string_strategy(), int_strategy()], inner),
                    0..4
                ),
                seps,
                any::<bool>()
            )
                .prop_map(|(pairs, seps, trailing)| {
                    let items: Vec<String> =
                        pairs.iter().map(|(k, v)| format!("{k}: {v}")).collect();
                    let comma = if trailing && !items.is_empty() {
                        ","
                    } else {
                        ""
                    };
                    format!("{{{}{comma}}}", join(&items, &seps))
                }),
        ]
    })
}

/// A mutation of a valid literal, mostly making it invalid.
fn mutate(source: &str, kind: u8, at: usize, insert: char) -> String {
    let chars: Vec<char> = source.chars().collect();
    if chars.is_empty() {
        return source.to_owned();
    }
    let at = at % chars.len();
    let mut out: Vec<char> = chars.clone();
    match kind % 3 {
        0 => out.truncate(at),
        1 => {
            out.remove(at);
        }
        _ => out.insert(at, insert),
    }
    out.into_iter().collect()
}

const PYTHON: &str = r#"
import ast, json, sys
def conv(x):
    if isinstance(x, (list, tuple)):
        return [conv(i) for i in x]
    if isinstance(x, dict):
        return {k: conv(v) for k, v in x.items()}
    if isinstance(x, (set, frozenset, bytes, complex)):
        raise TypeError("no JSON form")
    return x
out = []
for src in json.load(sys.stdin):
    try:
        v = ast.literal_eval(src)
    except Exception as e:
        out.append({"error": type(e).__name__})
        continue
    try:
        out.append({"ok": json.loads(json.dumps(conv(v), allow_nan=False))})
    except Exception as e:
        out.append({"skip": type(e).__name__})
json.dump(out, sys.stdout)
"#;

/// JSON equality with floats compared to the last few bits (Python prints floats in their
/// shortest form; serde_json's default float reader may differ from an exact one by an ULP).
fn same(a: &Value, b: &Value) -> bool {
    match (a, b) {
        (Value::Number(x), Value::Number(y)) => {
            if x.is_f64() != y.is_f64() {
                return false;
            }
            match (x.as_f64(), y.as_f64()) {
                (Some(p), Some(q)) if x.is_f64() => {
                    p == q || (p - q).abs() <= 1e-12 * p.abs().max(q.abs())
                }
                _ => x == y,
            }
        }
        (Value::Array(x), Value::Array(y)) => {
            x.len() == y.len() && x.iter().zip(y).all(|(p, q)| same(p, q))
        }
        (Value::Object(x), Value::Object(y)) => {
            x.len() == y.len() && x.iter().all(|(k, v)| y.get(k).is_some_and(|w| same(v, w)))
        }
        _ => a == b,
    }
}

#[test]
fn agrees_with_cpython_literal_eval() {
    let mut runner = TestRunner::new(Config {
        rng_algorithm: proptest::test_runner::RngAlgorithm::ChaCha,
        ..Config::default()
    });
    let literal = literal_strategy();
    let mutation = (
        any::<u8>(),
        any::<usize>(),
        prop::sample::select(vec![
            ',', ']', ')', '}', '\'', '"', ':', ' ', '#', '\\', 'x', '0', '-', '.', 'e', 'j', '_',
            '(',
        ]),
    );
    let mut sources = Vec::new();
    for _ in 0..600 {
        let source = literal.new_tree(&mut runner).expect("tree").current();
        let (kind, at, insert) = mutation.new_tree(&mut runner).expect("tree").current();
        sources.push(mutate(&source, kind, at, insert));
        sources.push(source);
    }

    let mut child = Command::new("python3")
        .args(["-c", PYTHON])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .expect("python3 is needed for this test (it is on the dev machines and in CI)");
    let input = serde_json::to_vec(&sources).expect("json");
    child
        .stdin
        .take()
        .expect("stdin")
        .write_all(&input)
        .expect("write to python3");
    let output = child.wait_with_output().expect("python3 output");
    assert!(
        output.status.success(),
        "python3 failed: {}",
        String::from_utf8_lossy(&output.stderr)
    );
    let verdicts: Vec<Value> =
        serde_json::from_slice(&output.stdout).expect("python3 printed JSON");
    assert_eq!(verdicts.len(), sources.len());

    let (mut agreed_ok, mut agreed_err, mut skipped) = (0, 0, 0);
    let mut mismatches = Vec::new();
    for (source, verdict) in sources.iter().zip(&verdicts) {
        let ours = pylit::parse(source);
        if let Some(expected) = verdict.get("ok") {
            match &ours {
                Ok(value) if same(value, expected) => agreed_ok += 1,
                _ => mismatches.push(format!(
                    "{source:?}\n  python: {expected}\n  ours:   {ours:?}"
                )),
            }
        } else if verdict.get("error").is_some() {
            match &ours {
                Err(_) => agreed_err += 1,
                Ok(value) => mismatches.push(format!(
                    "{source:?}\n  python: {}\n  ours:   {value}",
                    verdict["error"]
                )),
            }
        } else {
            skipped += 1;
        }
    }
    assert!(
        mismatches.is_empty(),
        "{} of {} literals disagree with CPython:\n{}",
        mismatches.len(),
        sources.len(),
        mismatches
            .iter()
            .take(10)
            .cloned()
            .collect::<Vec<_>>()
            .join("\n")
    );
    // The generator must exercise both sides: plenty of valid and of invalid inputs.
    assert!(agreed_ok > 500, "only {agreed_ok} valid literals");
    assert!(agreed_err > 200, "only {agreed_err} invalid literals");
    eprintln!("agreed: {agreed_ok} valid, {agreed_err} invalid; {skipped} without a JSON form");
}
