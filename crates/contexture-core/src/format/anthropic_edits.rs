//! Anthropic's context editing (`context_management.edits` of a Messages request), read into
//! the fit settings Contexture carries them out with, whatever model answers: clearing old
//! tool uses ([`ClearPolicy`]), clearing old reasoning ([`ThinkingPolicy`]) and compacting
//! ([`CompactEdit`]). Each edit is checked as Anthropic checks it, and an error names the
//! field (`context_management.edits[1].keep.value`).
//!
//! Defaults are Anthropic's: tool uses are cleared past 100,000 input tokens keeping the 3
//! newest; reasoning is kept for the newest assistant turn; compaction starts past 150,000
//! input tokens.
//!
//! A compaction is answered as a `compaction` content block ([`compaction_block`]) whose
//! `content` is the summary as readable text, and whose `encrypted_content` (which clients
//! send back verbatim) says how many of the request's newest messages the compaction kept
//! as they were. A later request that sends the block back is read as the summary, those
//! kept messages, and what follows the block ([`resume_after_compaction`]): what else
//! precedes the block is not sent on.

use serde_json::{Map, Value, json};

use super::openai_request::{BodyError, present};
use crate::fit::{ClearInputs, ClearPolicy, ClearedResult, ClearedThinking, ThinkingPolicy};
use crate::message::{Content, Message, Part, Role};

/// How a compaction block's `encrypted_content` starts: the number that follows is how many
/// of the compacted request's newest messages the compaction kept as they were.
const KEPT_PREFIX: &str = "contexture-compaction:kept=";

/// The type of the edit that clears old tool uses.
pub const CLEAR_TOOL_USES: &str = "clear_tool_uses_20250919";
/// The type of the edit that clears old reasoning.
pub const CLEAR_THINKING: &str = "clear_thinking_20251015";
/// The type of the edit that compacts the conversation.
pub const COMPACT: &str = "compact_20260112";

/// The input tokens past which tool uses are cleared when the edit names no trigger.
pub const DEFAULT_CLEAR_TRIGGER: u64 = 100_000;
/// The input tokens past which the conversation is compacted when the edit names no
/// trigger.
pub const DEFAULT_COMPACT_TRIGGER: u64 = 150_000;

/// The edits a request named, in the order it named them.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct ContextEdits {
    /// Clearing old tool uses.
    pub clear_tool_uses: Option<ClearPolicy>,
    /// Clearing old reasoning: how many of the newest turns keep theirs (`None` in the
    /// policy: every turn, `keep: "all"`).
    pub clear_thinking: Option<Option<ThinkingPolicy>>,
    /// Compacting.
    pub compact: Option<CompactEdit>,
}

/// A compaction edit.
#[derive(Debug, Clone, PartialEq)]
pub struct CompactEdit {
    /// The input tokens past which the conversation is compacted.
    pub trigger_tokens: u64,
    /// True: a request that compacts answers with the compaction alone (stop reason
    /// `compaction`), the client sending the next request itself.
    pub pause_after_compaction: bool,
    /// More instructions for the summary, added to the summarizer's prompt.
    pub instructions: Option<String>,
}

/// The `compaction` content block of a compaction whose replacement is `summary` (the
/// messages standing for what it covered) and which kept the request's newest `kept`
/// messages as they were.
pub fn compaction_block(summary: &[Message], kept: usize) -> Value {
    let text = summary
        .iter()
        .map(Message::text)
        .filter(|text| !text.trim().is_empty())
        .collect::<Vec<_>>()
        .join("\n\n");
    json!({
        "type": "compaction",
        "content": text,
        "encrypted_content": format!("{KEPT_PREFIX}{kept}"),
    })
}

