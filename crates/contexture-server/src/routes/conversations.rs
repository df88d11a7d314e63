//! OpenAI's conversations, as threads: a conversation is a thread (one made here is named
//! `conv_...`; any thread of the tenant can be named as one), its metadata the thread's
//! `metadata`, its items the thread's messages written as Responses items. A response with
//! `conversation` runs on that thread.

use axum::extract::{Path, State};
use axum::http::StatusCode;
use axum::{Extension, Json};
use contexture_core::format::responses_answer::listed_item;
use contexture_core::format::{FormatError, responses};
use contexture_core::thread::EventKind;
use contexture_core::tokens::Encoding;
use contexture_engine::threads::NewThread;
use serde::Deserialize;
use serde_json::{Map, Value, json};

use crate::app::AppState;
use crate::auth::Caller;
use crate::body::{JsonBody, QueryParams};
use crate::error::{ApiError, ApiResult};
use crate::routes::responses_call::new_token;
use crate::tenant_store::TenantStore;

/// The most metadata keys a conversation takes, as at OpenAI.
const MAX_METADATA_KEYS: usize = 16;

/// `POST /v1/conversations` body.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CreateConversation {
    /// The first items.
    #[serde(default)]
    items: Option<Value>,
    /// Free string pairs kept with it.
    #[serde(default)]
    metadata: Option<Map<String, Value>>,
}

/// `POST /v1/conversations/{id}/items` body.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct AddItems {
    /// The items to add.
    items: Value,
}

/// Checks conversation metadata as OpenAI does: at most 16 keys of strings.
fn check_metadata(metadata: &Map<String, Value>) -> ApiResult<()> {
    if metadata.len() > MAX_METADATA_KEYS {
        return Err(ApiError::invalid(
            "metadata",
            format!("metadata: at most {MAX_METADATA_KEYS} keys"),
        ));
    }
    if let Some((key, _)) = metadata.iter().find(|(_, value)| !value.is_string()) {
        return Err(ApiError::invalid(
            format!("metadata.{key}"),
            format!("metadata.{key}: must be a string"),
        ));
    }
    Ok(())
}

/// Items read as messages; errors name the item and field (`items[2].role`).
fn read_items(items: &Value) -> ApiResult<Vec<contexture_core::Message>> {
    responses::parse_items(items, "items").map_err(|problem| item_error(&problem, "items"))
}

/// A problem with Responses items as a 400 naming the item (`input[2]`), or `field`.
pub(crate) fn item_error(problem: &FormatError, field: &str) -> ApiError {
    let item = problem.path().split('.').next().unwrap_or(field);
    ApiError::invalid(item, problem.to_string())
}

/// The conversation object of thread `id`.
async fn conversation(threads: &TenantStore<'_>, id: &str) -> ApiResult<Value> {
    let info = threads
        .thread_info(id)
        .await?
        .ok_or_else(|| ApiError::not_found("conversation", id))?;
    let tail = threads
        .load_projection_tail(id, Encoding::O200kBase, 0)
        .await?;
    let metadata = tail
        .store
        .get("metadata")
        .filter(|metadata| metadata.is_object())
        .cloned()
        .unwrap_or_else(|| json!({}));
    Ok(json!({
        "id": id,
        "object": "conversation",
        "created_at": info.created_at_ms / 1000,
        "metadata": metadata,
    }))
}

/// `POST /v1/conversations`: a new thread holding the items.
pub async fn create(
    State(state): State<AppState>,
    Extension(caller): Extension<Caller>,
    JsonBody(body): JsonBody<CreateConversation>,
) -> ApiResult<(StatusCode, Json<Value>)> {
    let metadata = body.metadata.unwrap_or_default();
    check_metadata(&metadata)?;
    let messages = match &body.items {
        Some(items) => read_items(items)?,
        None => Vec::new(),
    };
    let threads = state.tenant_store(&caller.tenant);
    let id = format!("conv_{}", new_token());
    let new = NewThread {
        system: None,
        messages,
        metadata: Some(Value::Object(metadata)),
        retention: None,
        policy: None,
    };
    threads.create(&id, new).await?;
    Ok((StatusCode::OK, Json(conversation(&threads, &id).await?)))
}

