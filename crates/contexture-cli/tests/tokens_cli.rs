//! End-to-end tests of `contexture tokens` and `contexture models`, running the built binary.

use crate::common;

use common::{RunToEnd, contexture};
use contexture_store::testing::TempDir;

const EXAMPLE: &str = concat!(
    env!("CARGO_MANIFEST_DIR"),
    "/../../examples/conversation.json"
);

#[test]
fn counts_text_from_stdin_and_file() {
    assert_eq!(
        contexture(["tokens", "count"])
            .run_with_input(b"hello world")
            .expect_success(),
        "2\n"
    );
    let text = "naïve café 東京 🚀 fn main() { println!(\"hi\"); }";
    let counted: usize = contexture(["tokens", "count", "--encoding", "cl100k_base"])
        .run_with_input(text.as_bytes())
        .expect_success()
        .trim()
        .parse()
        .unwrap();
    // The library's count, which tests/tokens_oracle.rs ties to tiktoken.
    assert_eq!(counted, contexture_core::Encoding::Cl100kBase.count(text));
    let from_file: u32 = contexture(["tokens", "count", EXAMPLE])
        .run()
        .expect_success()
        .trim()
        .parse()
        .unwrap();
    assert!(from_file > 100, "{from_file}");
}

#[test]
fn counts_a_large_file_read_in_parts_as_the_whole_text() {
    // Several of the command's 1 MiB reads, with characters of 2, 3 and 4 bytes and white
    // space runs falling across their ends.
    let paragraph = "naïve café 東京 🚀🚀 fn main() {\n    println!(\"hi\");\n}\n\n\u{3000}  \t";
    let text = paragraph.repeat(3 * (1 << 20) / paragraph.len() + 7);
    let dir = TempDir::new("tokens-large");
    let file = dir.path().join("large.txt");
    std::fs::write(&file, &text).unwrap();
    for encoding in contexture_core::Encoding::ALL {
        let counted: usize = contexture(["tokens", "count", "--encoding", encoding.name()])
            .arg(&file)
            .run()
            .expect_success()
            .trim()
            .parse()
            .unwrap();
        assert_eq!(counted, encoding.count(&text), "{encoding}");
    }
    // Standard input is read the same way.
    let counted: usize = contexture(["tokens", "count"])
        .run_with_input(text.as_bytes())
        .expect_success()
        .trim()
        .parse()
        .unwrap();
    assert_eq!(counted, contexture_core::Encoding::O200kBase.count(&text));
}

#[test]
fn invalid_utf8_past_the_first_read_is_located() {
    let mut bytes = "line of text\n".repeat(100_000).into_bytes();
    let at = bytes.len();
    bytes.extend_from_slice(b"ok \xe6\x9d");
    let error = contexture(["tokens", "count"])
        .run_with_input(&bytes)
        .expect_failure();
    assert!(
        error.contains(&format!(
            "standard input: not valid UTF-8 at byte {} (line 100001, column 4)",
            at + 3
        )),
        "{error}"
    );
}

#[test]
fn counts_a_request_by_the_chat_recipe() {
    let total = contexture([
        "tokens",
        "count",
        "--messages",
        "--model",
        "gpt-4o",
        EXAMPLE,
    ])
    .run()
    .expect_success();
    let json = contexture([
        "tokens",
        "count",
        "--messages",
        "--model",
        "gpt-4o",
        "--json",
        EXAMPLE,
    ])
    .run()
    .expect_success();
    let report: serde_json::Value = serde_json::from_str(&json).unwrap();
    assert_eq!(report["total"].to_string(), total.trim());
    let per_message: u64 = report["messages"]
        .as_array()
        .unwrap()
        .iter()
        .map(|m| m["tokens"].as_u64().unwrap())
        .sum();
    assert_eq!(per_message + 3, report["total"].as_u64().unwrap());
    assert_eq!(report["budget"]["used"], report["total"]);
    insta::assert_snapshot!("tokens_count_messages_json", json);
}

#[test]
fn models_show_and_list() {
    insta::assert_snapshot!(
        "models_show_gpt41_mini",
        contexture(["models", "show", "gpt-4.1-mini"])
            .run()
            .expect_success()
    );
    let list = contexture(["models", "list"]).run().expect_success();
    for family in [
        "gpt-4o",
        "claude-sonnet-4-5",
        "gemini-2.5-pro",
        "llama-3.1",
        "mistral-large",
        "qwen3",
    ] {
        assert!(list.contains(family), "{family} missing from the list");
    }
}

