//! Tests as data for the workflow context store, in minijinja's style: every file under
//! `tests/inputs/context/<kind>/` is one case (`insta::glob!`), and its result is pinned by an
//! insta snapshot `tests/snapshots/context_data__<kind>@<file>.snap`. Bad inputs are cases too; their
//! snapshot is the error. Regenerate after a deliberate change with
//! `INSTA_UPDATE=always cargo test -p contexture-core --test integration context_data::` and review the diff.
//!
//! Kinds:
//! - `parse/*.txt|*.bin`: a raw step output -> parsed value, format, what it stores, notes.
//! - `flags/*.json`: `{store, output, flags}` -> the transition outcome (one file per row of the
//!   precedence table in docs/context-store.md, plus the page's examples).
//! - `templates/*.txt`: a JSON header (`context`, optional `missing`, `fuel`, `variables`), a
//!   line `---`,
//!   then the template -> rendered text, used keys, missing paths, or the error.
//! - `expr/*.txt`: a JSON header (`context`, optional `output`), `---`, then one expression
//!   per line -> its value or error.
//! - `iter/*.json`: `{context, output?, iter_key, keep?, writes?, policy?}` -> items and merge.
//! - `flows/*.json`: a page example as a sequence of steps over one store (user input, task
//!   templates, outputs under flags, conditions, tool arguments, iteration) -> the trace.

use std::fmt::Write as _;

use contexture_core::context::args::resolve_args;
use contexture_core::context::iter::{merge_results, plan_items};
use contexture_core::context::{
    Branch, Condition, ContextStore, MergePolicy, MissingPolicy, RenderOptions, Scope,
    TransitionFlags, apply_transition, parse_output, parse_output_bytes, render, select_items,
};
use serde::Deserialize;
use serde_json::{Map, Value, json};

/// A fixed moment for dynamic variables: 2024-05-06T09:30:15Z, a Monday.
const NOW: i64 = 1_714_987_815;

fn pretty(value: &impl serde::Serialize) -> String {
    serde_json::to_string_pretty(value).expect("serializable")
}

/// Splits a `header JSON` / `---` / body file.
fn split_header(text: &str) -> (Value, &str) {
    let (header, body) = text
        .split_once("\n---\n")
        .expect("a header line, then a line `---`, then the body");
    (serde_json::from_str(header).expect("header is JSON"), body)
}

fn store_of(value: Option<&Value>) -> ContextStore {
    match value {
        Some(Value::Object(map)) => ContextStore::from_map(map.clone()),
        None | Some(Value::Null) => ContextStore::new(),
        Some(other) => panic!("a context must be an object, not {other}"),
    }
}

