//! The message model: one type for every chat message, whatever provider
//! format it came from or goes to.
//!
//! Wire formats live in [`crate::format`]; this module holds only the neutral model. Fields
//! the model has no place for are kept in `extra` maps so that a round trip through a wire
//! format loses nothing.
//!
//! Each message caches its token count per encoding (see [`crate::tokens`]). The cache is
//! cleared by [`Message::touch`]; every mutating method here calls it, and code that writes
//! the public fields directly after a count was taken must call it too.

use std::sync::Arc;
use std::sync::atomic::{AtomicU32, Ordering};

use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};

use crate::tokens::Encoding;

/// Who speaks a message.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Role {
    /// The system prompt.
    System,
    /// OpenAI's developer role: a system prompt for reasoning models.
    Developer,
    /// The human (or calling program).
    User,
    /// The model.
    Assistant,
    /// The result of a tool call.
    Tool,
}

impl Role {
    /// The role's name as the OpenAI wire format spells it.
    pub fn as_str(self) -> &'static str {
        match self {
            Role::System => "system",
            Role::Developer => "developer",
            Role::User => "user",
            Role::Assistant => "assistant",
            Role::Tool => "tool",
        }
    }

    /// Parses a role name as the OpenAI wire format spells it.
    pub fn parse(name: &str) -> Option<Role> {
        Some(match name {
            "system" => Role::System,
            "developer" => Role::Developer,
            "user" => Role::User,
            "assistant" => Role::Assistant,
            "tool" => Role::Tool,
            _ => return None,
        })
    }

    /// True for the roles that carry a system prompt (system and developer).
    pub fn is_system_like(self) -> bool {
        matches!(self, Role::System | Role::Developer)
    }
}

impl std::fmt::Display for Role {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// One piece of a multi-part message body.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum Part {
    /// Plain text.
    Text {
        /// The text.
        text: String,
        /// Wire fields the model has no place for (e.g. Anthropic's `cache_control`).
        #[serde(default, skip_serializing_if = "Map::is_empty")]
        extra: Map<String, Value>,
    },
    /// A reference to an image: an `https:` URL or a `data:` URL with inline base64 bytes.
    Image {
        /// The image's URL (`data:<media type>;base64,<bytes>` for inline images).
        url: String,
        /// OpenAI's `detail` setting (`low`, `high`, `auto`), when given.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        detail: Option<String>,
        /// Wire fields the model has no place for.
        #[serde(default, skip_serializing_if = "Map::is_empty")]
        extra: Map<String, Value>,
    },
    /// Model reasoning ("thinking"). Kept beside the assistant turn that produced it.
    Reasoning {
        /// The reasoning text; empty when the provider redacted it.
        text: String,
        /// The provider's signature over the reasoning, which must be sent back unchanged.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        signature: Option<String>,
        /// Encrypted reasoning the provider returned instead of text (Anthropic's
        /// `redacted_thinking`).
        #[serde(default, skip_serializing_if = "Option::is_none")]
        redacted: Option<String>,
        /// Wire fields the model has no place for.
        #[serde(default, skip_serializing_if = "Map::is_empty")]
        extra: Map<String, Value>,
    },
    /// A part of a type this model does not know, kept verbatim in its wire form.
    Other {
        /// The part exactly as it arrived.
        value: Value,
    },
}

impl Part {
    /// A text part.
    pub fn text(text: impl Into<String>) -> Part {
        Part::Text {
            text: text.into(),
            extra: Map::new(),
        }
    }

    /// An image part referring to `url`.
    pub fn image(url: impl Into<String>) -> Part {
        Part::Image {
            url: url.into(),
            detail: None,
            extra: Map::new(),
        }
    }

    /// A reasoning part.
    pub fn reasoning(text: impl Into<String>) -> Part {
        Part::Reasoning {
            text: text.into(),
            signature: None,
            redacted: None,
            extra: Map::new(),
        }
    }
}

/// A message body: a plain string, or a list of parts.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(untagged)]
pub enum Content {
    /// A plain string, shared: histories are cloned on every projection and fit, and a
    /// clone of a message then costs no copy of its text.
    Text(Arc<str>),
    /// A list of parts (text, images, reasoning, unknown parts).
    Parts(Vec<Part>),
}

