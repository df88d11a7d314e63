//! The tools Contexture offers as an MCP server: each one's name, description and input
//! schema, its arguments as a type, and the operation it calls (the same one the HTTP
//! route that does the same thing calls).

use std::time::{Duration, Instant};

use serde::Deserialize;
use serde::de::DeserializeOwned;
use serde_json::{Map, Value, json};

use crate::app::{AppState, Audience};
use crate::error::ApiError;
use crate::routes::executions::{
    ConversationBody, StartSpec, WorkflowChoice, execution_status, start_execution,
};
use crate::routes::threads::{
    CompactThread, ContextQuery, append_to, compact_thread, fitted_context, fork_as, list_threads,
    search_in,
};
use crate::tenancy::Actor;
use crate::tenant_store::{StoreView, TenantStore};

/// The longest `execution_result` waits for a run to end: MCP hosts give up on a call
/// after about a minute or two.
pub const MAX_WAIT_SECS: f64 = 300.0;

/// How often `execution_result` looks whether a run ended.
const RESULT_POLL: Duration = Duration::from_millis(100);

/// A tool as listed: its name, what it does, and its input schema (an object schema).
pub struct ToolSpec {
    /// The tool's name.
    pub name: &'static str,
    /// What it does, for the model that calls it.
    pub description: String,
    /// The JSON Schema of its arguments.
    pub input_schema: Map<String, Value>,
}

/// An object schema with `properties`, of which `required` must be given; no others.
fn object_schema(properties: Value, required: &[&str]) -> Map<String, Value> {
    let schema = json!({
        "type": "object",
        "properties": properties,
        "required": required,
        "additionalProperties": false,
    });
    match schema {
        Value::Object(map) => map,
        _ => unreachable!("a JSON object literal"),
    }
}