#[test]
fn parse() {
    insta::glob!("inputs/context/parse/*", |path| {
        let bytes = std::fs::read(path).expect("input");
        let body = match parse_output_bytes(&bytes) {
            Ok(parsed) => format!(
                "format: {}\nvalue: {}\nstored: {}\nnotes: {}\n",
                pretty(&parsed.format),
                pretty(&parsed.value),
                pretty(&parsed.stored()),
                pretty(&parsed.notes)
            ),
            Err(error) => format!("error: {error}\n"),
        };
        insta::assert_snapshot!(body);
    });
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct FlagsCase {
    #[serde(default)]
    about: String,
    #[serde(default)]
    store: Option<Value>,
    output: String,
    #[serde(default)]
    flags: TransitionFlags,
}

#[test]
fn flags() {
    insta::glob!("inputs/context/flags/*", |path| {
        let case: FlagsCase =
            serde_json::from_str(&std::fs::read_to_string(path).expect("input")).expect("case");
        let store = store_of(case.store.as_ref());
        let outcome = apply_transition(&case.flags, &store, &parse_output(&case.output));
        let body = format!("# {}\n{}\n", case.about, pretty(&outcome));
        insta::assert_snapshot!(body);
    });
}

#[test]
fn templates() {
    insta::glob!("inputs/context/templates/*", |path| {
        let text = std::fs::read_to_string(path).expect("input");
        let (header, template) = split_header(&text);
        let mut options = RenderOptions::fixed(NOW);
        if let Some(missing) = header.get("missing") {
            options = options.with_missing(
                missing
                    .as_str()
                    .expect("missing is a string")
                    .parse()
                    .expect("policy"),
            );
        }
        if let Some(Value::Object(variables)) = header.get("variables") {
            for (name, value) in variables {
                options = options.with_variable(name.clone(), value.clone());
            }
        }
        if let Some(fuel) = header.get("fuel") {
            options = options.with_fuel(fuel.as_u64().expect("fuel is a number"));
        }
        let store = store_of(header.get("context"));
        let body = match render(template, &store, &options) {
            Ok(rendered) => format!(
                "used_keys: {:?}\nmissing: {:?}\n----- text -----\n{}",
                rendered.used_keys, rendered.missing, rendered.text
            ),
            Err(error) => format!("error: {error}\n"),
        };
        insta::assert_snapshot!(body);
    });
}

#[test]
fn expr() {
    insta::glob!("inputs/context/expr/*", |path| {
        let text = std::fs::read_to_string(path).expect("input");
        let (header, lines) = split_header(&text);
        let store = store_of(header.get("context"));
        let output = header.get("output").cloned();
        let mut scope = Scope::new(&store);
        if let Some(output) = &output {
            scope = scope.with_output(output);
        }
        let mut body = String::new();
        for line in lines.lines().filter(|l| !l.trim().is_empty()) {
            let result = Condition::compile(line).and_then(|c| {
                let value = c.value(scope)?;
                let truth = c.is_true(scope)?;
                Ok((value, truth))
            });
            match result {
                Ok((value, truth)) => {
                    writeln!(body, "{line}\n  => {value} ({truth})").expect("write")
                }
                Err(error) => writeln!(body, "{line}\n  => error: {error}").expect("write"),
            }
        }
        insta::assert_snapshot!(body);
    });
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct IterCase {
    #[serde(default)]
    about: String,
    #[serde(default)]
    context: Option<Value>,
    #[serde(default)]
    output: Option<Value>,
    iter_key: String,
    #[serde(default)]
    keep: Option<Vec<String>>,
    /// What each item writes to its own context, by item index.
    #[serde(default)]
    writes: Vec<Map<String, Value>>,
    #[serde(default)]
    policy: MergePolicy,
}

#[test]
fn iter() {
    insta::glob!("inputs/context/iter/*", |path| {
        let case: IterCase =
            serde_json::from_str(&std::fs::read_to_string(path).expect("input")).expect("case");
        let store = store_of(case.context.as_ref());
        let mut body = format!("# {}\n", case.about);
        match select_items(&case.iter_key, &store, case.output.as_ref()) {
            Err(error) => writeln!(body, "error: {error}").expect("write"),
            Ok(items) => {
                let planned = plan_items(items, &store, case.keep.as_deref());
                writeln!(body, "items: {}", pretty(&planned)).expect("write");
                if !case.writes.is_empty() {
                    let results: Vec<ContextStore> = planned
                        .iter()
                        .zip(&case.writes)
                        .map(|(item, writes)| {
                            let mut end = item.store.clone();
                            for (k, v) in writes {
                                end.insert(k.clone(), v.clone());
                            }
                            end
                        })
                        .collect();
                    match merge_results(&store, &planned, &results, case.policy) {
                        Ok(merged) => writeln!(body, "merged: {}", pretty(&merged)),
                        Err(error) => writeln!(body, "merge error: {error}"),
                    }
                    .expect("write");
                }
            }
        }
        insta::assert_snapshot!(body);
    });
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct Flow {
    #[serde(default)]
    about: String,
    /// The user's input that starts the workflow.
    #[serde(default)]
    input: Option<String>,
    /// A store to start from instead of (or before) the input.
    #[serde(default)]
    store: Option<Value>,
    steps: Vec<FlowStep>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct FlowStep {
    id: String,
    /// A task (or prompt) template, rendered against the store before the step runs.
    #[serde(default)]
    task: Option<String>,
    #[serde(default)]
    missing: Option<MissingPolicy>,
    /// Configured tool arguments, rendered against the store.
    #[serde(default)]
    tool_args: Option<Map<String, Value>>,
    /// The step's raw output.
    #[serde(default)]
    output: Option<String>,
    #[serde(default)]
    flags: TransitionFlags,
    /// A condition evaluated after the output was applied.
    #[serde(default)]
    condition: Option<Branch<String>>,
    /// An iter_key evaluated after the output was applied.
    #[serde(default)]
    iter_key: Option<String>,
}

#[test]
fn flows() {
    insta::glob!("inputs/context/flows/*", |path| {
        let flow: Flow =
            serde_json::from_str(&std::fs::read_to_string(path).expect("input")).expect("flow");
        let mut store = store_of(flow.store.as_ref());
        let mut body = format!("# {}\n", flow.about);
        if let Some(input) = &flow.input {
            for (k, v) in ContextStore::from_user_input(input).into_map() {
                store.insert(k, v);
            }
            writeln!(body, "user input -> store: {}", pretty(&store)).expect("write");
        }
        let options = RenderOptions::fixed(NOW);
        for step in &flow.steps {
            writeln!(body, "\n== {}", step.id).expect("write");
            if let Some(task) = &step.task {
                let options = options
                    .clone()
                    .with_missing(step.missing.unwrap_or_default());
                match render(task, &store, &options) {
                    Ok(r) => writeln!(
                        body,
                        "task (used {:?}, missing {:?}):\n{}",
                        r.used_keys, r.missing, r.text
                    ),
                    Err(e) => writeln!(body, "task error: {e}"),
                }
                .expect("write");
            }
            if let Some(args) = &step.tool_args {
                match resolve_args(args, &store, &options) {
                    Ok(r) => writeln!(
                        body,
                        "tool_args (used {:?}): {}",
                        r.used_keys,
                        pretty(&r.args)
                    ),
                    Err(e) => writeln!(body, "tool_args error: {e}"),
                }
                .expect("write");
            }
            let mut last_output = None;
            if let Some(output) = &step.output {
                let parsed = parse_output(output);
                let outcome = apply_transition(&step.flags, &store, &parsed);
                writeln!(
                    body,
                    "output parsed as {}; in history: {}; clear prior messages: {}\nchanges: {}\nstore: {}",
                    pretty(&parsed.format),
                    outcome.output_in_history,
                    outcome.clear_prior_messages,
                    pretty(&outcome.changes),
                    pretty(&outcome.store)
                )
                .expect("write");
                store = outcome.store;
                last_output = Some(parsed.value);
            }
            if let Some(branch) = &step.condition {
                let mut scope = Scope::new(&store);
                if let Some(output) = &last_output {
                    scope = scope.with_output(output);
                }
                match branch.choose(scope) {
                    Ok(target) => writeln!(body, "condition {} -> {target}", branch.condition),
                    Err(e) => writeln!(body, "condition error: {e}"),
                }
                .expect("write");
            }
            if let Some(iter_key) = &step.iter_key {
                match select_items(iter_key, &store, last_output.as_ref()) {
                    Ok(items) => writeln!(body, "iter_key {iter_key} -> {}", json!(items)),
                    Err(e) => writeln!(body, "iter_key error: {e}"),
                }
                .expect("write");
            }
        }
        insta::assert_snapshot!(body);
    });
}
