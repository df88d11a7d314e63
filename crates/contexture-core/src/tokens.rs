//! Token counting.
//!
//! Exact BPE counts for OpenAI's `cl100k_base` and `o200k_base` encodings: the text is cut
//! into pieces by the encoding's pattern (`pieces`) and each piece merged by the encoding's
//! ranks (`ranks`), whose tables the build compiles into the binary from OpenAI's rank files:
//! nothing is read from disk or the network, nor built, at run time.
//!
//! A whole chat request is counted by OpenAI's published recipe: every message costs
//! [`TOKENS_PER_MESSAGE`] plus the tokens of its role and of each field's value, a `name`
//! costs [`TOKENS_PER_NAME`] more, and the reply is primed with [`REPLY_PRIMING`] tokens.
//! Tool schemas are counted by the recipe's function-definition rules ([`tools_tokens`]).
//!
//! A message's count is computed once per encoding and cached inside the [`Message`]; budget
//! and fitting code reads the cache and never tokenizes a message twice.
//!
//! Models of other families have no public tokenizer we can ship exactly. They are counted
//! with a [`TokenCounter::Estimate`]: an OpenAI encoding's exact count scaled by a ratio and
//! rounded up. The built-in ratios (see the model registry) are deliberately on the high side
//! so that a fitted request is rarely over the real window; a configured ratio can replace
//! them.

use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::message::{Content, Message, Part};

mod pieces;
mod rank_hash;
mod ranks;

/// Tokens every message costs beyond its fields' values (OpenAI's chat recipe).
pub const TOKENS_PER_MESSAGE: u32 = 3;
/// Extra tokens a message's `name` field costs (OpenAI's chat recipe).
pub const TOKENS_PER_NAME: u32 = 1;
/// Tokens that prime the assistant's reply, counted once per request (OpenAI's chat recipe).
pub const REPLY_PRIMING: u32 = 3;
/// Tokens each tool call in an assistant turn costs beyond its name and arguments. OpenAI
/// publishes no figure; this is an estimate on the safe side.
pub const TOKENS_PER_TOOL_CALL: u32 = 4;
/// Tokens counted for an image with `detail: low`: OpenAI's fixed cost.
pub const IMAGE_TOKENS_LOW: u32 = 85;
/// Tokens counted for an image of unknown size at `high` or `auto` detail: OpenAI's cost of a
/// 1024x1024 image (4 tiles x 170 + 85). The size of a referenced image is not known without
/// fetching it, which the core never does.
pub const IMAGE_TOKENS_DEFAULT: u32 = 765;

/// An exact BPE encoding shipped inside the binary.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum Encoding {
    /// `cl100k_base`: GPT-4, GPT-3.5-turbo, text-embedding-3.
    #[serde(rename = "cl100k_base")]
    Cl100kBase,
    /// `o200k_base`: GPT-4o, GPT-4.1, o-series, GPT-5.
    #[serde(rename = "o200k_base")]
    O200kBase,
}

/// An encoding name that is not one of the shipped encodings.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("unknown encoding `{name}` (known encodings: cl100k_base, o200k_base)")]
pub struct UnknownEncoding {
    /// The name that was asked for.
    pub name: String,
}

impl Encoding {
    /// How many encodings exist (the size of a message's token cache).
    pub const COUNT: usize = 2;
    /// Every encoding.
    pub const ALL: [Encoding; Encoding::COUNT] = [Encoding::Cl100kBase, Encoding::O200kBase];