/// `GET /v1/conversations/{id}`.
pub async fn retrieve(
    State(state): State<AppState>,
    Extension(caller): Extension<Caller>,
    Path(id): Path<String>,
) -> ApiResult<Json<Value>> {
    let threads = state.tenant_store(&caller.tenant);
    Ok(Json(conversation(&threads, &id).await?))
}

/// `DELETE /v1/conversations/{id}`: the thread and its events.
pub async fn delete(
    State(state): State<AppState>,
    Extension(caller): Extension<Caller>,
    Path(id): Path<String>,
) -> ApiResult<Json<Value>> {
    let threads = state.tenant_store(&caller.tenant);
    threads.refuse_writes(&id)?;
    if !threads.exists(&id).await? {
        return Err(ApiError::not_found("conversation", &id));
    }
    threads.delete(&id).await?;
    Ok(Json(
        json!({"id": id, "object": "conversation.deleted", "deleted": true}),
    ))
}

/// The query of a list of items (`GET /v1/conversations/{id}/items`,
/// `GET /v1/responses/{id}/input_items`).
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ItemsQuery {
    /// At most this many items (1 to 100, default 20).
    limit: Option<usize>,
    /// `asc` or `desc` (the default, newest first).
    order: Option<String>,
    /// Items after this id, in the order asked.
    after: Option<String>,
    /// Fields to include (accepted: items are always whole).
    #[serde(rename = "include[]", alias = "include")]
    #[allow(dead_code)]
    include: Option<String>,
}

impl ItemsQuery {
    /// The page's size: `limit`, 1 to 100, 20 when absent.
    fn page_size(&self) -> ApiResult<usize> {
        let limit = self.limit.unwrap_or(20);
        if !(1..=100).contains(&limit) {
            return Err(ApiError::invalid("limit", "limit: must be 1 to 100"));
        }
        Ok(limit)
    }

    /// True for newest first (`desc`, the default).
    fn newest_first(&self) -> ApiResult<bool> {
        match self.order.as_deref() {
            None | Some("desc") => Ok(true),
            Some("asc") => Ok(false),
            Some(other) => Err(ApiError::invalid(
                "order",
                format!("order: must be asc or desc, not `{other}`"),
            )),
        }
    }
}

/// The message of the event at `seq` as Responses items, each with its id (its own, else
/// one made from the seq and its place).
fn message_items(message: &contexture_core::Message, seq: u64) -> impl Iterator<Item = Value> {
    responses::to_items(std::slice::from_ref(message))
        .into_iter()
        .enumerate()
        .map(move |(k, item)| listed_item(item, &format!("item_{seq}_{k}")))
}

/// The seq of the event an item id made by [`message_items`] names.
fn item_seq(id: &str) -> Option<u64> {
    let (seq, place) = id.strip_prefix("item_")?.split_once('_')?;
    place.parse::<usize>().ok()?;
    seq.parse().ok()
}

