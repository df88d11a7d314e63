//! The checks a workflow passes before it runs. Each problem is a node path and a message;
//! [`super::Workflow::load`] turns paths into file positions.

use std::collections::{BTreeSet, HashMap, VecDeque};

use contexture_core::Message;
use contexture_core::context::template::check_syntax;
use contexture_core::context::{ClearContextStore, TemplateFormat};
use contexture_core::registry::Registry;
use contexture_core::thread::{MergeKeys, MergePolicy as ThreadMergePolicy, context_name_problem};
use serde_json::Value;

use super::{Assistant, END, MAX_ITEM_CONCURRENCY, PromptText, Workflow};

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
        workflow.assistants.iter().map(|a| &*a.id),
        &mut problems,
    );
    unique_ids(
        "tools",
        workflow.tools.iter().map(|t| &*t.id),
        &mut problems,
    );
    unique_ids(
        "states",
        workflow.states.iter().map(|s| &*s.id),
        &mut problems,
    );
    settings(workflow, &mut problems);
    assistants(workflow, &mut problems);
    tools(workflow, &mut problems);
    mcp_servers(workflow, &mut problems);
    hooks(workflow, &mut problems);
    states(workflow, &mut problems);
    reachability(workflow, &mut problems);
    problems
}

fn unique_ids<'a>(section: &str, ids: impl Iterator<Item = &'a str>, problems: &mut Problems) {
    let field = "id";
    let mut seen: HashMap<&str, usize> = HashMap::new();
    for (index, id) in ids.enumerate() {
        let path = format!("{section}[{index}].{field}");
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
            prompt_text(prompt, format!("{base}.system_prompt"), problems);
        }
        if assistant.max_iterations == 0 {
            problems.push((
                format!("{base}.max_iterations"),
                "max_iterations must be at least 1".into(),
            ));
        }
        if let Some(temperature) = assistant.temperature
            && !(0.0..=2.0).contains(&temperature)
        {
            problems.push((
                format!("{base}.temperature"),
                format!("temperature must be between 0 and 2, not {temperature}"),
            ));
        }
        if let Some(compaction) = &assistant.compaction {
            for (field, problem) in compaction.problems() {
                problems.push((format!("{base}.compaction.{field}"), problem));
            }
        }
        for (field, problem) in assistant.fit.problems() {
            problems.push((format!("{base}.context.{field}"), problem));
        }
        if let Some(problem) = window_too_small(workflow, assistant) {
            problems.push((format!("{base}.context.window"), problem));
        }
    }
}

/// Why an assistant's own `context.window` cannot hold what every request of a state of it
/// keeps whole (its system prompt and the state's task), when both are plain text (templates
/// are measured when they are rendered, and a step whose request cannot fit fails saying so).
/// Counted with the built-in registry's tokenizer for the model.
fn window_too_small(workflow: &Workflow, assistant: &Assistant) -> Option<String> {
    let window = assistant.fit.window?;
    let system = match &assistant.system_prompt {
        Some(prompt) => Some(Message::system(prompt.plain()?)),
        None => None,
    };
    let model = assistant
        .fit
        .model(Registry::builtin().resolve(&assistant.model));
    let limit = assistant.fit.budget().limits(&model).ok()?.limit;
    let counter = &model.counter;
    let default = workflow.default_assistant().map(|a| &*a.id);
    workflow
        .states
        .iter()
        .filter(|state| {
            state.assistant_id.as_deref().or(if state.tool_id.is_none()
                && state.transform.is_none()
                && state.workflow.is_none()
            {
                default
            } else {
                None
            }) == Some(&*assistant.id)
        })
        .find_map(|state| {
            let task = state.task.as_ref()?;
            let task = if state.resolve_dynamic_values_in_prompt {
                task.plain()?
            } else {
                task.template.clone()
            };
            let mut kept: Vec<Message> = system.iter().cloned().collect();
            kept.push(Message::user(task));
            let tokens = counter.count_request(&kept, &[]).total;
            (tokens > limit).then(|| {
                format!(
                    "window ({window}) leaves {limit} tokens for a request, but the system prompt and the task of state `{}` alone take {tokens}",
                    state.id
                )
            })
        })
}