    /// The encoding's tiktoken name.
    pub fn name(self) -> &'static str {
        match self {
            Encoding::Cl100kBase => "cl100k_base",
            Encoding::O200kBase => "o200k_base",
        }
    }

    /// Looks an encoding up by its tiktoken name.
    pub fn from_name(name: &str) -> Result<Encoding, UnknownEncoding> {
        Encoding::ALL
            .into_iter()
            .find(|encoding| encoding.name() == name)
            .ok_or_else(|| UnknownEncoding {
                name: name.to_owned(),
            })
    }

    pub(crate) fn index(self) -> usize {
        match self {
            Encoding::Cl100kBase => 0,
            Encoding::O200kBase => 1,
        }
    }

    fn ranks(self) -> &'static ranks::Ranks {
        match self {
            Encoding::Cl100kBase => &ranks::CL100K_BASE,
            Encoding::O200kBase => &ranks::O200K_BASE,
        }
    }

    fn pattern(self) -> pieces::Pattern {
        match self {
            Encoding::Cl100kBase => pieces::Pattern::Cl100k,
            Encoding::O200kBase => pieces::Pattern::O200k,
        }
    }

    /// The exact number of tokens `text` encodes to.
    pub fn count(self, text: &str) -> usize {
        self.count_pieces_through(text, text.len()).0
    }

    /// The tokens of `text`'s pieces that end at or before byte `bound`, and where the last
    /// of them ends.
    fn count_pieces_through(self, text: &str, bound: usize) -> (usize, usize) {
        if text.is_empty() {
            return (0, 0);
        }
        // Each piece (see `pieces`: ASCII ones are cut without the regex) is merged by its
        // ranks (see `ranks`), with the counts of short pieces remembered: prose repeats its
        // words, and a merge looks up every pair. (Neither encoding normalizes its input.)
        let ranks = self.ranks();
        PIECE_COUNTS.with(|memo| {
            let mut memo = memo.borrow_mut();
            let (mut tokens, mut end) = (0, 0);
            for piece in pieces::pieces(self.pattern(), text) {
                if end + piece.len() > bound {
                    break;
                }
                end += piece.len();
                tokens += memo.count(self, piece, || ranks.count(piece.as_bytes()));
            }
            (tokens, end)
        })
    }

    /// The token ids of `text` (used where text must be cut at a token boundary).
    pub fn encode(self, text: &str) -> Vec<u32> {
        let ranks = self.ranks();
        let mut ids = Vec::new();
        for piece in pieces::pieces(self.pattern(), text) {
            ranks.encode(piece.as_bytes(), &mut ids);
        }
        ids
    }
}

/// Pieces (what pre-tokenizing cuts a text into) up to this many bytes have their counts
/// remembered; longer ones are rare and mostly unique.
const MEMO_PIECE_BYTES: usize = 24;

/// Pieces remembered per encoding and thread; past it the memo starts over.
const MEMO_PIECES: usize = 65_536;

thread_local! {
    static PIECE_COUNTS: std::cell::RefCell<PieceCounts> = std::cell::RefCell::default();
}

/// Token counts of short pieces, per encoding: a piece's count depends on its bytes alone.
#[derive(Default)]
struct PieceCounts {
    by_encoding: [rustc_hash::FxHashMap<PieceKey, usize>; Encoding::COUNT],
}

/// A piece of at most [`MEMO_PIECE_BYTES`] bytes packed into words (its bytes, zero-padded,
/// then its length, which tells pieces that end in zero bytes apart): hashing and comparing
/// it are a few word operations, and remembering one allocates nothing.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
struct PieceKey([u64; 3], usize);

impl PieceKey {
    fn new(piece: &[u8]) -> PieceKey {
        let mut padded = [0u8; MEMO_PIECE_BYTES];
        padded[..piece.len()].copy_from_slice(piece);
        let word = |at: usize| {
            let mut bytes = [0u8; 8];
            bytes.copy_from_slice(&padded[at..at + 8]);
            u64::from_le_bytes(bytes)
        };
        PieceKey([word(0), word(8), word(16)], piece.len())
    }
}

impl PieceCounts {
    fn count(&mut self, encoding: Encoding, piece: &str, compute: impl FnOnce() -> usize) -> usize {
        if piece.len() > MEMO_PIECE_BYTES {
            return compute();
        }
        let key = PieceKey::new(piece.as_bytes());
        let memo = &mut self.by_encoding[encoding.index()];
        if let Some(&count) = memo.get(&key) {
            return count;
        }
        let count = compute();
        if memo.len() >= MEMO_PIECES {
            memo.clear();
        }
        memo.insert(key, count);
        count
    }
}