/// One page of the items of thread `id` (its messages as Responses items) by `query`, read
/// from the end of the thread for newest first and from where `after` points when it is an
/// id made from a seq: a page costs the events it lists, not the thread.
async fn thread_items_page(
    threads: &TenantStore<'_>,
    id: &str,
    last_seq: u64,
    query: &ItemsQuery,
) -> ApiResult<Value> {
    /// Events read at a time.
    const WINDOW: u64 = 32;
    let limit = query.page_size()?;
    let newest_first = query.newest_first()?;
    let after = query.after.as_deref();
    // An id made from a seq says where to start; an item's own id is looked for.
    let start = after.and_then(item_seq).filter(|seq| *seq <= last_seq);
    let mut found_after = after.is_none();
    let mut items = Vec::new();
    // The range of seqs read next, `(low, high]`.
    let mut range = if newest_first {
        let high = start.unwrap_or(last_seq);
        (high.saturating_sub(WINDOW), high)
    } else {
        let low = start.map_or(0, |seq| seq - 1);
        (low, low.saturating_add(WINDOW))
    };
    while items.len() <= limit {
        let (low, high) = range;
        if high <= low || (!newest_first && low >= last_seq) {
            break;
        }
        let page = threads
            .events_page(id, low, (high - low) as usize, usize::MAX)
            .await?;
        let mut read: Vec<Value> = Vec::new();
        for event in page.events.iter().filter(|event| event.seq <= high) {
            if let EventKind::MessageAppended { message } = &event.kind {
                read.extend(message_items(message, event.seq));
            }
        }
        if newest_first {
            read.reverse();
        }
        for item in read {
            if found_after {
                items.push(item);
            } else if item.get("id").and_then(Value::as_str) == after {
                found_after = true;
            }
        }
        range = if newest_first {
            (low.saturating_sub(WINDOW), low)
        } else {
            (high, high.saturating_add(WINDOW))
        };
    }
    if !found_after {
        let after = after.unwrap_or_default();
        return Err(ApiError::invalid(
            "after",
            format!("after: no item `{after}`"),
        ));
    }
    Ok(items_list(items, limit))
}

/// A page of `items` (oldest first) as a list object, by `query`.
pub(crate) fn items_page(mut items: Vec<Value>, query: &ItemsQuery) -> ApiResult<Value> {
    let limit = query.page_size()?;
    if query.newest_first()? {
        items.reverse();
    }
    if let Some(after) = &query.after {
        let at = items
            .iter()
            .position(|item| item.get("id").and_then(Value::as_str) == Some(after))
            .ok_or_else(|| ApiError::invalid("after", format!("after: no item `{after}`")))?;
        items.drain(..=at);
    }
    Ok(items_list(items, limit))
}

/// A list object of the first `limit` of `items` (the page's), saying whether more follow.
fn items_list(mut items: Vec<Value>, limit: usize) -> Value {
    let has_more = items.len() > limit;
    items.truncate(limit);
    let first_id = items.first().and_then(|item| item.get("id")).cloned();
    let last_id = items.last().and_then(|item| item.get("id")).cloned();
    json!({
        "object": "list",
        "data": items,
        "first_id": first_id,
        "last_id": last_id,
        "has_more": has_more,
    })
}

/// `GET /v1/conversations/{id}/items`.
pub async fn items(
    State(state): State<AppState>,
    Extension(caller): Extension<Caller>,
    Path(id): Path<String>,
    QueryParams(query): QueryParams<ItemsQuery>,
) -> ApiResult<Json<Value>> {
    let threads = state.tenant_store(&caller.tenant);
    let Some(info) = threads.thread_info(&id).await? else {
        return Err(ApiError::not_found("conversation", &id));
    };
    Ok(Json(
        thread_items_page(&threads, &id, info.last_seq, &query).await?,
    ))
}

/// `POST /v1/conversations/{id}/items`: the items appended to the thread, listed back.
pub async fn add_items(
    State(state): State<AppState>,
    Extension(caller): Extension<Caller>,
    Path(id): Path<String>,
    JsonBody(body): JsonBody<AddItems>,
) -> ApiResult<Json<Value>> {
    let messages = read_items(&body.items)?;
    if messages.is_empty() {
        return Err(ApiError::invalid("items", "items: add at least one item"));
    }
    let threads = state.tenant_store(&caller.tenant);
    threads.refuse_writes(&id)?;
    if !threads.exists(&id).await? {
        return Err(ApiError::not_found("conversation", &id));
    }
    // Not while a turn of the thread is in flight: its answer comes first.
    let _turn = threads
        .wait_for_turn(&state.turns, &id, state.config.limits.thread_turn_wait())
        .await?;
    let appended = threads
        .append_messages(&id, messages.clone(), None, None)
        .await?;
    let added: Vec<Value> = messages
        .iter()
        .zip(&appended.seqs)
        .flat_map(|(message, seq)| message_items(message, *seq))
        .collect();
    let all = ItemsQuery {
        limit: Some(100),
        order: Some("asc".to_owned()),
        after: None,
        include: None,
    };
    Ok(Json(items_page(added, &all)?))
}
