//! `POST /v1/responses/compact`: a window compacted on demand. With `previous_response_id`
//! (or `conversation`) the thread is compacted as `POST /v1/threads/{id}/compact` compacts
//! it (recorded, reversible), the request's `input` appended first; with `input` alone the
//! items are compacted in memory and nothing is stored. Either way the answer is OpenAI's
//! `response.compaction` object: a readable `compaction` item standing for what was covered,
//! then the items kept verbatim, ready to be sent as the next request's input.

use axum::extract::State;
use axum::{Extension, Json};
use contexture_core::Message;
use contexture_core::compact::CompactionOutcome;
use contexture_core::compact::CompactionReport;
use contexture_core::format::responses;
use contexture_core::format::responses_answer::compaction_item;
use contexture_core::thread::EventKind;
use contexture_core::tokens::Encoding;
use contexture_engine::chat::{ChatError, is_newest};
use contexture_engine::compaction::{CompactOptions, compact_unstored};
use serde::Deserialize;
use serde_json::{Value, json};

use crate::app::AppState;
use crate::auth::Caller;
use crate::body::JsonBody;
use crate::error::{ApiError, ApiResult};
use crate::routes::conversations::item_error;
use crate::routes::responses_call::{ResponseId, new_token, no_response};
use crate::routes::threads::{CompactThread, compact_thread};
use crate::tenancy::{Actor, check_id};
use crate::tenant_store::TenantStore;

/// The newest messages kept verbatim (the last exchange): the rest of the window is what
/// the client asked to compact.
const KEEP_MESSAGES: usize = 2;

/// `POST /v1/responses/compact` body.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CompactBody {
    /// The model the window is for (its tokenizer measures it).
    model: String,
    /// Items to compact (with a response or conversation: appended to its thread first).
    #[serde(default)]
    input: Option<Value>,
    /// A system prompt kept out of the compaction (not stored, not in the output).
    #[serde(default)]
    instructions: Option<String>,
    /// The response whose thread is compacted (it must be the thread's newest).
    #[serde(default)]
    previous_response_id: Option<String>,
    /// The conversation (thread) compacted.
    #[serde(default)]
    conversation: Option<Value>,
    /// Accepted for OpenAI's clients; it changes nothing here.
    #[serde(default)]
    prompt_cache_key: Option<String>,
}

/// `POST /v1/responses/compact` (see the module documentation).
pub async fn compact(
    State(state): State<AppState>,
    Extension(caller): Extension<Caller>,
    JsonBody(body): JsonBody<CompactBody>,
) -> ApiResult<Json<Value>> {
    let _ = (&body.prompt_cache_key, &body.instructions);
    if body.model.is_empty() {
        return Err(ApiError::invalid("model", "model: must not be empty"));
    }
    let input = match &body.input {
        Some(input) => {
            responses::parse_input(input).map_err(|problem| item_error(&problem, "input"))?
        }
        None => Vec::new(),
    };
    let conversation = match &body.conversation {
        None | Some(Value::Null) => None,
        Some(Value::String(id)) => Some(id.clone()),
        Some(Value::Object(object)) => match object.get("id") {
            Some(Value::String(id)) => Some(id.clone()),
            _ => {
                return Err(ApiError::invalid(
                    "conversation.id",
                    "conversation.id: must be a string",
                ));
            }
        },
        Some(_) => {
            return Err(ApiError::invalid(
                "conversation",
                "conversation: must be an id or {\"id\": ...}",
            ));
        }
    };
    let threads = state.tenant_store(&caller.tenant);
    let thread = match (&body.previous_response_id, conversation) {
        (Some(_), Some(_)) => {
            return Err(ApiError::invalid(
                "conversation",
                "conversation: give previous_response_id or conversation, not both",
            ));
        }
        (Some(id), None) => {
            let found = ResponseId::named(id)?;
            match is_newest(threads.store(), &found.thread, found.request_seq).await {
                Ok(true) => {}
                Ok(false) => {
                    return Err(ApiError::conflict(format!(
                        "previous_response_id: the conversation went on after `{id}`; compact from its newest response"
                    )));
                }
                Err(ChatError::UnknownPoint { .. })
                | Err(ChatError::Store(contexture_store::StoreError::NotFound { .. })) => {
                    return Err(no_response(id));
                }
                Err(ChatError::Store(error)) => return Err(threads.error(error)),
                Err(error) => return Err(ApiError::unprocessable(error.to_string())),
            }
            Some(found.thread)
        }
        (None, Some(id)) => {
            check_id("the conversation", &id)
                .map_err(|problem| ApiError::invalid("conversation", problem))?;
            if !threads.exists(&id).await? {
                return Err(ApiError::not_found("conversation", &id));
            }
            Some(id)
        }
        (None, None) => None,
    };
    let (output, report) = match thread {
        Some(thread) => compact_stored_window(&state, &threads, &caller, &thread, input).await?,
        None => compact_items(&state, &caller, input).await?,
    };
    Ok(Json(json!({
        "id": format!("resp_c{}", new_token()),
        "object": "response.compaction",
        "created_at": std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |elapsed| elapsed.as_secs()),
        "output": output,
        "usage": {
            "input_tokens": report.tokens_before,
            "input_tokens_details": {"cached_tokens": 0},
            "output_tokens": report.tokens_after,
            "output_tokens_details": {"reasoning_tokens": 0},
            "total_tokens": report.tokens_before + report.tokens_after,
        },
    })))
}