/// `messages` (a request as read, its system prompt first) resumed after the last
/// compaction block it sends back: the block's summary as a user message, the messages the
/// compaction kept (the block's `encrypted_content` says how many: the last ones of the
/// request it compacted, itself resumed after any earlier block), the rest of the block's
/// turn, and what follows it. Everything else before the block is left out. A block
/// without a summary (`content` null: a compaction that failed) is only taken out. Without
/// a block, `messages` as they are.
pub fn resume_after_compaction(messages: Vec<Message>) -> Vec<Message> {
    let system_len = messages
        .iter()
        .take_while(|message| message.role.is_system_like())
        .count();
    let last = (system_len..messages.len()).rev().find_map(|index| {
        block_turn(&messages[index])
            .filter(|turn| turn.summary.is_some())
            .map(|turn| (index, turn))
    });
    let Some((index, turn)) = last else {
        if !messages.iter().any(|message| block_turn(message).is_some()) {
            return messages;
        }
        return messages.iter().filter_map(without_failed_block).collect();
    };
    let mut resumed: Vec<Message> = messages[..system_len].to_vec();
    resumed.push(Message::user(turn.summary.unwrap_or_default()));
    resumed.extend(kept_tail(&messages[..index], system_len, turn.kept));
    resumed.extend(turn.rest);
    resumed.extend(
        messages[index + 1..]
            .iter()
            .filter_map(without_failed_block),
    );
    resumed
}

/// A turn holding a compaction block, taken apart.
struct BlockTurn {
    /// The turn without the block and what preceded it (`None`: nothing is left of it).
    rest: Option<Message>,
    /// The block's summary (`None`: the compaction failed).
    summary: Option<String>,
    /// How many of the compacted request's last messages the compaction kept.
    kept: usize,
}

/// `message` taken apart when it is an assistant turn holding a compaction block (its last
/// one).
fn block_turn(message: &Message) -> Option<BlockTurn> {
    if message.role != Role::Assistant {
        return None;
    }
    let Some(Content::Parts(parts)) = &message.content else {
        return None;
    };
    let at = parts.iter().rposition(is_compaction_block)?;
    let Part::Other { value: block } = &parts[at] else {
        return None;
    };
    let summary = block
        .get("content")
        .and_then(Value::as_str)
        .filter(|text| !text.trim().is_empty())
        .map(str::to_owned);
    let kept = block
        .get("encrypted_content")
        .and_then(Value::as_str)
        .and_then(|text| text.strip_prefix(KEPT_PREFIX))
        .and_then(|count| count.parse::<usize>().ok())
        .unwrap_or(0);
    // What precedes the block in its own turn went with the compaction too.
    let rest: Vec<Part> = parts[at + 1..].to_vec();
    let mut turn = message.clone();
    turn.content = (!rest.is_empty()).then_some(Content::Parts(rest));
    turn.touch();
    let rest = (turn.content.is_some() || !turn.tool_calls.is_empty()).then_some(turn);
    Some(BlockTurn {
        rest,
        summary,
        kept,
    })
}

/// `message` with a failed compaction block taken out (`None`: nothing is left of it).
fn without_failed_block(message: &Message) -> Option<Message> {
    match block_turn(message) {
        Some(turn) => turn.rest,
        None => Some(message.clone()),
    }
}

/// The last `kept` messages (after the system prompt, `system_len` long) of `messages`
/// resumed after their own compaction blocks, in order. Walked from the end, each message
/// read at most once: a block met on the way starts the part it stands for (its summary,
/// then what it kept), of which no more than it kept is taken, its summary only when the
/// walk needs more than that part holds.
fn kept_tail(messages: &[Message], system_len: usize, kept: usize) -> Vec<Message> {
    /// A block the walk went past: its summary, how many messages the walk still needed
    /// there, and how many it had taken before.
    struct Passed {
        summary: String,
        needed: usize,
        taken_before: usize,
    }
    let mut taken: Vec<Message> = Vec::new();
    let mut passed: Vec<Passed> = Vec::new();
    let mut need = kept;
    let mut end = messages.len();
    while need > 0 && end > system_len {
        end -= 1;
        let message = &messages[end];
        let Some(turn) = block_turn(message) else {
            taken.push(message.clone());
            need -= 1;
            continue;
        };
        if let Some(rest) = turn.rest {
            taken.push(rest);
            need -= 1;
        }
        if let (Some(summary), true) = (turn.summary, need > 0) {
            passed.push(Passed {
                summary,
                needed: need,
                taken_before: taken.len(),
            });
            need = need.min(turn.kept);
        }
    }
    // Innermost first: a part that gave fewer messages than were needed of it starts with
    // its summary.
    while let Some(block) = passed.pop() {
        if taken.len() - block.taken_before < block.needed {
            taken.push(Message::user(block.summary));
        }
    }
    taken.reverse();
    taken
}