#[test]
fn a_models_file_overrides_entries() {
    let dir = TempDir::new("contexture-models");
    let file = dir.join("models.toml");
    std::fs::write(
        &file,
        "[models.\"in-house\"]\ncontext_window = 4096\nmax_output_tokens = 512\nencoding = \"cl100k_base\"\n",
    )
    .unwrap();
    let shown = contexture([
        "models",
        "show",
        "in-house-v2",
        "--models",
        file.to_str().unwrap(),
    ])
    .run()
    .expect_success();
    assert!(shown.contains("\"context_window\": 4096"), "{shown}");
    std::fs::write(&file, "[models.\"in-house\"]\ncontext_window = \"big\"\n").unwrap();
    let error = contexture([
        "models",
        "show",
        "in-house",
        "--models",
        file.to_str().unwrap(),
    ])
    .run()
    .expect_failure();
    assert!(
        error.contains("models.toml") && error.contains("line 2"),
        "{error}"
    );
}

#[test]
fn bad_input_fails_with_a_located_message() {
    let cases: &[(&[&str], &[u8], &str)] = &[
        (
            &["tokens", "count"],
            b"ok \xff\xfe",
            "not valid UTF-8 at byte 3 (line 1, column 4)",
        ),
        (
            &["tokens", "count", "--encoding", "p50k_base"],
            b"x",
            "unknown encoding `p50k_base`",
        ),
        (
            &["tokens", "count", "--model", "no-such-model"],
            b"x",
            "unknown model `no-such-model`",
        ),
        (
            &["tokens", "count", "--messages"],
            b"[{\"role\": \"user\",\n \"content\": }]",
            "invalid JSON at line 2, column 13",
        ),
        (
            &["tokens", "count", "--messages"],
            b"[{\"role\": \"usr\", \"content\": \"x\"}]",
            "messages[0].role",
        ),
        (
            &["tokens", "count", "--messages"],
            b"{\"role\": \"user\"}",
            "not a chat message array",
        ),
        (
            &["tokens", "count", "/no/such/file"],
            b"",
            "cannot read /no/such/file",
        ),
        (
            &["models", "show", "no-such-model"],
            b"",
            "unknown model `no-such-model`",
        ),
    ];
    for (args, stdin, expected) in cases {
        let error = contexture(*args).run_with_input(stdin).expect_failure();
        assert!(error.contains(expected), "{args:?}: {error}");
    }
}

/// `models show` of a model whose tokens are estimated shows what its family's calibration
/// learnt from reported usage, read from `--db` (the counter shown is the calibrated one);
/// without a store it shows that nothing was read. A store that cannot be opened is named.
#[test]
fn models_show_gives_the_calibration_of_an_estimated_model() {
    use contexture_core::calibration::Observation;
    use contexture_store::Store;
    let dir = TempDir::new("contexture-models-calibration");
    let runtime = tokio::runtime::Runtime::new().expect("runtime");
    runtime.block_on(async {
        let store = contexture_store::SqliteStore::open(dir.join("runs.db"))
            .await
            .expect("open the store");
        for reported in [1100, 1200, 1150] {
            store
                .observe_calibration(
                    "claude-sonnet-4-5",
                    Observation {
                        estimated: 1000,
                        reported,
                    },
                )
                .await
                .expect("observe");
        }
    });
    let db = format!("sqlite:{}", dir.join("runs.db").display());
    let shown: serde_json::Value = serde_json::from_str(
        &contexture(["models", "show", "claude-sonnet-4-5", "--db", &db])
            .run()
            .expect_success(),
    )
    .unwrap();
    assert_eq!(shown["counter"]["ratio"], 1.2);
    assert_eq!(shown["counter"]["calibration"], 1.2);
    assert_eq!(shown["estimate_calibration"]["factor"], 1.2);
    assert_eq!(shown["estimate_calibration"]["kept"], 3);
    assert_eq!(shown["estimate_calibration"]["family"], "claude-sonnet-4-5");

    let unread: serde_json::Value = serde_json::from_str(
        &contexture(["models", "show", "claude-sonnet-4-5"])
            .current_dir(dir.join("."))
            .run()
            .expect_success(),
    )
    .unwrap();
    assert_eq!(
        unread["estimate_calibration"]["factor"],
        serde_json::Value::Null
    );
    assert_eq!(
        unread["estimate_calibration"]["store"],
        serde_json::Value::Null
    );
    assert!(unread["counter"].get("calibration").is_none());

    let error = contexture([
        "models",
        "show",
        "claude-sonnet-4-5",
        "--db",
        "postgres://nobody@127.0.0.1:1/none",
    ])
    .run()
    .expect_failure();
    assert!(
        error.contains("cannot open the store postgres://"),
        "{error}"
    );
}
