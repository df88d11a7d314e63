//! The checks a workflow passes before it runs. Each problem is a node path and a message;
//! [`super::Workflow::load`] turns paths into file positions.

use std::collections::{BTreeSet, HashMap, VecDeque};

use contexture_core::context::ContextStore;
use contexture_core::context::template::{RenderOptions, TemplateError, render};
use serde_json::Value;

use super::{END, Workflow};

type Problems = Vec<(String, String)>;

/// Every problem of `workflow`, unordered.
pub(super) fn problems(workflow: &Workflow) -> Problems {
    let mut problems = Problems::new();
    if workflow.states.is_empty() {
        problems.push((
            "states".into(),
            "a workflow needs at least one state".into(),
        ));
        return problems;
    }
    unique_ids(
        "assistants",
        workflow.assistants.iter().map(|a| a.id.as_str()),
        &mut problems,
    );
    unique_ids(
        "tools",
        workflow.tools.iter().map(|t| t.id.as_str()),
        &mut problems,
    );
    unique_ids(
        "states",
        workflow.states.iter().map(|s| s.id.as_str()),
        &mut problems,
    );
    assistants(workflow, &mut problems);
    tools(workflow, &mut problems);
    states(workflow, &mut problems);
    reachability(workflow, &mut problems);
    problems
}

fn unique_ids<'a>(section: &str, ids: impl Iterator<Item = &'a str>, problems: &mut Problems) {
    let mut seen: HashMap<&str, usize> = HashMap::new();
    for (index, id) in ids.enumerate() {
        let path = format!("{section}[{index}].id");
        if id.trim().is_empty() {
            problems.push((path, "the id is empty".into()));
        } else if let Some(first) = seen.insert(id, index) {
            problems.push((
                path,
                format!("duplicate id `{id}` (first used by {section}[{first}])"),
            ));
        }
    }
}

fn known(ids: impl Iterator<Item = String>) -> String {
    let mut ids: Vec<String> = ids.collect();
    let mut seen = BTreeSet::new();
    ids.retain(|id| seen.insert(id.clone()));
    if ids.is_empty() {
        "none are declared".into()
    } else {
        format!("declared: {}", ids.join(", "))
    }
}

fn assistants(workflow: &Workflow, problems: &mut Problems) {
    for (index, assistant) in workflow.assistants.iter().enumerate() {
        let base = format!("assistants[{index}]");
        if assistant.model.trim().is_empty() {
            problems.push((format!("{base}.model"), "the model is empty".into()));
        }
        for (n, tool) in assistant.tools.iter().enumerate() {
            if workflow.tool(tool).is_none() {
                problems.push((
                    format!("{base}.tools[{n}]"),
                    format!(
                        "unknown tool `{tool}` ({})",
                        known(workflow.tools.iter().map(|t| t.id.clone()))
                    ),
                ));
            }
        }
        if let Some(prompt) = &assistant.system_prompt {
            template(prompt, format!("{base}.system_prompt"), problems);
        }
        let policy = &assistant.context;
        if !["last", "first", "head_tail", "head-tail"].contains(&policy.strategy.as_str()) {
            problems.push((
                format!("{base}.context.strategy"),
                format!(
                    "unknown strategy `{}` (expected last, first or head_tail)",
                    policy.strategy
                ),
            ));
        }
        if !(policy.budget_ratio > 0.0 && policy.budget_ratio <= 1.0) {
            problems.push((
                format!("{base}.context.budget_ratio"),
                format!(
                    "budget_ratio must be greater than 0 and at most 1, not {}",
                    policy.budget_ratio
                ),
            ));
        }
    }
}

fn tools(workflow: &Workflow, problems: &mut Problems) {
    for (index, tool) in workflow.tools.iter().enumerate() {
        for (name, value) in &tool.arguments {
            templates_in(value, format!("tools[{index}].arguments.{name}"), problems);
        }
    }
}

fn templates_in(value: &Value, path: String, problems: &mut Problems) {
    match value {
        Value::String(text) => template(text, path, problems),
        Value::Array(items) => {
            for (index, item) in items.iter().enumerate() {
                templates_in(item, format!("{path}[{index}]"), problems);
            }
        }
        Value::Object(map) => {
            for (key, item) in map {
                templates_in(item, format!("{path}.{key}"), problems);
            }
        }
        _ => {}
    }
}