fn settings(workflow: &Workflow, problems: &mut Problems) {
    if let Some(id) = &workflow.default_assistant
        && workflow.assistant(id).is_none()
    {
        problems.push((
            "default_assistant".into(),
            format!(
                "unknown assistant `{id}` ({})",
                known(workflow.assistants.iter().map(|a| a.id.clone()))
            ),
        ));
    }
    let limits = &workflow.limits;
    if let Some(cost) = limits.max_cost_usd
        && !(cost.is_finite() && cost >= 0.0)
    {
        problems.push((
            "limits.max_cost_usd".into(),
            format!("max_cost_usd must be a non-negative number of dollars, not {cost}"),
        ));
    }
    if limits.max_steps == Some(0) {
        problems.push((
            "limits.max_steps".into(),
            "max_steps must be at least 1".into(),
        ));
    }
    if let Some(seconds) = limits.max_seconds
        && !(seconds.is_finite() && seconds > 0.0)
    {
        problems.push((
            "limits.max_seconds".into(),
            format!("max_seconds must be a positive number of seconds, not {seconds}"),
        ));
    }
}

fn tools(workflow: &Workflow, problems: &mut Problems) {
    for (index, tool) in workflow.tools.iter().enumerate() {
        let base = format!("tools[{index}]");
        for (name, value) in &tool.arguments {
            templates_in(value, format!("{base}.arguments.{name}"), problems);
        }
        if let Some(response) = &tool.response {
            templates_in(response, format!("{base}.response"), problems);
        }
        match &tool.command {
            Some(command) if command.is_empty() || command[0].trim().is_empty() => {
                problems.push((
                    format!("{base}.command"),
                    "the command is empty: give the program first, then its arguments".into(),
                ));
            }
            Some(command) => {
                for (n, arg) in command.iter().enumerate() {
                    template(arg, format!("{base}.command[{n}]"), problems);
                }
            }
            None => {}
        }
        let ways = [
            tool.command.is_some(),
            tool.response.is_some(),
            tool.tool.is_some(),
        ];
        if ways.iter().filter(|&&set| set).count() > 1 {
            problems.push((
                base.clone(),
                "a tool has one implementation: give only one of command, response and tool".into(),
            ));
        }
        if let Some(timeout) = tool.timeout_seconds
            && !(timeout.is_finite() && timeout > 0.0)
        {
            problems.push((
                format!("{base}.timeout_seconds"),
                format!("timeout_seconds must be a positive number, not {timeout}"),
            ));
        }
        if let Some(parameters) = &tool.parameters
            && !parameters.is_object()
        {
            problems.push((
                format!("{base}.parameters"),
                "parameters must be a JSON schema object".into(),
            ));
        }
    }
}

fn mcp_servers(workflow: &Workflow, problems: &mut Problems) {
    let mut seen: HashMap<&str, String> = HashMap::new();
    for (base, server) in workflow.mcp_declarations() {
        if let Some(problem) = server.name_problem() {
            problems.push((format!("{base}.name"), problem));
        } else if let Some(first) = seen.insert(&server.name, base.clone()) {
            problems.push((
                format!("{base}.name"),
                format!(
                    "duplicate MCP server name `{}` (first declared by {first})",
                    server.name
                ),
            ));
        }
        let config = &server.config;
        for (field, problem) in config.problems() {
            problems.push((format!("{base}.config.{field}"), problem));
        }
        if config.is_reference() && server.resolve_dynamic_values_in_arguments {
            problems.push((
                format!("{base}.resolve_dynamic_values_in_arguments"),
                format!(
                    "`{}` declares no `command` or `url`, so it names the host's server, whose configuration is used as the host wrote it: there are no arguments of this workflow's to render",
                    server.name
                ),
            ));
        }
        if server.resolve_dynamic_values_in_arguments {
            for (n, arg) in config.args.iter().enumerate() {
                templates_in(arg, format!("{base}.config.args[{n}]"), problems);
            }
        }
        for (name, value) in &config.env {
            template(value, format!("{base}.config.env.{name}"), problems);
        }
        for (name, value) in &config.headers {
            template(value, format!("{base}.config.headers.{name}"), problems);
        }
    }
    for (a, assistant) in workflow.assistants.iter().enumerate() {
        let mut named = HashMap::new();
        for (n, used) in assistant.mcp_servers.iter().enumerate() {
            if let Some(first) = named.insert(used.name(), n) {
                problems.push((
                    format!("assistants[{a}].mcp_servers[{n}]"),
                    format!(
                        "MCP server `{}` is named twice (first at mcp_servers[{first}])",
                        used.name()
                    ),
                ));
            }
        }
    }
}