impl std::fmt::Display for Encoding {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

impl std::str::FromStr for Encoding {
    type Err = UnknownEncoding;
    fn from_str(name: &str) -> Result<Self, Self::Err> {
        Encoding::from_name(name)
    }
}

/// How a model's tokens are counted.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum TokenCounter {
    /// Exact counts with the model's own encoding.
    Exact {
        /// The model's encoding.
        encoding: Encoding,
    },
    /// An estimate for a model whose tokenizer is not shipped: the exact count under
    /// `encoding`, multiplied by `ratio` and rounded up; then, once its family has been
    /// calibrated from reported usage, multiplied by `calibration` and rounded up again (so a
    /// calibrated count is never below the calibration times the uncalibrated one).
    Estimate {
        /// The encoding whose counts are scaled.
        encoding: Encoding,
        /// The scale factor (for example 1.15 when the model's tokenizer produces about 15%
        /// more tokens than `encoding` on typical text).
        ratio: f64,
        /// The correction learnt from what providers reported (see
        /// [`crate::calibration`]); `None` until there is one.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        calibration: Option<f64>,
    },
}

impl TokenCounter {
    /// An exact counter for `encoding`.
    pub const fn exact(encoding: Encoding) -> TokenCounter {
        TokenCounter::Exact { encoding }
    }

    /// The encoding whose exact counts this counter starts from (and which the message cache
    /// is keyed by).
    pub fn encoding(&self) -> Encoding {
        match *self {
            TokenCounter::Exact { encoding } | TokenCounter::Estimate { encoding, .. } => encoding,
        }
    }

    /// True when counts are exact.
    pub fn is_exact(&self) -> bool {
        matches!(self, TokenCounter::Exact { .. })
    }

    /// How many of this counter's tokens one token of its encoding comes to, on average:
    /// 1 when exact, else the ratio times the calibration.
    pub fn effective_ratio(&self) -> f64 {
        match *self {
            TokenCounter::Exact { .. } => 1.0,
            TokenCounter::Estimate {
                ratio, calibration, ..
            } => ratio * calibration.unwrap_or(1.0),
        }
    }

    /// This counter without the calibration learnt from reported usage: what an observation
    /// is measured against.
    pub fn uncalibrated(self) -> TokenCounter {
        match self {
            TokenCounter::Estimate {
                encoding, ratio, ..
            } => TokenCounter::Estimate {
                encoding,
                ratio,
                calibration: None,
            },
            exact => exact,
        }
    }

    /// Converts an exact count under [`TokenCounter::encoding`] into this counter's count.
    pub fn scale(&self, base: u32) -> u32 {
        match *self {
            TokenCounter::Exact { .. } => base,
            TokenCounter::Estimate {
                ratio, calibration, ..
            } => {
                let estimate = (f64::from(base) * ratio).ceil();
                match calibration {
                    Some(factor) => (estimate * factor).ceil() as u32,
                    None => estimate as u32,
                }
            }
        }
    }

    /// The tokens of a plain text.
    pub fn count_text(&self, text: &str) -> u32 {
        self.scale(saturating_u32(self.encoding().count(text)))
    }

    /// A count of a text that arrives in parts (a file read a chunk at a time): it comes to
    /// what [`TokenCounter::count_text`] gives for the whole text, and holds only the text
    /// whose pieces are not yet settled.
    pub fn text_in_parts(&self) -> TextInParts {
        TextInParts {
            counter: *self,
            pending: String::new(),
            counted: 0,
            settle_bytes: SETTLE_BYTES,
            settle_at: SETTLE_BYTES,
        }
    }

    /// The tokens one message costs in a request, by the chat recipe (cached per encoding).
    pub fn count_message(&self, message: &Message) -> u32 {
        self.scale(message_tokens(message, self.encoding()))
    }

    /// The tokens of the tool schemas sent with a request (0 for none).
    pub fn count_tools(&self, tools: &[Value]) -> u32 {
        if tools.is_empty() {
            0
        } else {
            self.scale(tools_tokens(tools, self.encoding()))
        }
    }

    /// The total of [`TokenCounter::count_request`] without the per-message breakdown, for
    /// messages that are not in one slice.
    pub fn count_request_total<'a>(
        &self,
        messages: impl IntoIterator<Item = &'a Message>,
        tools: &[Value],
    ) -> u64 {
        messages
            .into_iter()
            .map(|message| u64::from(self.count_message(message)))
            .sum::<u64>()
            + u64::from(REPLY_PRIMING)
            + u64::from(self.count_tools(tools))
    }

    /// The tokens of a whole request: every message, the reply priming and the tool schemas.
    pub fn count_request(&self, messages: &[Message], tools: &[Value]) -> RequestCount {
        let per_message: Vec<u32> = messages
            .iter()
            .map(|message| self.count_message(message))
            .collect();
        let tools = self.count_tools(tools);
        let total = per_message.iter().map(|&n| u64::from(n)).sum::<u64>()
            + u64::from(REPLY_PRIMING)
            + u64::from(tools);
        RequestCount {
            per_message,
            reply_priming: REPLY_PRIMING,
            tools,
            total: u32::try_from(total).unwrap_or(u32::MAX),
        }
    }
}