impl Content {
    /// The text of the body: the string itself, or the text parts joined by newlines.
    /// Images, reasoning and unknown parts contribute nothing.
    pub fn text(&self) -> String {
        match self {
            Content::Text(text) => text.to_string(),
            Content::Parts(parts) => parts
                .iter()
                .filter_map(|part| match part {
                    Part::Text { text, .. } => Some(text.as_str()),
                    _ => None,
                })
                .collect::<Vec<_>>()
                .join("\n"),
        }
    }

    /// True when the body holds no text and no parts.
    pub fn is_empty(&self) -> bool {
        match self {
            Content::Text(text) => text.is_empty(),
            Content::Parts(parts) => parts.is_empty(),
        }
    }
}

/// A tool call made by an assistant turn.
///
/// Its strings are shared, like message text: a long tool loop's request is copied on every
/// call, and a copied call then costs no copy of its id, name or arguments.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ToolCall {
    /// The call's id; the tool result names it in `tool_call_id`.
    pub id: Arc<str>,
    /// The tool's name.
    pub name: Arc<str>,
    /// The arguments as JSON text, exactly as the model produced them (which may be invalid
    /// JSON: it is kept, not repaired).
    pub arguments: Arc<str>,
    /// Wire fields the model has no place for.
    #[serde(default, skip_serializing_if = "Map::is_empty")]
    pub extra: Map<String, Value>,
}

impl ToolCall {
    /// A tool call with the given id, tool name and JSON arguments text.
    pub fn new(
        id: impl Into<Arc<str>>,
        name: impl Into<Arc<str>>,
        arguments: impl Into<Arc<str>>,
    ) -> Self {
        ToolCall {
            id: id.into(),
            name: name.into(),
            arguments: arguments.into(),
            extra: Map::new(),
        }
    }
}

/// Contexture's own annotations on a message. Never sent to a provider.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Metadata {
    /// A pinned message is always kept by trimming, clearing and compaction.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub pinned: bool,
    /// The workflow step that produced the message, if any.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub origin_step: Option<String>,
    /// Free-form tags.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub tags: Vec<String>,
}

impl Metadata {
    /// True when no annotation is set.
    pub fn is_empty(&self) -> bool {
        *self == Metadata::default()
    }
}

/// The identity of a message's unchanged copies ([`Message::identity`]), valid while one of
/// them lives.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct MessageIdentity(usize);

/// One chat message in Contexture's neutral model.
///
/// Its fields ([`MessageFields`]) are read and written through the message as if they were
/// its own (`message.role`, `message.content = ...`). They are shared by the message's
/// copies: histories are copied on every projection and fit, and a long tool loop's request
/// on every call, so a copy costs one reference count; writing to a copy's fields gives it
/// fields of its own first (copy on write), and the others keep theirs.
///
/// Serialized with serde this is Contexture's own storage form; use [`crate::format`] for
/// provider wire formats.
#[derive(Clone, Serialize, Deserialize)]
#[serde(transparent)]
pub struct Message(Arc<MessageFields>);

/// The fields of a [`Message`], shared by its copies.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct MessageFields {
    /// Who speaks.
    pub role: Role,
    /// The body. `None` when the wire message had no content (an assistant turn that only
    /// calls tools, with `content: null`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub content: Option<Content>,
    /// When `content` is `None`: true if the wire message had no `content` key at all, false
    /// if it said `content: null`. Wire formats use it to write back exactly what they read.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub content_omitted: bool,
    /// The optional participant name.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
    /// Tool calls made by an assistant turn, in order.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub tool_calls: Vec<ToolCall>,
    /// For a tool result: the id of the call it answers (shared, as the call's id is).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tool_call_id: Option<Arc<str>>,
    /// Contexture's annotations (pinned, origin step, tags).
    #[serde(default, skip_serializing_if = "Metadata::is_empty")]
    pub metadata: Metadata,
    /// Wire fields the model has no place for, kept so that round trips are lossless.
    #[serde(default, skip_serializing_if = "Map::is_empty")]
    pub extra: Map<String, Value>,
    #[serde(skip)]
    tokens: TokenCache,
}

impl std::ops::Deref for Message {
    type Target = MessageFields;