/// Every tool, as `audience` sees it (a workflow is a file path for the operator, a name
/// under the workflows directory for clients).
pub fn tool_specs(audience: Audience) -> Vec<ToolSpec> {
    let thread = json!({"type": "string", "minLength": 1, "description": "The thread's id."});
    let workflow = match audience {
        Audience::Clients => {
            "The workflow: a file's name under the server's workflows directory (`review.yaml`)."
        }
        Audience::Operator => "The workflow: the path of its YAML file.",
    };
    vec![
        ToolSpec {
            name: "thread_append",
            description: "Appends messages to a thread, in one transaction (the thread is created when it does not exist). Answers each message's seq.".into(),
            input_schema: object_schema(
                json!({
                    "thread": thread,
                    "messages": {
                        "type": "array",
                        "minItems": 1,
                        "description": "OpenAI-format chat messages: objects with `role` (system, user, assistant, tool) and `content`; an assistant's `tool_calls`, a tool result's `tool_call_id`.",
                        "items": {"type": "object"},
                    },
                }),
                &["thread", "messages"],
            ),
        },
        ToolSpec {
            name: "thread_list",
            description: "Lists threads by id, a page at a time: `next_after` continues the list.".into(),
            input_schema: object_schema(
                json!({
                    "after": {"type": "string", "description": "Threads after this id (default: from the first)."},
                    "limit": {"type": "integer", "minimum": 1, "maximum": 1000, "description": "At most this many (default 100)."},
                }),
                &[],
            ),
        },
        ToolSpec {
            name: "thread_search",
            description: "Finds a thread's messages whose text (or tool-call arguments) contains the query, case-insensitive, oldest first: each with its event's seq, its role and an excerpt around the match. Compacted messages are found too.".into(),
            input_schema: object_schema(
                json!({
                    "thread": thread,
                    "query": {"type": "string", "minLength": 1, "description": "The text to look for."},
                    "limit": {"type": "integer", "minimum": 1, "maximum": 1000, "description": "At most this many hits (default 20)."},
                }),
                &["thread", "query"],
            ),
        },
        ToolSpec {
            name: "thread_context",
            description: "The thread fitted for a model: the messages a request to it would send, within its context window, with the budget breakdown (tokens by part) and what fitting left out.".into(),
            input_schema: object_schema(
                json!({
                    "thread": thread,
                    "model": {"type": "string", "minLength": 1, "description": "The model to fit for (`gpt-4o`, `claude-sonnet-4-5`, ...): its window and tokenizer."},
                    "max_tokens": {"type": "integer", "minimum": 1, "maximum": 4294967295u64, "description": "At most this many tokens for the request (default: the model's budget)."},
                    "strategy": {"type": "string", "description": "Which history survives: `last` (default), `first`, `head-tail` or `head-tail:N`."},
                }),
                &["thread", "model"],
            ),
        },
        ToolSpec {
            name: "thread_compact",
            description: "Compacts a thread: older messages are replaced by a summary, recorded as one event (nothing is deleted; it can be undone). Answers what was covered and the tokens before and after.".into(),
            input_schema: object_schema(
                json!({
                    "thread": thread,
                    "model": {"type": "string", "minLength": 1, "description": "The summarizer model (default: the server's compaction policy's, else an offline extractive summary)."},
                    "keep_tokens": {"type": "integer", "minimum": 0, "description": "Keep at most this many recent tokens verbatim."},
                    "notes": {"type": "string", "description": "Notes kept verbatim before the summary, never sent to the summarizer."},
                }),
                &["thread"],
            ),
        },
        ToolSpec {
            name: "thread_fork",
            description: "Forks a thread: a new thread that shares the parent's events up to a seq (nothing is copied) and goes on on its own.".into(),
            input_schema: object_schema(
                json!({
                    "thread": thread,
                    "new": {"type": "string", "minLength": 1, "description": "The fork's id (it must not exist)."},
                    "at_seq": {"type": "integer", "minimum": 0, "description": "The parent's last event the fork shares (default: its last event)."},
                }),
                &["thread", "new"],
            ),
        },
        ToolSpec {
            name: "run_workflow",
            description: "Starts a workflow run in the background; answers its execution id at once (`execution_result` waits for its end).".into(),
            input_schema: object_schema(
                json!({
                    "workflow": {"type": "string", "minLength": 1, "description": workflow},
                    "input": {"description": "The run's input: an object (its keys fill the context store) or a text."},
                    "conversation": {
                        "type": "object",
                        "description": "Continue this user's conversation with the workflow (its history carries over between runs).",
                        "properties": {
                            "user": {"type": "string", "minLength": 1},
                            "chat": {"type": "string", "description": "One of several conversations of the user with this workflow."},
                        },
                        "required": ["user"],
                        "additionalProperties": false,
                    },
                }),
                &["workflow", "input"],
            ),
        },
        ToolSpec {
            name: "execution_result",
            description: "An execution's status, output or error, steps and usage; with `wait_secs`, waits that long at most for a running execution to end.".into(),
            input_schema: object_schema(
                json!({
                    "execution": {"type": "string", "minLength": 1, "description": "The execution id `run_workflow` answered."},
                    "wait_secs": {"type": "number", "minimum": 0, "maximum": MAX_WAIT_SECS, "description": "Wait at most this many seconds for the run to end (default 0: answer at once)."},
                }),
                &["execution"],
            ),
        },
    ]
}

/// A tool call that failed: what the caller is told (`isError`), naming the argument at
/// fault when one was.
#[derive(Debug, Clone, PartialEq)]
pub struct ToolError(pub String);

/// Arguments of `thread_append`.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct AppendArgs {
    thread: String,
    messages: Value,
}

/// Arguments of `thread_list`.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct ListArgs {
    after: Option<String>,
    limit: Option<usize>,
}

/// Arguments of `thread_search`.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct SearchArgs {
    thread: String,
    query: String,
    limit: Option<usize>,
}

/// Arguments of `thread_context`.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct ContextArgs {
    thread: String,
    model: String,
    max_tokens: Option<u32>,
    strategy: Option<String>,
}

/// Arguments of `thread_compact`.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct CompactArgs {
    thread: String,
    model: Option<String>,
    keep_tokens: Option<u64>,
    notes: Option<String>,
}

/// Arguments of `thread_fork`.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct ForkArgs {
    thread: String,
    new: String,
    at_seq: Option<u64>,
}

/// Arguments of `run_workflow`.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RunArgs {
    workflow: String,
    input: Value,
    conversation: Option<ConversationBody>,
}

/// Arguments of `execution_result`.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct ResultArgs {
    execution: String,
    wait_secs: Option<f64>,
}