/// The token count of a whole request, part by part.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct RequestCount {
    /// Each message's tokens, in order, overhead included.
    pub per_message: Vec<u32>,
    /// The tokens that prime the reply.
    pub reply_priming: u32,
    /// The tokens of the tool schemas.
    pub tools: u32,
    /// Everything together.
    pub total: u32,
}

/// The exact tokens `message` costs under `encoding` by the chat recipe, from the message's
/// cache when it has been counted before.
pub fn message_tokens(message: &Message, encoding: Encoding) -> u32 {
    message.tokens_or_insert_with(encoding, || count_message_uncached(message, encoding))
}

fn count_message_uncached(message: &Message, encoding: Encoding) -> u32 {
    let content = message
        .content
        .as_ref()
        .map_or(0, |content| content_tokens(content, encoding));
    message_overhead_tokens(message, encoding).saturating_add(content)
}

/// The tokens of `message` under `encoding` besides its content (its role, name, call id and
/// tool calls, and the per-message overhead): a message's count less this is its content's.
pub fn message_overhead_tokens(message: &Message, encoding: Encoding) -> u32 {
    let count = |text: &str| saturating_u32(encoding.count(text));
    let mut tokens = TOKENS_PER_MESSAGE + count(message.role.as_str());
    if let Some(name) = &message.name {
        tokens = tokens.saturating_add(count(name) + TOKENS_PER_NAME);
    }
    if let Some(id) = &message.tool_call_id {
        tokens = tokens.saturating_add(count(id));
    }
    for call in &message.tool_calls {
        tokens = tokens
            .saturating_add(TOKENS_PER_TOOL_CALL)
            .saturating_add(count(&call.name))
            .saturating_add(count(&call.arguments));
    }
    tokens
}

fn content_tokens(content: &Content, encoding: Encoding) -> u32 {
    match content {
        Content::Text(text) => saturating_u32(encoding.count(text)),
        Content::Parts(parts) => parts
            .iter()
            .map(|part| part_tokens(part, encoding))
            .fold(0u32, u32::saturating_add),
    }
}

fn part_tokens(part: &Part, encoding: Encoding) -> u32 {
    match part {
        Part::Text { text, .. } => saturating_u32(encoding.count(text)),
        Part::Image { detail, .. } => match detail.as_deref() {
            Some("low") => IMAGE_TOKENS_LOW,
            _ => IMAGE_TOKENS_DEFAULT,
        },
        // Reasoning is counted although chat-completions providers drop it from input: a
        // provider that keeps it (Anthropic's thinking blocks) bills it, so counting it is the
        // safe side.
        Part::Reasoning { text, redacted, .. } => saturating_u32(
            encoding.count(text) + redacted.as_deref().map_or(0, |r| encoding.count(r)),
        ),
        Part::Other { value } => saturating_u32(encoding.count(&value.to_string())),
    }
}

// The function-definition constants of OpenAI's published recipe for gpt-4o and gpt-4.
const FUNC_INIT: i64 = 7;
const PROP_INIT: i64 = 3;
const PROP_KEY: i64 = 3;
const ENUM_INIT: i64 = -3;
const ENUM_ITEM: i64 = 3;
const FUNC_END: i64 = 12;

/// The tokens of tool schemas in OpenAI's format (`{"type": "function", "function": {name,
/// description, parameters}}`, or the bare function object), by OpenAI's published recipe.
/// Nested object properties are counted by the same rule as top-level ones; a schema that is
/// not in the expected shape is counted as its JSON text, so nothing is ever counted as free.
pub fn tools_tokens(tools: &[Value], encoding: Encoding) -> u32 {
    if tools.is_empty() {
        return 0;
    }
    let count = |text: &str| encoding.count(text) as i64;
    let mut total: i64 = 0;
    for tool in tools {
        let function = tool.get("function").unwrap_or(tool);
        let Some(name) = function.get("name").and_then(Value::as_str) else {
            total += count(&tool.to_string());
            continue;
        };
        total += FUNC_INIT;
        let description = function
            .get("description")
            .and_then(Value::as_str)
            .unwrap_or("");
        total += count(&format!(
            "{name}:{}",
            description.strip_suffix('.').unwrap_or(description)
        ));
        if let Some(properties) = function
            .get("parameters")
            .and_then(|p| p.get("properties"))
            .and_then(Value::as_object)
        {
            total += properties_tokens(properties, &count);
        }
    }
    total += FUNC_END;
    u32::try_from(total.max(0)).unwrap_or(u32::MAX)
}