fn hooks(workflow: &Workflow, problems: &mut Problems) {
    for (index, hook) in workflow.hooks.iter().enumerate() {
        for (key, problem) in hook.problems() {
            problems.push((format!("hooks[{index}].{key}"), format!("{key} {problem}")));
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

/// Reports a template that does not parse. It is only compiled, never run: validating a
/// workflow computes nothing its templates ask for.
/// A system prompt's or a task's syntax, in its own format.
fn prompt_text(text: &PromptText, path: String, problems: &mut Problems) {
    if let Err(error) = text.prompt() {
        let path = if text.partials.is_empty() && text.format == TemplateFormat::Jinja {
            path
        } else {
            format!("{path}.template")
        };
        problems.push((path, error.to_string()));
    }
}

fn template(text: &str, path: String, problems: &mut Problems) {
    if let Err(error) = check_syntax(text) {
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
        fork(workflow, state, &base, problems);
        if let Some(context) = &state.thread_context
            && let Some(problem) = context_name_problem(context)
        {
            problems.push((
                format!("{base}.thread_context"),
                format!("thread_context {context:?} cannot name a context: {problem}"),
            ));
        }
        let kinds = [
            state.assistant_id.is_some(),
            state.tool_id.is_some(),
            state.transform.is_some(),
            state.workflow.is_some(),
        ];
        match kinds.iter().filter(|&&set| set).count() {
            0 if workflow.default_assistant().is_none() => problems.push((
                format!("{base}.id"),
                format!(
                    "state `{}` runs nothing: give assistant_id, tool_id, transform or workflow \
                     (a state without them runs the default assistant: set default_assistant, \
                     or declare exactly one assistant)",
                    state.id
                ),
            )),
            0 | 1 => {}
            _ => problems.push((
                base.clone(),
                "a state runs one thing: give only one of assistant_id, tool_id, transform and workflow"
                    .into(),
            )),
        }
        sub_workflow(workflow, state, &base, problems);
        if let Some(args) = &state.tool_args {
            if state.tool_id.is_none() {
                problems.push((
                    format!("{base}.tool_args"),
                    "tool_args needs tool_id: only a tool state calls a tool with them".into(),
                ));
            }
            for (name, value) in args {
                templates_in(value, format!("{base}.tool_args.{name}"), problems);
            }
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
            prompt_text(task, format!("{base}.task"), problems);
        }
        for (key, value) in state.transform.iter().flatten() {
            templates_in(value, format!("{base}.transform.{key}"), problems);
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
        if next.iter_merge.is_some() && next.iter_key.is_none() {
            problems.push((
                format!("{base}.next.iter_merge"),
                "iter_merge needs iter_key: it says how an iteration's items come together".into(),
            ));
        }
        if let Some(keys) = &next.include_in_iterator_context {
            if next.iter_key.is_none() {
                problems.push((
                    format!("{base}.next.include_in_iterator_context"),
                    "include_in_iterator_context needs iter_key: it says which context keys each item's run sees".into(),
                ));
            }
            for (at, key) in keys.iter().enumerate() {
                if key.trim().is_empty() {
                    problems.push((
                        format!("{base}.next.include_in_iterator_context[{at}]"),
                        "a context key name is empty".into(),
                    ));
                }
            }
        }
        if let Some(concurrency) = next.max_concurrency {
            if next.iter_key.is_none() {
                problems.push((
                    format!("{base}.next.max_concurrency"),
                    "max_concurrency needs iter_key: it says how many of an iteration's items run at once".into(),
                ));
            }
            if concurrency == 0 || concurrency > MAX_ITEM_CONCURRENCY {
                problems.push((
                    format!("{base}.next.max_concurrency"),
                    format!(
                        "max_concurrency is {concurrency}: give a number of items from 1 (one after another) to {MAX_ITEM_CONCURRENCY}"
                    ),
                ));
            }
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

/// A state run on a fork: not a sub-workflow (a child runs in its own execution already),
/// not an iteration's items (each item would need a fork of its own), and a merge that
/// brings something back.
fn fork(workflow: &Workflow, state: &super::State, base: &str, problems: &mut Problems) {
    let Some(fork) = &state.fork else {
        return;
    };
    if state.workflow.is_some() {
        problems.push((
            format!("{base}.fork"),
            "a sub-workflow state cannot run on a fork: its child runs in an execution of its own; give the child's result back with `result`".into(),
        ));
    }
    let iterated = workflow.states.iter().any(|other| {
        other.next.as_ref().is_some_and(|next| {
            next.iter_key.is_some() && next.state_id.as_deref() == Some(state.id.as_str())
        })
    });
    if iterated {
        problems.push((
            format!("{base}.fork"),
            "an iteration's items cannot run on a fork: give the fork to a state that runs once"
                .into(),
        ));
    }
    // Clearing acts on the thread it runs in: on a fork, only the fork would be cleared,
    // and the merge brings back messages and keys, never a removal.
    if let Some(next) = &state.next {
        let clears = [
            ("clear_prior_messages", next.clear_prior_messages),
            (
                "clear_context_store",
                next.clear_context_store != ClearContextStore::No,
            ),
            (
                "reset_keys_in_context_store",
                !next.reset_keys_in_context_store.is_empty(),
            ),
        ];
        for (flag, set) in clears {
            if set {
                problems.push((
                    format!("{base}.next.{flag}"),
                    format!(
                        "{flag} on a state run on a fork would clear the fork only (a merge brings back messages and keys, never a removal): clear in the state after it"
                    ),
                ));
            }
        }
    }
    if fork.merge == ThreadMergePolicy::OutputKeys && fork.keys == MergeKeys::Listed(Vec::new()) {
        problems.push((
            format!("{base}.fork.keys"),
            "merge: output-keys brings back only keys, and none is listed: list them, or say `all` (the default)".into(),
        ));
    }
    if let MergeKeys::Listed(keys) = &fork.keys {
        for (at, key) in keys.iter().enumerate() {
            if key.trim().is_empty() {
                problems.push((
                    format!("{base}.fork.keys[{at}]"),
                    "a context key name is empty".into(),
                ));
            }
        }
    }
}

/// A sub-workflow state's own settings: a reference, one input source, mapping paths that
/// parse, a source state that exists. Settings only a sub-workflow takes are refused on
/// other states.
fn sub_workflow(workflow: &Workflow, state: &super::State, base: &str, problems: &mut Problems) {
    let Some(reference) = &state.workflow else {
        if state.input.is_some() {
            problems.push((
                format!("{base}.input"),
                "input needs workflow: only a sub-workflow state takes an input".into(),
            ));
        }
        if state.history_summary {
            problems.push((
                format!("{base}.history_summary"),
                "history_summary needs workflow".into(),
            ));
        }
        return;
    };
    if reference.trim().is_empty() {
        problems.push((format!("{base}.workflow"), "the workflow is empty".into()));
    }
    if state.task.is_some() {
        problems.push((
            format!("{base}.task"),
            "a sub-workflow state has no task: its input says what the child receives".into(),
        ));
    }
    let Some(input) = &state.input else {
        return;
    };
    let sources = [
        input.last_message,
        input.state.is_some(),
        input.mapping.is_some(),
    ]
    .iter()
    .filter(|&&set| set)
    .count();
    if sources > 1 {
        problems.push((
            format!("{base}.input"),
            "input takes one of last_message, state and mapping".into(),
        ));
    }
    if let Some(source) = &input.state
        && workflow.state(source).is_none()
    {
        problems.push((
            format!("{base}.input.state"),
            format!(
                "unknown state `{source}` ({})",
                known(workflow.states.iter().map(|s| s.id.clone()))
            ),
        ));
    }
    for (key, path) in input.mapping.iter().flatten() {
        if let Err(error) = contexture_core::context::Path::parse(path) {
            problems.push((
                format!("{base}.input.mapping.{key}"),
                format!("invalid path `{path}`: {}", error.reason),
            ));
        }
    }
}

/// States no path from the first state reaches.
fn reachability(workflow: &Workflow, problems: &mut Problems) {
    let mut reached: BTreeSet<&str> = BTreeSet::new();
    let mut queue: VecDeque<&str> = VecDeque::from([&*workflow.states[0].id]);
    while let Some(id) = queue.pop_front() {
        if !reached.insert(id) {
            continue;
        }
        if let Some(next) = workflow.state(id).and_then(|state| state.next.as_ref()) {
            queue.extend(next.targets().into_iter().map(|(target, _)| target));
        }
    }
    for (index, state) in workflow.states.iter().enumerate() {
        if !reached.contains(&*state.id) {
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