/// True for a `compaction` block kept as it came.
fn is_compaction_block(part: &Part) -> bool {
    matches!(part, Part::Other { value } if value.get("type").and_then(Value::as_str) == Some("compaction"))
}

/// What the edits did to one request, as the answer reports it
/// (`context_management.applied_edits`): an edit that changed nothing is not listed.
pub fn applied_edits(
    edits: &ContextEdits,
    cleared: &[ClearedResult],
    thinking: Option<&ClearedThinking>,
) -> Vec<Value> {
    let mut applied = Vec::new();
    if edits.clear_thinking.is_some()
        && let Some(thinking) = thinking.filter(|thinking| !thinking.is_empty())
    {
        applied.push(json!({
            "type": CLEAR_THINKING,
            "cleared_thinking_turns": thinking.turns,
            "cleared_input_tokens": thinking.tokens,
        }));
    }
    if edits.clear_tool_uses.is_some() && !cleared.is_empty() {
        applied.push(json!({
            "type": CLEAR_TOOL_USES,
            "cleared_tool_uses": cleared.len(),
            "cleared_input_tokens": cleared.iter().map(|result| result.tokens).sum::<u64>(),
        }));
    }
    applied
}

/// Reads `context_management` of a Messages body (`None` when it is absent or null).
pub fn read_context_management(
    body: &Map<String, Value>,
) -> Result<Option<ContextEdits>, BodyError> {
    let management = match body.get("context_management") {
        None | Some(Value::Null) => return Ok(None),
        Some(Value::Object(management)) => management,
        Some(_) => {
            return Err(BodyError::new(
                "context_management",
                "context_management: must be an object (`{\"edits\": [...]}`)",
            ));
        }
    };
    known_keys(management, "context_management", &["edits"])?;
    let edits = match management.get("edits") {
        None | Some(Value::Null) => return Ok(Some(ContextEdits::default())),
        Some(Value::Array(edits)) => edits,
        Some(_) => {
            return Err(BodyError::new(
                "context_management.edits",
                "context_management.edits: must be an array",
            ));
        }
    };
    let mut read = ContextEdits::default();
    for (index, edit) in edits.iter().enumerate() {
        let at = format!("context_management.edits[{index}]");
        let Value::Object(edit) = edit else {
            return Err(BodyError::new(&at, format!("{at}: must be an object")));
        };
        let kind = match edit.get("type") {
            Some(Value::String(kind)) => kind.as_str(),
            Some(_) => return Err(invalid(&at, "type", "must be a string")),
            None => return Err(invalid(&at, "type", "missing")),
        };
        let named_before = match kind {
            CLEAR_TOOL_USES => read.clear_tool_uses.is_some(),
            CLEAR_THINKING => read.clear_thinking.is_some(),
            COMPACT => read.compact.is_some(),
            other => {
                return Err(invalid(
                    &at,
                    "type",
                    &format!(
                        "`{other}` is not a context edit (known: {CLEAR_TOOL_USES}, {CLEAR_THINKING}, {COMPACT})"
                    ),
                ));
            }
        };
        if named_before {
            return Err(invalid(
                &at,
                "type",
                &format!("`{kind}` is named twice; name each edit once"),
            ));
        }
        match kind {
            CLEAR_TOOL_USES => read.clear_tool_uses = Some(clear_tool_uses(edit, &at)?),
            CLEAR_THINKING => {
                if index > 0 {
                    return Err(invalid(
                        &at,
                        "type",
                        &format!("{CLEAR_THINKING} must come first among the edits"),
                    ));
                }
                read.clear_thinking = Some(clear_thinking(edit, &at)?);
            }
            _ => read.compact = Some(compact(edit, &at)?),
        }
    }
    Ok(Some(read))
}