fn properties_tokens(
    properties: &serde_json::Map<String, Value>,
    count: &dyn Fn(&str) -> i64,
) -> i64 {
    if properties.is_empty() {
        return 0;
    }
    let mut total = PROP_INIT;
    for (key, schema) in properties {
        total += PROP_KEY;
        let kind = schema.get("type").map_or_else(String::new, |t| match t {
            Value::String(s) => s.clone(),
            other => other.to_string(),
        });
        let description = schema
            .get("description")
            .and_then(Value::as_str)
            .unwrap_or("");
        if let Some(items) = schema.get("enum").and_then(Value::as_array) {
            total += ENUM_INIT;
            for item in items {
                total += ENUM_ITEM;
                total += match item {
                    Value::String(s) => count(s),
                    other => count(&other.to_string()),
                };
            }
        }
        total += count(&format!(
            "{key}:{kind}:{}",
            description.strip_suffix('.').unwrap_or(description)
        ));
        if let Some(nested) = schema.get("properties").and_then(Value::as_object) {
            total += properties_tokens(nested, count);
        }
        if let Some(nested) = schema
            .get("items")
            .and_then(|items| items.get("properties"))
            .and_then(Value::as_object)
        {
            total += properties_tokens(nested, count);
        }
    }
    total
}

/// Text held back before settling pieces: settling scans the held text, so it waits until
/// there is this much of it.
const SETTLE_BYTES: usize = 64 * 1024;

/// Bytes past a piece's end that cutting it may read: a contraction after a word (`'re`,
/// three characters of up to four bytes each) and the character after that.
const PIECE_LOOKAHEAD_BYTES: usize = 16;

/// A text counted as it arrives in parts; see [`TokenCounter::text_in_parts`].
///
/// A piece is settled (counted, and its text let go) once the text after it could not change
/// where it ends: it ends at least [`PIECE_LOOKAHEAD_BYTES`] before the held text does, and a
/// character that is not white space follows it (a run of white space is cut by where it
/// ends, so one that reaches the end of the held text may still grow). What is held is the
/// latest part plus the last unsettled piece: a single piece (a run of white space or of
/// letters) is held whole, however long.
#[derive(Debug, Clone)]
pub struct TextInParts {
    counter: TokenCounter,
    /// Text not yet counted.
    pending: String,
    /// Tokens of the settled pieces.
    counted: usize,
    /// [`SETTLE_BYTES`], smaller in tests.
    settle_bytes: usize,
    /// Settle when this much text is held: `settle_bytes` more than was left unsettled,
    /// or twice as much when more was (a long piece is then rescanned a logarithmic number of
    /// times, not once per part).
    settle_at: usize,
}

impl TextInParts {
    /// Adds the next part of the text.
    pub fn push(&mut self, part: &str) {
        self.pending.push_str(part);
        if self.pending.len() < self.settle_at {
            return;
        }
        let last_word = self
            .pending
            .char_indices()
            .rev()
            .find(|(_, c)| !c.is_whitespace())
            .map_or(0, |(at, _)| at);
        let bound = last_word.min(self.pending.len().saturating_sub(PIECE_LOOKAHEAD_BYTES));
        let (tokens, end) = self
            .counter
            .encoding()
            .count_pieces_through(&self.pending, bound);
        self.counted += tokens;
        self.pending.drain(..end);
        self.settle_at = self.pending.len() + self.pending.len().max(self.settle_bytes);
    }

    /// The count of the whole text, as [`TokenCounter::count_text`] gives it.
    pub fn finish(self) -> u32 {
        let rest = self.counter.encoding().count(&self.pending);
        self.counter
            .scale(saturating_u32(self.counted.saturating_add(rest)))
    }
}