/// Reports a template that does not parse. Rendering against an empty store with the default
/// (keep) policy surfaces exactly the syntax errors: missing variables are kept, not errors.
fn template(text: &str, path: String, problems: &mut Problems) {
    if let Err(error @ TemplateError::Syntax { .. }) =
        render(text, &ContextStore::default(), &RenderOptions::fixed(0))
    {
        problems.push((path, error.to_string()));
    }
}

fn states(workflow: &Workflow, problems: &mut Problems) {
    for (index, state) in workflow.states.iter().enumerate() {
        let base = format!("states[{index}]");
        if state.id == END {
            problems.push((
                format!("{base}.id"),
                format!("`{END}` is reserved: it ends the workflow"),
            ));
        }
        let kinds = [
            state.assistant_id.is_some(),
            state.tool_id.is_some(),
            state.transform.is_some(),
        ];
        if kinds.iter().filter(|&&set| set).count() > 1 {
            problems.push((
                base.clone(),
                "a state runs one thing: give only one of assistant_id, tool_id and transform"
                    .into(),
            ));
        }
        if let Some(id) = &state.assistant_id
            && workflow.assistant(id).is_none()
        {
            problems.push((
                format!("{base}.assistant_id"),
                format!(
                    "unknown assistant `{id}` ({})",
                    known(workflow.assistants.iter().map(|a| a.id.clone()))
                ),
            ));
        }
        if let Some(id) = &state.tool_id
            && workflow.tool(id).is_none()
        {
            problems.push((
                format!("{base}.tool_id"),
                format!(
                    "unknown tool `{id}` ({})",
                    known(workflow.tools.iter().map(|t| t.id.clone()))
                ),
            ));
        }
        if let Some(task) = &state.task {
            template(task, format!("{base}.task"), problems);
        }
        for (key, value) in state.transform.iter().flatten() {
            template(value, format!("{base}.transform.{key}"), problems);
        }
        let Some(next) = &state.next else {
            continue;
        };
        let ways = [
            next.state_id.is_some(),
            next.condition.is_some(),
            next.switch.is_some(),
            next.end,
        ]
        .iter()
        .filter(|&&set| set)
        .count();
        if ways == 0 {
            problems.push((
                format!("{base}.next"),
                "next needs one of state_id, condition, switch or end: true".into(),
            ));
        } else if ways > 1 {
            problems.push((
                format!("{base}.next"),
                "next takes only one of state_id, condition, switch and end".into(),
            ));
        }
        for (target, sub) in next.targets() {
            if target != END && workflow.state(target).is_none() {
                problems.push((
                    format!("{base}.next.{sub}"),
                    format!(
                        "unknown state `{target}` ({}, or `{END}`)",
                        known(workflow.states.iter().map(|s| s.id.clone()))
                    ),
                ));
            }
        }
        if let Some(key) = &next.iter_key
            && key.trim().is_empty()
        {
            problems.push((
                format!("{base}.next.iter_key"),
                "iter_key is empty: name a context list, or a JSON pointer such as /items".into(),
            ));
        }
        if let Some(key) = &next.output_key
            && key.trim().is_empty()
        {
            problems.push((
                format!("{base}.next.output_key"),
                "output_key is empty".into(),
            ));
        }
    }
}

/// States no path from the first state reaches.
fn reachability(workflow: &Workflow, problems: &mut Problems) {
    let mut reached: BTreeSet<&str> = BTreeSet::new();
    let mut queue: VecDeque<&str> = VecDeque::from([workflow.states[0].id.as_str()]);
    while let Some(id) = queue.pop_front() {
        if !reached.insert(id) {
            continue;
        }
        if let Some(next) = workflow.state(id).and_then(|state| state.next.as_ref()) {
            queue.extend(next.targets().into_iter().map(|(target, _)| target));
        }
    }
    for (index, state) in workflow.states.iter().enumerate() {
        if !reached.contains(state.id.as_str()) {
            problems.push((
                format!("states[{index}].id"),
                format!(
                    "state `{}` is unreachable from the first state `{}`",
                    state.id, workflow.states[0].id
                ),
            ));
        }
    }
}