    fn deref(&self) -> &MessageFields {
        &self.0
    }
}

/// Writing a field of a message whose fields other copies share gives it its own first.
impl std::ops::DerefMut for Message {
    fn deref_mut(&mut self) -> &mut MessageFields {
        Arc::make_mut(&mut self.0)
    }
}

impl From<MessageFields> for Message {
    fn from(fields: MessageFields) -> Message {
        Message(Arc::new(fields))
    }
}

/// Two messages are equal when their fields are (copies of one message are, at once).
impl PartialEq for Message {
    fn eq(&self, other: &Message) -> bool {
        Arc::ptr_eq(&self.0, &other.0) || self.0 == other.0
    }
}

impl std::fmt::Debug for Message {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        self.0.fmt(f)
    }
}

impl Message {
    /// A message with the given role and text body.
    pub fn new(role: Role, text: impl Into<String>) -> Message {
        Message::from(MessageFields {
            role,
            content: Some(Content::Text(text.into().into())),
            content_omitted: false,
            name: None,
            tool_calls: Vec::new(),
            tool_call_id: None,
            metadata: Metadata::default(),
            extra: Map::new(),
            tokens: TokenCache::default(),
        })
    }

    /// The message's fields, as its own: taken without a copy when no other copy shares them.
    pub fn into_fields(self) -> MessageFields {
        Arc::unwrap_or_clone(self.0)
    }

    /// A system message.
    pub fn system(text: impl Into<String>) -> Message {
        Message::new(Role::System, text)
    }

    /// A user message.
    pub fn user(text: impl Into<String>) -> Message {
        Message::new(Role::User, text)
    }

    /// An assistant message with a text body.
    pub fn assistant(text: impl Into<String>) -> Message {
        Message::new(Role::Assistant, text)
    }

    /// An assistant turn that calls tools, with no text body.
    pub fn assistant_tool_calls(calls: Vec<ToolCall>) -> Message {
        let mut message = Message::new(Role::Assistant, "");
        message.content = None;
        message.tool_calls = calls;
        message
    }

    /// A tool result answering the call `tool_call_id`.
    pub fn tool_result(tool_call_id: impl Into<Arc<str>>, text: impl Into<String>) -> Message {
        let mut message = Message::new(Role::Tool, text);
        message.tool_call_id = Some(tool_call_id.into());
        message
    }

    /// Builder: marks the message pinned.
    pub fn pinned(mut self) -> Message {
        self.metadata.pinned = true;
        self
    }

    /// Builder: sets the participant name.
    pub fn with_name(mut self, name: impl Into<String>) -> Message {
        self.name = Some(name.into());
        self.touch();
        self
    }

    /// The body's text (see [`Content::text`]); empty when there is no body.
    pub fn text(&self) -> String {
        self.content.as_ref().map(Content::text).unwrap_or_default()
    }

    /// Replaces the body with a plain text and clears the token cache.
    pub fn set_text(&mut self, text: impl Into<String>) {
        self.content = Some(Content::Text(text.into().into()));
        self.touch();
    }

    /// What the unchanged copies of this message share, and no other live message: a fit's
    /// output traced back to the messages it kept as they were given (a copy that was
    /// changed has an identity of its own).
    pub fn identity(&self) -> MessageIdentity {
        MessageIdentity(Arc::as_ptr(&self.0) as usize)
    }

    /// True when this message is pinned.
    pub fn is_pinned(&self) -> bool {
        self.metadata.pinned
    }

    /// Clears the cached token counts. Call after changing a field that is counted.
    pub fn touch(&mut self) {
        self.tokens = TokenCache::default();
    }

    /// The cached token count for `encoding`, if one was computed or loaded.
    pub fn cached_tokens(&self, encoding: Encoding) -> Option<u32> {
        self.tokens.get(encoding)
    }

    /// Records a token count computed elsewhere (e.g. read back from a store that saved it).
    /// The first value recorded for an encoding wins until [`Message::touch`].
    pub fn set_cached_tokens(&self, encoding: Encoding, count: u32) {
        self.tokens.set(encoding, count);
    }