/// `arguments` as a tool's argument type: a mistake names the argument.
fn arguments<T: DeserializeOwned>(arguments: Option<Map<String, Value>>) -> Result<T, ToolError> {
    let value = Value::Object(arguments.unwrap_or_default());
    serde_path_to_error::deserialize(value).map_err(|error| {
        let path = error.path().to_string();
        let inner = error.into_inner();
        if path == "." {
            // Missing and unknown arguments: serde's message names them.
            ToolError(format!("arguments: {inner}"))
        } else {
            ToolError(format!("argument `{path}`: {inner}"))
        }
    })
}

/// A string argument that may not be empty.
fn required_text(name: &str, value: &str) -> Result<(), ToolError> {
    if value.is_empty() {
        Err(ToolError(format!("argument `{name}`: must not be empty")))
    } else {
        Ok(())
    }
}

/// An operation's refusal as the tool's caller sees it: the message, with the argument at
/// fault (`renames` turns the HTTP API's field names into this tool's arguments).
fn refusal(error: ApiError, renames: &[(&str, &str)]) -> ToolError {
    match &error.param {
        Some(param) => {
            let argument = renames
                .iter()
                .find(|(from, _)| from == param)
                .map_or(param.as_str(), |(_, to)| to);
            let message = match error.message.strip_prefix(&format!("{param}:")) {
                Some(rest) => rest.trim_start().to_owned(),
                None => error.message.clone(),
            };
            ToolError(format!("argument `{argument}`: {message}"))
        }
        None => ToolError(error.message),
    }
}

/// Calls tool `name` for `actor` with `arguments`; its answer as JSON, or why not.
pub async fn call_tool(
    state: &AppState,
    actor: &Actor,
    name: &str,
    args: Option<Map<String, Value>>,
) -> Result<Value, ToolError> {
    match actor {
        Actor::Tenant(tenant) => {
            call_on(state, &state.tenant_store(tenant), actor, name, args).await
        }
        Actor::Operator => call_on(state, &state.operator_store(), actor, name, args).await,
    }
}