/// A `clear_tool_uses_20250919` edit as a clearing policy.
fn clear_tool_uses(edit: &Map<String, Value>, at: &str) -> Result<ClearPolicy, BodyError> {
    known_keys(
        edit,
        at,
        &[
            "type",
            "trigger",
            "keep",
            "clear_at_least",
            "exclude_tools",
            "clear_tool_inputs",
        ],
    )?;
    let mut policy = ClearPolicy::past_tokens(DEFAULT_CLEAR_TRIGGER);
    if let Some((unit, value)) = amount(edit, at, "trigger", &["input_tokens", "tool_uses"], 1)? {
        if unit == "tool_uses" {
            policy.trigger_tokens = None;
            policy.trigger_tool_uses = Some(to_usize(value));
        } else {
            policy.trigger_tokens = Some(value);
        }
    }
    if let Some((_, value)) = amount(edit, at, "keep", &["tool_uses"], 0)? {
        policy.keep = to_usize(value);
    }
    // Anthropic's `clear_at_least` makes the edit all or nothing: every result older than
    // `keep` is cleared, unless that frees less than this.
    if let Some((_, value)) = amount(edit, at, "clear_at_least", &["input_tokens"], 1)? {
        policy.min_cleared = Some(value);
    }
    if let Some(tools) = present(edit, "exclude_tools") {
        policy.exclude_tools = tool_names(tools, &format!("{at}.exclude_tools"))?;
    }
    if let Some(inputs) = present(edit, "clear_tool_inputs") {
        policy.clear_inputs = match inputs {
            Value::Bool(all) => ClearInputs::All(*all),
            _ => ClearInputs::Tools(tool_names(inputs, &format!("{at}.clear_tool_inputs"))?),
        };
    }
    Ok(policy)
}

/// A `clear_thinking_20251015` edit: how many turns keep their reasoning (`None`: all).
fn clear_thinking(
    edit: &Map<String, Value>,
    at: &str,
) -> Result<Option<ThinkingPolicy>, BodyError> {
    known_keys(edit, at, &["type", "keep"])?;
    match present(edit, "keep") {
        None => Ok(Some(ThinkingPolicy { keep_turns: 1 })),
        Some(Value::String(all)) if all == "all" => Ok(None),
        Some(Value::String(other)) => Err(invalid(
            at,
            "keep",
            &format!(
                "`{other}` is not a keep setting: give \"all\" or {{\"type\": \"thinking_turns\", \"value\": N}}"
            ),
        )),
        Some(_) => {
            let (_, value) =
                amount(edit, at, "keep", &["thinking_turns"], 1)?.expect("keep is present");
            Ok(Some(ThinkingPolicy {
                keep_turns: to_usize(value),
            }))
        }
    }
}

/// A `compact_20260112` edit.
fn compact(edit: &Map<String, Value>, at: &str) -> Result<CompactEdit, BodyError> {
    known_keys(
        edit,
        at,
        &["type", "trigger", "pause_after_compaction", "instructions"],
    )?;
    let trigger_tokens = amount(edit, at, "trigger", &["input_tokens"], 1)?
        .map_or(DEFAULT_COMPACT_TRIGGER, |(_, value)| value);
    let pause_after_compaction = match present(edit, "pause_after_compaction") {
        None => false,
        Some(Value::Bool(pause)) => *pause,
        Some(_) => return Err(invalid(at, "pause_after_compaction", "must be a boolean")),
    };
    let instructions = match present(edit, "instructions") {
        None => None,
        Some(Value::String(text)) if !text.trim().is_empty() => Some(text.clone()),
        Some(Value::String(_)) => {
            return Err(invalid(at, "instructions", "must not be empty"));
        }
        Some(_) => return Err(invalid(at, "instructions", "must be a string")),
    };
    Ok(CompactEdit {
        trigger_tokens,
        pause_after_compaction,
        instructions,
    })
}