    /// The cached count for `encoding`, computing it with `compute` the first time.
    pub(crate) fn tokens_or_insert_with(
        &self,
        encoding: Encoding,
        compute: impl FnOnce() -> u32,
    ) -> u32 {
        match self.tokens.get(encoding) {
            Some(count) => count,
            None => self.tokens.set(encoding, compute()),
        }
    }
}

/// Per-encoding token counts of one message, each set once (the first value wins).
///
/// A slot holds the count plus one, and 0 while unknown. Atomics rather than `OnceLock`s:
/// messages are cloned on every projection and fit, and cloning a set `OnceLock` goes
/// through its initialization path each time; a count is a plain number, so relaxed loads
/// and stores are enough.
#[derive(Default)]
struct TokenCache {
    slots: [AtomicU32; Encoding::COUNT],
}

impl TokenCache {
    fn get(&self, encoding: Encoding) -> Option<u32> {
        self.slots[encoding.index()]
            .load(Ordering::Relaxed)
            .checked_sub(1)
    }

    /// Records `count` unless a count is there already; returns the count kept.
    fn set(&self, encoding: Encoding, count: u32) -> u32 {
        let stored = count.saturating_add(1);
        match self.slots[encoding.index()].compare_exchange(
            0,
            stored,
            Ordering::Relaxed,
            Ordering::Relaxed,
        ) {
            Ok(_) => stored - 1,
            Err(kept) => kept - 1,
        }
    }
}

impl Clone for TokenCache {
    fn clone(&self) -> Self {
        TokenCache {
            slots: std::array::from_fn(|i| AtomicU32::new(self.slots[i].load(Ordering::Relaxed))),
        }
    }
}

impl std::fmt::Debug for TokenCache {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_list()
            .entries(Encoding::ALL.into_iter().map(|encoding| self.get(encoding)))
            .finish()
    }
}

/// A cache is not part of a message's value: two messages with equal fields are equal
/// whether or not either has been counted.
impl PartialEq for TokenCache {
    fn eq(&self, _other: &Self) -> bool {
        true
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn storage_form_round_trips_and_skips_the_cache() {
        let message = Message::assistant_tool_calls(vec![
            ToolCall::new("call_1", "search", r#"{"q":"rust"}"#),
            ToolCall::new("call_2", "fetch", r#"{"url":"https://x"}"#),
        ]);
        message.set_cached_tokens(Encoding::Cl100kBase, 42);
        let json = serde_json::to_string(&message).unwrap();
        assert!(!json.contains("tokens"));
        let back: Message = serde_json::from_str(&json).unwrap();
        assert_eq!(back, message);
        assert_eq!(back.cached_tokens(Encoding::Cl100kBase), None);
    }

    #[test]
    fn writing_a_copy_leaves_the_other_copies_as_they_were() {
        let original = Message::assistant_tool_calls(vec![ToolCall::new("c1", "search", "{}")]);
        original.set_cached_tokens(Encoding::O200kBase, 12);
        let mut copy = original.clone();
        assert!(
            Arc::ptr_eq(&original.0, &copy.0),
            "a copy shares the fields"
        );
        copy.tool_calls[0].arguments = r#"{"q":"x"}"#.into();
        copy.touch();
        copy.metadata.pinned = true;
        assert_eq!(&*original.tool_calls[0].arguments, "{}");
        assert!(!original.is_pinned());
        assert_eq!(original.cached_tokens(Encoding::O200kBase), Some(12));
        assert_eq!(copy.cached_tokens(Encoding::O200kBase), None);
        assert_ne!(original, copy);
        let fields = copy.clone().into_fields();
        assert_eq!(Message::from(fields), copy);
    }

    #[test]
    fn touch_clears_the_cache() {
        let mut message = Message::user("hello");
        message.set_cached_tokens(Encoding::O200kBase, 7);
        assert_eq!(message.cached_tokens(Encoding::O200kBase), Some(7));
        message.set_text("a longer text");
        assert_eq!(message.cached_tokens(Encoding::O200kBase), None);
    }

    #[test]
    fn content_text_joins_text_parts_only() {
        let content = Content::Parts(vec![
            Part::text("first"),
            Part::image("https://example.com/a.png"),
            Part::reasoning("hidden"),
            Part::text("second"),
        ]);
        assert_eq!(content.text(), "first\nsecond");
    }
}