/// [`call_tool`] on the store as the actor sees it.
async fn call_on<S: StoreView>(
    state: &AppState,
    threads: &TenantStore<'_, S>,
    actor: &Actor,
    name: &str,
    args: Option<Map<String, Value>>,
) -> Result<Value, ToolError> {
    let thread_renames: &[(&str, &str)] = &[("id", "thread")];
    match name {
        "thread_append" => {
            let args: AppendArgs = arguments(args)?;
            required_text("thread", &args.thread)?;
            append_to(threads, &args.thread, &args.messages, None, None)
                .await
                .map_err(|error| refusal(error, thread_renames))
        }
        "thread_list" => {
            let args: ListArgs = arguments(args)?;
            list_threads(threads, args.after.as_deref(), args.limit)
                .await
                .map_err(|error| refusal(error, &[]))
        }
        "thread_search" => {
            let args: SearchArgs = arguments(args)?;
            required_text("thread", &args.thread)?;
            search_in(threads, &args.thread, &args.query, args.limit)
                .await
                .map_err(|error| refusal(error, thread_renames))
        }
        "thread_context" => {
            let args: ContextArgs = arguments(args)?;
            required_text("thread", &args.thread)?;
            let query = ContextQuery {
                model: args.model,
                max_tokens: args.max_tokens,
                strategy: args.strategy,
                budget_ratio: None,
                reserve_output: None,
            };
            let fitted = fitted_context(state, threads, actor, &args.thread, &query)
                .await
                .map_err(|error| refusal(error, thread_renames))?;
            Ok(serde_json::to_value(fitted.answer(&args.thread)).unwrap_or_default())
        }
        "thread_compact" => {
            let args: CompactArgs = arguments(args)?;
            required_text("thread", &args.thread)?;
            let body = CompactThread {
                model: args.model,
                keep_tokens: args.keep_tokens,
                notes: args.notes,
                keep_messages: None,
                preserve_history: None,
                tokens_model: None,
                timeout_secs: None,
            };
            // The policy's settings, as this tool's arguments set them.
            let renames = [
                ("id", "thread"),
                ("keep", "keep_tokens"),
                ("summarizer", "model"),
            ];
            compact_thread(state, threads, actor, &args.thread, body)
                .await
                .map(|report| serde_json::to_value(&report).unwrap_or_default())
                .map_err(|error| refusal(error, &renames))
        }
        "thread_fork" => {
            let args: ForkArgs = arguments(args)?;
            required_text("thread", &args.thread)?;
            // The fork's id is `id` to the HTTP route.
            fork_as(threads, &args.thread, Some(args.new), args.at_seq)
                .await
                .map_err(|error| refusal(error, &[("id", "new")]))
        }
        "run_workflow" => {
            let args: RunArgs = arguments(args)?;
            required_text("workflow", &args.workflow)?;
            let choice = match state.audience {
                Audience::Clients => WorkflowChoice::Named(args.workflow),
                Audience::Operator => WorkflowChoice::HostFile(args.workflow),
            };
            let spec = StartSpec {
                input: args.input,
                conversation: args.conversation,
                ..StartSpec::default()
            };
            let (id, status) = start_execution(state, threads, actor, choice, spec)
                .await
                .map_err(|error| refusal(error, &[]))?;
            Ok(json!({ "execution": id, "status": status }))
        }
        "execution_result" => {
            let args: ResultArgs = arguments(args)?;
            required_text("execution", &args.execution)?;
            let wait = match args.wait_secs {
                None => Duration::ZERO,
                Some(secs) if secs.is_finite() && (0.0..=MAX_WAIT_SECS).contains(&secs) => {
                    Duration::from_secs_f64(secs)
                }
                Some(secs) => {
                    return Err(ToolError(format!(
                        "argument `wait_secs`: must be 0 to {MAX_WAIT_SECS}, not {secs}"
                    )));
                }
            };
            let renames: &[(&str, &str)] = &[("id", "execution")];
            let deadline = Instant::now() + wait;
            loop {
                let status = execution_status(state, threads, &args.execution)
                    .await
                    .map_err(|error| refusal(error, renames))?;
                let running = matches!(status["status"].as_str(), Some("running" | "queued"));
                if !running || Instant::now() >= deadline {
                    return Ok(status);
                }
                tokio::time::sleep(RESULT_POLL.min(deadline - Instant::now())).await;
            }
        }
        other => Err(ToolError(format!(
            "no tool `{other}`: the tools are {}",
            tool_specs(state.audience)
                .iter()
                .map(|spec| spec.name)
                .collect::<Vec<_>>()
                .join(", ")
        ))),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn argument_mistakes_name_the_argument() {
        let missing =
            arguments::<ForkArgs>(Some(json!({"thread": "t"}).as_object().cloned().unwrap()))
                .unwrap_err();
        assert!(missing.0.contains("`new`"), "{missing:?}");
        let wrong =
            arguments::<ListArgs>(Some(json!({"limit": "ten"}).as_object().cloned().unwrap()))
                .unwrap_err();
        assert!(wrong.0.starts_with("argument `limit`:"), "{wrong:?}");
        let unknown = arguments::<ListArgs>(Some(json!({"page": 2}).as_object().cloned().unwrap()))
            .unwrap_err();
        assert!(unknown.0.contains("`page`"), "{unknown:?}");
    }

    #[test]
    fn every_tool_has_an_object_schema_naming_its_required_arguments() {
        for audience in [Audience::Clients, Audience::Operator] {
            let specs = tool_specs(audience);
            let names: Vec<&str> = specs.iter().map(|spec| spec.name).collect();
            assert_eq!(
                names,
                [
                    "thread_append",
                    "thread_list",
                    "thread_search",
                    "thread_context",
                    "thread_compact",
                    "thread_fork",
                    "run_workflow",
                    "execution_result"
                ]
            );
            for spec in specs {
                assert_eq!(spec.input_schema["type"], "object", "{}", spec.name);
                let properties = spec.input_schema["properties"].as_object().unwrap();
                for required in spec.input_schema["required"].as_array().unwrap() {
                    assert!(
                        properties.contains_key(required.as_str().unwrap()),
                        "{}: {required}",
                        spec.name
                    );
                }
            }
        }
    }

    #[test]
    fn refusals_use_the_tools_argument_names() {
        let error = ApiError::invalid("id", "a thread id has 1 to 200 characters");
        assert_eq!(
            refusal(error, &[("id", "thread")]).0,
            "argument `thread`: a thread id has 1 to 200 characters"
        );
        let error = ApiError::invalid("limit", "limit: must be 1 to 1000");
        assert_eq!(refusal(error, &[]).0, "argument `limit`: must be 1 to 1000");
        assert_eq!(
            refusal(ApiError::not_found("thread", "x"), &[]).0,
            "no thread `x`"
        );
    }
}