/// An amount such as `{"type": "input_tokens", "value": 30000}` at `field` of `edit`:
/// its unit (one of `units`) and its value, at least `least`.
fn amount(
    edit: &Map<String, Value>,
    at: &str,
    field: &str,
    units: &[&str],
    least: u64,
) -> Result<Option<(String, u64)>, BodyError> {
    let Some(value) = present(edit, field) else {
        return Ok(None);
    };
    let shape = format!(
        "must be an object {{\"type\": {}, \"value\": N}}",
        units
            .iter()
            .map(|unit| format!("\"{unit}\""))
            .collect::<Vec<_>>()
            .join(" or ")
    );
    let Value::Object(amount) = value else {
        return Err(invalid(at, field, &shape));
    };
    let at = format!("{at}.{field}");
    known_keys(amount, &at, &["type", "value"])?;
    let unit = match amount.get("type") {
        Some(Value::String(unit)) if units.contains(&unit.as_str()) => unit.clone(),
        Some(Value::String(unit)) => {
            return Err(invalid(
                &at,
                "type",
                &format!("`{unit}` is not a unit here (give {})", units.join(" or ")),
            ));
        }
        Some(_) => return Err(invalid(&at, "type", "must be a string")),
        None => return Err(invalid(&at, "type", "missing")),
    };
    let value = match amount.get("value") {
        Some(value) => value
            .as_u64()
            .filter(|value| *value >= least)
            .ok_or_else(|| {
                invalid(
                    &at,
                    "value",
                    &format!("must be a whole number of at least {least}"),
                )
            })?,
        None => return Err(invalid(&at, "value", "missing")),
    };
    Ok(Some((unit, value)))
}

/// A list of tool names.
fn tool_names(value: &Value, at: &str) -> Result<Vec<String>, BodyError> {
    let Value::Array(names) = value else {
        return Err(BodyError::new(
            at,
            format!("{at}: must be an array of tool names"),
        ));
    };
    names
        .iter()
        .enumerate()
        .map(|(index, name)| match name {
            Value::String(name) if !name.trim().is_empty() => Ok(name.clone()),
            _ => Err(BodyError::new(
                &format!("{at}[{index}]"),
                format!("{at}[{index}]: must be a tool's name"),
            )),
        })
        .collect()
}

/// Refuses a key of `object` not among `known`, naming it.
fn known_keys(object: &Map<String, Value>, at: &str, known: &[&str]) -> Result<(), BodyError> {
    match object.keys().find(|key| !known.contains(&key.as_str())) {
        Some(key) => Err(BodyError::new(
            &format!("{at}.{key}"),
            format!("{at}.{key}: unknown field (known: {})", known.join(", ")),
        )),
        None => Ok(()),
    }
}

/// The error of `field` of the edit at `at`.
fn invalid(at: &str, field: &str, problem: &str) -> BodyError {
    BodyError::new(&format!("{at}.{field}"), format!("{at}.{field}: {problem}"))
}