fn saturating_u32(n: usize) -> u32 {
    u32::try_from(n).unwrap_or(u32::MAX)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::message::{Message, ToolCall};

    /// Counts `text` pushed as the parts that `cuts` (character indices) make, settling
    /// whenever `settle_bytes` are held.
    fn count_in_parts(
        counter: TokenCounter,
        text: &str,
        cuts: &[usize],
        settle_bytes: usize,
    ) -> (u32, usize) {
        let mut parts = counter.text_in_parts();
        parts.settle_bytes = settle_bytes;
        parts.settle_at = settle_bytes;
        let boundaries: Vec<usize> = text.char_indices().map(|(at, _)| at).collect();
        let mut cuts: Vec<usize> = cuts
            .iter()
            .filter_map(|cut| boundaries.get(*cut).copied())
            .collect();
        cuts.sort_unstable();
        let (mut from, mut most_held) = (0, 0);
        for cut in cuts.into_iter().chain([text.len()]) {
            parts.push(&text[from..cut]);
            most_held = most_held.max(parts.pending.len());
            from = cut;
        }
        (parts.finish(), most_held)
    }

    proptest::proptest! {
        #![proptest_config(proptest::prelude::ProptestConfig::with_cases(2_000))]

        #[test]
        fn a_text_counted_in_parts_comes_to_its_whole_count(
            text in "([a-zA-Z]{1,8}|[0-9]{1,4}|'[sStTdDmMrRvVlL]{1,2}|[ \\t]{1,6}|[\\r\\n]{1,3}|[.,;:!?/()-]{1,3}|é|ſ|K|²|\u{a0}|\u{85}|\u{3000}|\u{301}|日本|🎉){0,120}",
            cuts in proptest::collection::vec(0usize..400, 0..12),
            settle_bytes in 1usize..80,
        ) {
            for encoding in Encoding::ALL {
                let counter = TokenCounter::exact(encoding);
                let whole = counter.count_text(&text);
                let (in_parts, _) = count_in_parts(counter, &text, &cuts, settle_bytes);
                proptest::prop_assert_eq!(in_parts, whole, "{} {:?} cut at {:?}", encoding, text, cuts);
            }
        }
    }

    proptest::proptest! {
        #![proptest_config(proptest::prelude::ProptestConfig::with_cases(300))]

        #[test]
        fn a_text_cut_anywhere_in_two_comes_to_its_whole_count(
            text in "([a-z]{1,3}|[A-Z]{1,2}|[0-9]{1,4}|'[sStTdDmMrRvVlL]{1,2}|[ \\t]{1,4}|[\\r\\n]{1,2}|[.!?/-]{1,2}|é|\u{a0}|\u{3000}|🎉){0,40}",
        ) {
            for encoding in Encoding::ALL {
                let counter = TokenCounter::exact(encoding);
                let whole = counter.count_text(&text);
                for cut in 1..text.chars().count() {
                    let (in_parts, _) = count_in_parts(counter, &text, &[cut], 1);
                    proptest::prop_assert_eq!(in_parts, whole, "{} {:?} cut at {}", encoding, text, cut);
                }
            }
        }
    }

    #[test]
    fn prose_counted_in_parts_holds_little_of_it() {
        let paragraph = "The deploy on Tuesday failed because the migration took a lock; \
                         we're rolling it back at 14:05.\n\n    - step 1: revert\n";
        let text = paragraph.repeat(20_000);
        let cuts: Vec<usize> = (1..1_000).map(|i| i * 1_777).collect();
        for encoding in Encoding::ALL {
            let counter = TokenCounter::exact(encoding);
            let (in_parts, most_held) = count_in_parts(counter, &text, &cuts, SETTLE_BYTES);
            assert_eq!(in_parts, counter.count_text(&text), "{encoding}");
            assert!(
                most_held < SETTLE_BYTES + 2_000,
                "{encoding}: held {most_held} bytes"
            );
        }
        // An estimate scales the whole count once, as a count of the whole text does.
        let estimate = TokenCounter::Estimate {
            encoding: Encoding::Cl100kBase,
            ratio: 1.15,
            calibration: None,
        };
        assert_eq!(
            count_in_parts(estimate, &text, &cuts, SETTLE_BYTES).0,
            estimate.count_text(&text)
        );
    }

    #[test]
    fn known_counts() {
        // Figures from tiktoken.
        assert_eq!(Encoding::Cl100kBase.count("hello world"), 2);
        assert_eq!(Encoding::O200kBase.count("hello world"), 2);
        assert_eq!(Encoding::Cl100kBase.count(""), 0);
    }

    #[test]
    fn remembered_piece_counts_agree_with_the_tokenizer() {
        let long_word = "x".repeat(MEMO_PIECE_BYTES * 3);
        let texts = [
            "The deploy on Tuesday failed because the migration took a lock.".to_string(),
            "the the the The THE  the\n\n the".to_string(),
            format!("{long_word} {long_word}"),
            "日本語のテキスト、絵文字 🎉🎉 and code: fn main() { println!(\"hi\"); }".to_string(),
            "    indented\tlines\r\n    again 12345 67890 3.14159".to_string(),
        ];
        for encoding in Encoding::ALL {
            for text in &texts {
                let reference = match encoding {
                    Encoding::Cl100kBase => bpe_openai::cl100k_base(),
                    Encoding::O200kBase => bpe_openai::o200k_base(),
                };
                let direct = reference.count(text.as_str());
                // Twice: the second count reads the remembered pieces.
                assert_eq!(encoding.count(text), direct, "{encoding} {text:?}");
                assert_eq!(encoding.count(text), direct, "{encoding} {text:?} (again)");
            }
        }
        // A full memo starts over and keeps counting right.
        let mut memo = PieceCounts::default();
        for i in 0..MEMO_PIECES + 5 {
            let piece = format!("p{i}");
            assert_eq!(memo.count(Encoding::O200kBase, &piece, || i), i);
        }
        assert!(memo.by_encoding[Encoding::O200kBase.index()].len() <= MEMO_PIECES);
        assert!(memo.by_encoding[Encoding::Cl100kBase.index()].is_empty());
        // Pieces that differ only by trailing zero bytes are different pieces.
        assert_ne!(PieceKey::new(b"a"), PieceKey::new(b"a\0"));
        assert_ne!(PieceKey::new(b""), PieceKey::new(b"\0"));
    }

    #[test]
    fn chat_recipe_matches_openai_cookbook_example() {
        // The example conversation of OpenAI's "How to count tokens with tiktoken" cookbook,
        // for which the API reports 129 prompt tokens on gpt-4 (cl100k_base).
        let counter = TokenCounter::exact(Encoding::Cl100kBase);
        let system = |text: &str| Message::system(text);
        let messages = vec![
            system("You are a helpful, pattern-following assistant that translates corporate jargon into plain English."),
            system("New synergies will help drive top-line growth.").with_name("example_user"),
            system("Things working well together will increase revenue.").with_name("example_assistant"),
            system("Let's circle back when we have more bandwidth to touch base on opportunities for increased leverage.").with_name("example_user"),
            system("Let's talk later when we're less busy about how to do better.").with_name("example_assistant"),
            Message::user("This late pivot means we don't have time to boil the ocean for the client deliverable."),
        ];
        assert_eq!(counter.count_request(&messages, &[]).total, 129);
    }

    #[test]
    fn message_counts_are_cached() {
        let message = Message::assistant_tool_calls(vec![ToolCall::new("c1", "search", "{}")]);
        assert_eq!(message.cached_tokens(Encoding::O200kBase), None);
        let first = message_tokens(&message, Encoding::O200kBase);
        assert_eq!(message.cached_tokens(Encoding::O200kBase), Some(first));
        assert_eq!(message.cached_tokens(Encoding::Cl100kBase), None);
    }

    #[test]
    fn estimate_scales_and_rounds_up() {
        let counter = TokenCounter::Estimate {
            encoding: Encoding::Cl100kBase,
            ratio: 1.5,
            calibration: None,
        };
        assert_eq!(counter.count_text("hello world"), 3);
        // A calibration scales the rounded estimate and rounds up again.
        let calibrated = TokenCounter::Estimate {
            encoding: Encoding::Cl100kBase,
            ratio: 1.5,
            calibration: Some(1.1),
        };
        assert_eq!(calibrated.count_text("hello world"), 4);
        assert_eq!(calibrated.uncalibrated(), counter);
        assert!((calibrated.effective_ratio() - 1.65).abs() < 1e-12);
    }

    #[test]
    fn unknown_encoding_is_named() {
        let err = Encoding::from_name("p50k").unwrap_err();
        assert!(err.to_string().contains("p50k"));
    }
}