/// The window as items: a compaction item for `replacement` (when there is one), then
/// `kept`.
fn window_items(replacement: &[Message], kept: &[Message], seed: &str) -> Vec<Value> {
    let mut output = Vec::new();
    if !replacement.is_empty() {
        output.push(compaction_item(replacement, seed));
    }
    output.extend(responses::to_items(kept));
    output
}

/// A stateless client's items, compacted in memory.
async fn compact_items(
    state: &AppState,
    caller: &Caller,
    input: Vec<Message>,
) -> ApiResult<(Vec<Value>, CompactionReport)> {
    if input.is_empty() {
        return Err(ApiError::invalid(
            "input",
            "input: give the items to compact, or previous_response_id or conversation",
        ));
    }
    let _slot = state.chat.take_slot(&caller.tenant)?;
    let policy = state.config.compaction.clone().unwrap_or_default();
    let options = CompactOptions {
        keep_messages: Some(KEEP_MESSAGES),
        ..CompactOptions::default()
    };
    let request = options
        .request(policy, "api")
        .map_err(|invalid| ApiError::invalid(invalid.field, invalid.problem))?;
    let (view, report) = compact_unstored(&state.compactor, input, &request)
        .await
        .map_err(|error| ApiError::unprocessable(error.to_string()))?;
    state.metrics.compaction(&report.outcome);
    if let CompactionOutcome::Failed { error } = &report.outcome {
        return Err(ApiError::upstream(format!(
            "the summarizer failed: {error}"
        )));
    }
    let replacement = view.replacement();
    let kept = &view.messages()[replacement.len()..];
    Ok((window_items(replacement, kept, &new_token()), report))
}

/// A thread's window compacted as the thread compact operation does it, `input` appended
/// first.
async fn compact_stored_window(
    state: &AppState,
    threads: &TenantStore<'_>,
    caller: &Caller,
    thread: &str,
    input: Vec<Message>,
) -> ApiResult<(Vec<Value>, CompactionReport)> {
    threads.refuse_writes(thread)?;
    if !input.is_empty() {
        let _turn = threads
            .wait_for_turn(&state.turns, thread, state.config.limits.thread_turn_wait())
            .await?;
        threads.append_messages(thread, input, None, None).await?;
    }
    let actor = Actor::Tenant(caller.tenant.clone());
    let asked = CompactThread {
        keep_messages: Some(KEEP_MESSAGES),
        ..CompactThread::default()
    };
    let report = compact_thread(state, threads, &actor, thread, asked).await?;
    if let CompactionOutcome::Failed { error } = &report.outcome {
        return Err(ApiError::upstream(format!(
            "the summarizer failed: {error}"
        )));
    }
    let projection = threads
        .load_projection_tail(thread, Encoding::O200kBase, u64::MAX)
        .await?
        .projection;
    let replacement = match &report.outcome {
        CompactionOutcome::Compacted { replace_seq, .. } => {
            let page = threads
                .events_page(thread, replace_seq - 1, 1, usize::MAX)
                .await?;
            page.events
                .into_iter()
                .find_map(|event| match event.kind {
                    EventKind::ContextReplaced(op) => Some(op.replacement),
                    _ => None,
                })
                .unwrap_or_default()
        }
        _ => Vec::new(),
    };
    let messages = projection.messages;
    let kept = if messages.starts_with(&replacement) {
        &messages[replacement.len()..]
    } else {
        &messages[..]
    };
    Ok((window_items(&replacement, kept, &new_token()), report))
}