/// A count as a `usize`, saturating (a count past the address space keeps everything).
fn to_usize(value: u64) -> usize {
    usize::try_from(value).unwrap_or(usize::MAX)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn read(management: Value) -> Result<Option<ContextEdits>, BodyError> {
        let body = json!({ "context_management": management });
        read_context_management(body.as_object().unwrap())
    }

    #[test]
    fn an_edit_of_each_type_with_anthropics_defaults() {
        let edits = read(json!({"edits": [
            {"type": CLEAR_THINKING},
            {"type": CLEAR_TOOL_USES},
            {"type": COMPACT},
        ]}))
        .unwrap()
        .unwrap();
        assert_eq!(
            edits.clear_tool_uses,
            Some(ClearPolicy::past_tokens(DEFAULT_CLEAR_TRIGGER))
        );
        assert_eq!(
            edits.clear_thinking,
            Some(Some(ThinkingPolicy { keep_turns: 1 }))
        );
        assert_eq!(
            edits.compact,
            Some(CompactEdit {
                trigger_tokens: DEFAULT_COMPACT_TRIGGER,
                pause_after_compaction: false,
                instructions: None,
            })
        );
    }

    #[test]
    fn every_setting_is_read() {
        let edits = read(json!({"edits": [
            {"type": CLEAR_THINKING, "keep": "all"},
            {"type": CLEAR_TOOL_USES,
             "trigger": {"type": "tool_uses", "value": 6},
             "keep": {"type": "tool_uses", "value": 2},
             "clear_at_least": {"type": "input_tokens", "value": 500},
             "exclude_tools": ["memory"],
             "clear_tool_inputs": ["search"]},
            {"type": COMPACT, "trigger": {"type": "input_tokens", "value": 9000},
             "pause_after_compaction": true, "instructions": "Keep the numbers."},
        ]}))
        .unwrap()
        .unwrap();
        assert_eq!(edits.clear_thinking, Some(None));
        let clear = edits.clear_tool_uses.unwrap();
        assert_eq!(
            clear,
            ClearPolicy {
                trigger_tokens: None,
                trigger_tool_uses: Some(6),
                keep: 2,
                clear_at_least: None,
                min_cleared: Some(500),
                exclude_tools: vec!["memory".into()],
                clear_inputs: ClearInputs::Tools(vec!["search".into()]),
            }
        );
        assert!(clear.problems().is_empty());
        let compact = edits.compact.unwrap();
        assert_eq!(compact.trigger_tokens, 9000);
        assert!(compact.pause_after_compaction);
        assert_eq!(compact.instructions.as_deref(), Some("Keep the numbers."));
        let thinking = read(json!({"edits": [{"type": CLEAR_THINKING, "keep": {"type": "thinking_turns", "value": 3}}]}))
            .unwrap()
            .unwrap();
        assert_eq!(
            thinking.clear_thinking,
            Some(Some(ThinkingPolicy { keep_turns: 3 }))
        );
        assert_eq!(read(Value::Null).unwrap(), None);
        assert_eq!(read(json!({})).unwrap(), Some(ContextEdits::default()));
    }

    #[test]
    fn a_wrong_edit_is_refused_naming_its_field() {
        let cases = [
            (json!([]), "context_management"),
            (json!({"edits": {}}), "context_management.edits"),
            (json!({"edits": [], "extra": 1}), "context_management.extra"),
            (json!({"edits": [1]}), "context_management.edits[0]"),
            (json!({"edits": [{}]}), "context_management.edits[0].type"),
            (
                json!({"edits": [{"type": "clear_everything"}]}),
                "context_management.edits[0].type",
            ),
            (
                json!({"edits": [{"type": CLEAR_TOOL_USES}, {"type": CLEAR_TOOL_USES}]}),
                "context_management.edits[1].type",
            ),
            (
                json!({"edits": [{"type": CLEAR_TOOL_USES}, {"type": CLEAR_THINKING}]}),
                "context_management.edits[1].type",
            ),
            (
                json!({"edits": [{"type": CLEAR_TOOL_USES, "trigger": 5}]}),
                "context_management.edits[0].trigger",
            ),
            (
                json!({"edits": [{"type": CLEAR_TOOL_USES, "trigger": {"type": "messages", "value": 5}}]}),
                "context_management.edits[0].trigger.type",
            ),
            (
                json!({"edits": [{"type": CLEAR_TOOL_USES, "trigger": {"type": "input_tokens", "value": 0}}]}),
                "context_management.edits[0].trigger.value",
            ),
            (
                json!({"edits": [{"type": CLEAR_TOOL_USES, "keep": {"type": "tool_uses", "value": -1}}]}),
                "context_management.edits[0].keep.value",
            ),
            (
                json!({"edits": [{"type": CLEAR_TOOL_USES, "keep": {"type": "tool_uses"}}]}),
                "context_management.edits[0].keep.value",
            ),
            (
                json!({"edits": [{"type": CLEAR_TOOL_USES, "exclude_tools": ["ok", 3]}]}),
                "context_management.edits[0].exclude_tools[1]",
            ),
            (
                json!({"edits": [{"type": CLEAR_TOOL_USES, "clear_tool_inputs": "yes"}]}),
                "context_management.edits[0].clear_tool_inputs",
            ),
            (
                json!({"edits": [{"type": CLEAR_TOOL_USES, "keep_last": 3}]}),
                "context_management.edits[0].keep_last",
            ),
            (
                json!({"edits": [{"type": CLEAR_THINKING, "keep": "some"}]}),
                "context_management.edits[0].keep",
            ),
            (
                json!({"edits": [{"type": CLEAR_THINKING, "keep": {"type": "thinking_turns", "value": 0}}]}),
                "context_management.edits[0].keep.value",
            ),
            (
                json!({"edits": [{"type": COMPACT, "pause_after_compaction": "no"}]}),
                "context_management.edits[0].pause_after_compaction",
            ),
            (
                json!({"edits": [{"type": COMPACT, "instructions": " "}]}),
                "context_management.edits[0].instructions",
            ),
        ];
        for (management, field) in cases {
            let error = read(management.clone()).unwrap_err();
            assert_eq!(error.field, field, "{management}: {}", error.message);
            assert!(
                error.message.starts_with(field),
                "{management}: {}",
                error.message
            );
        }
    }

    fn texts(messages: &[Message]) -> Vec<(Role, String)> {
        messages
            .iter()
            .map(|message| (message.role, message.text()))
            .collect()
    }

    #[test]
    fn a_compaction_block_sent_back_stands_for_what_it_covered() {
        let summary = vec![
            Message::user("Audit the parser."),
            Message::user("Summary: files 1 to 9 read, nothing unsafe."),
        ];
        let block = compaction_block(&summary, 2);
        assert_eq!(
            block["content"],
            "Audit the parser.\n\nSummary: files 1 to 9 read, nothing unsafe."
        );
        // The client's history: what the compacted request held, then the answer with the
        // block first, then its next question.
        let body = json!({"system": "Be careful.", "messages": [
            {"role": "user", "content": "Audit the parser."},
            {"role": "assistant", "content": "Reading."},
            {"role": "user", "content": "Go on with file 10."},
            {"role": "assistant", "content": "File 10 read."},
            {"role": "user", "content": "And file 11?"},
            {"role": "assistant", "content": [block, {"type": "text", "text": "File 11 is safe."}]},
            {"role": "user", "content": "Thanks. Report."}]});
        let messages = crate::format::anthropic::parse_request(&body).unwrap();
        let resumed = resume_after_compaction(messages);
        assert_eq!(
            texts(&resumed),
            vec![
                (Role::System, "Be careful.".to_owned()),
                (
                    Role::User,
                    "Audit the parser.\n\nSummary: files 1 to 9 read, nothing unsafe.".to_owned()
                ),
                (Role::Assistant, "File 10 read.".to_owned()),
                (Role::User, "And file 11?".to_owned()),
                (Role::Assistant, "File 11 is safe.".to_owned()),
                (Role::User, "Thanks. Report.".to_owned()),
            ]
        );
    }

    /// The block of a compaction that kept `kept` messages, with `summary`, then `text`.
    fn answer(summary: &str, kept: usize, text: &str) -> Value {
        json!({"role": "assistant", "content": [
            compaction_block(&[Message::user(summary)], kept), {"type": "text", "text": text}]})
    }

    /// `history` (Anthropic messages) read and resumed, as (role, text) pairs.
    fn resumed(history: Vec<Value>) -> Vec<(Role, String)> {
        let messages =
            crate::format::anthropic::parse_request(&json!({ "messages": history })).unwrap();
        texts(&resume_after_compaction(messages))
    }

    fn user(text: &str) -> Value {
        json!({"role": "user", "content": text})
    }

    fn assistant(text: &str) -> Value {
        json!({"role": "assistant", "content": text})
    }

    fn said(pairs: &[(Role, &str)]) -> Vec<(Role, String)> {
        pairs
            .iter()
            .map(|(role, text)| (*role, (*text).to_owned()))
            .collect()
    }

    #[test]
    fn the_messages_a_later_compaction_kept_are_read_after_the_earlier_block() {
        use Role::{Assistant as A, User as U};
        // First: [u0 a0 u1 a1 u2] compacted keeping [a1 u2], answered a2 with block 1.
        // Second: resumed [S1 a1 u2 a2 u3] compacted keeping `kept`, answered a3 with block 2.
        let history = |kept: usize| {
            vec![
                user("u0"),
                assistant("a0"),
                user("u1"),
                assistant("a1"),
                user("u2"),
                answer("S1", 2, "a2"),
                user("u3"),
                answer("S2", kept, "a3"),
                user("u4"),
            ]
        };
        assert_eq!(
            resumed(history(2)),
            said(&[(U, "S2"), (A, "a2"), (U, "u3"), (A, "a3"), (U, "u4")])
        );
        assert_eq!(
            resumed(history(3)),
            said(&[
                (U, "S2"),
                (U, "u2"),
                (A, "a2"),
                (U, "u3"),
                (A, "a3"),
                (U, "u4")
            ])
        );
        // Keeping all five: the first summary is among them, before what it kept.
        assert_eq!(
            resumed(history(5)),
            said(&[
                (U, "S2"),
                (U, "S1"),
                (A, "a1"),
                (U, "u2"),
                (A, "a2"),
                (U, "u3"),
                (A, "a3"),
                (U, "u4")
            ])
        );
        // More than there were: the same.
        assert_eq!(resumed(history(50)), resumed(history(5)));
    }

    #[test]
    fn a_paused_compaction_before_a_later_one_leaves_no_message_out() {
        use Role::{Assistant as A, User as U};
        // Paused: [u0 a0 u1 a1 u2] compacted keeping [a1 u2], answered with block 1 alone;
        // the client went on: a3 (its answer), u3. Resumed [S1 a1 u2 a3 u3] compacted keeping
        // three: [u2 a3 u3].
        let paused = json!({"role": "assistant", "content": [
            compaction_block(&[Message::user("S1")], 2)]});
        let history = vec![
            user("u0"),
            assistant("a0"),
            user("u1"),
            assistant("a1"),
            user("u2"),
            paused,
            assistant("a3"),
            user("u3"),
            answer("S2", 3, "a4"),
            user("u4"),
        ];
        assert_eq!(
            resumed(history),
            said(&[
                (U, "S2"),
                (U, "u2"),
                (A, "a3"),
                (U, "u3"),
                (A, "a4"),
                (U, "u4")
            ])
        );
    }

    #[test]
    fn a_failed_compaction_block_is_only_taken_out_and_no_block_changes_nothing() {
        let body = json!({"messages": [
            {"role": "user", "content": "Hi"},
            {"role": "assistant", "content": [{"type": "compaction", "content": null},
                                              {"type": "text", "text": "Hello."}]},
            {"role": "user", "content": "Bye"}]});
        let messages = crate::format::anthropic::parse_request(&body).unwrap();
        let resumed = resume_after_compaction(messages.clone());
        assert_eq!(
            texts(&resumed),
            vec![
                (Role::User, "Hi".to_owned()),
                (Role::Assistant, "Hello.".to_owned()),
                (Role::User, "Bye".to_owned()),
            ]
        );
        let plain = crate::format::anthropic::parse_request(&json!({"messages": [
            {"role": "user", "content": "Hi"}]}))
        .unwrap();
        assert_eq!(resume_after_compaction(plain.clone()), plain);
        // A block whose count of kept messages is more than there were keeps them all, and
        // a pause (the block alone) leaves no empty turn behind.
        let body = json!({"messages": [
            {"role": "user", "content": "Hi"},
            {"role": "assistant", "content": [compaction_block(&[Message::user("S")], 99)]},
            {"role": "user", "content": "Go on"}]});
        let resumed =
            resume_after_compaction(crate::format::anthropic::parse_request(&body).unwrap());
        assert_eq!(
            texts(&resumed),
            vec![
                (Role::User, "S".to_owned()),
                (Role::User, "Hi".to_owned()),
                (Role::User, "Go on".to_owned()),
            ]
        );
    }

    #[test]
    fn applied_edits_list_what_changed_the_request() {
        let edits = ContextEdits {
            clear_tool_uses: Some(ClearPolicy::past_tokens(10)),
            clear_thinking: Some(Some(ThinkingPolicy { keep_turns: 1 })),
            compact: None,
        };
        let cleared = vec![
            ClearedResult {
                index: 2,
                tool_call_id: "c1".into(),
                tool: "search".into(),
                tokens: 120,
            },
            ClearedResult {
                index: 5,
                tool_call_id: "c2".into(),
                tool: "search".into(),
                tokens: 80,
            },
        ];
        let thinking = ClearedThinking {
            turns: 2,
            tokens: 40,
        };
        assert_eq!(
            applied_edits(&edits, &cleared, Some(&thinking)),
            vec![
                json!({"type": CLEAR_THINKING, "cleared_thinking_turns": 2, "cleared_input_tokens": 40}),
                json!({"type": CLEAR_TOOL_USES, "cleared_tool_uses": 2, "cleared_input_tokens": 200}),
            ]
        );
        assert_eq!(applied_edits(&edits, &[], None), Vec::<Value>::new());
        // Clearing a policy did is not an edit the request asked for.
        assert_eq!(
            applied_edits(&ContextEdits::default(), &cleared, Some(&thinking)),
            Vec::<Value>::new()
        );
    }
}
