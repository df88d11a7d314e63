//! What the summarizer reads: the covered messages as a transcript, the prompt around it,
//! and, when the transcript is larger than the summarizer's window, the chunks of a
//! map-reduce (split on whole units; a single oversized message cut with a visible marker).

use crate::fit::truncate::keep_head_and_tail;
use crate::fit::units;
use crate::message::{Message, Role};
use crate::tokens::TokenCounter;

/// The default summarizer prompt. `{previous_summary}` becomes the earlier summary (with a
/// line saying to extend it) or nothing; `{transcript}` becomes the messages.
pub const DEFAULT_PROMPT: &str = "\
You are compacting the earlier part of a conversation so that it can go on without it. \
Write a summary another assistant can work from, with these sections:

## Goal
What the user wants to achieve, in their terms.
## Decisions
What was decided or agreed, with the reasons given.
## Facts and identifiers
Names, numbers, ids, file names, paths, URLs, dates and values, copied exactly.
## Open tasks
What was started or asked for and is not finished.
## Next steps
What should happen next.

Be concise. Do not invent anything; leave a section empty rather than guess.
{previous_summary}
Conversation to summarize:

{transcript}";

/// The prompt that merges the partial summaries of a map-reduce. `{summaries}` becomes the
/// partial summaries, in order.
pub const MERGE_PROMPT: &str = "\
These are summaries of consecutive parts of one conversation, oldest first. Merge them into \
one summary with the sections Goal, Decisions, Facts and identifiers, Open tasks and Next \
steps. Keep every identifier, number and name exactly; when a later part changes an earlier \
decision or finishes a task, keep the later state. Be concise; do not invent anything.

{summaries}";

/// A summarizer prompt that cannot be used.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("the summarizer prompt must contain {{transcript}}, where the messages go")]
pub struct PromptError;

/// Checks a prompt template.
pub(super) fn check_template(template: &str) -> Result<(), PromptError> {
    if template.contains("{transcript}") {
        Ok(())
    } else {
        Err(PromptError)
    }
}

/// `template` with a caller's `instructions` for one summary after it. Placeholders in
/// the instructions are not filled in: they are the caller's words, not the template's.
pub fn with_instructions(template: &str, instructions: &str) -> String {
    let instructions = instructions
        .replace("{transcript}", "(transcript)")
        .replace("{previous_summary}", "(previous summary)");
    format!("{template}\n\nAdditional instructions for this summary: {instructions}")
}

/// The summarizer's prompt: `template` with the transcript and, for a running summary, the
/// earlier summary to extend.
pub fn summary_prompt(template: &str, transcript: &str, previous_summary: Option<&str>) -> String {
    let previous = match previous_summary {
        Some(summary) => format!(
            "\nThe summary of the conversation before these messages follows. Extend it with \
             the new messages: keep what still holds, update what changed.\n\n{summary}\n"
        ),
        None => String::new(),
    };
    template
        .replace("{previous_summary}", &previous)
        .replace("{transcript}", transcript)
}

/// The prompt merging `summaries` (oldest first).
pub fn merge_prompt(summaries: &[String]) -> String {
    let parts: Vec<String> = summaries
        .iter()
        .enumerate()
        .map(|(n, summary)| format!("Part {}:\n{summary}", n + 1))
        .collect();
    MERGE_PROMPT.replace("{summaries}", &parts.join("\n\n"))
}

/// A short, stable hash of a prompt template, recorded with each compaction (64-bit FNV-1a).
pub fn prompt_hash(template: &str) -> String {
    let mut hash: u64 = 0xcbf2_9ce4_8422_2325;
    for byte in template.bytes() {
        hash ^= u64::from(byte);
        hash = hash.wrapping_mul(0x0100_0000_01b3);
    }
    format!("fnv1a64:{hash:016x}")
}

/// One message as transcript text.
fn line(message: &Message) -> String {
    let text = message.text();
    match message.role {
        Role::User => format!("User: {text}"),
        Role::Tool => format!(
            "Tool result ({}): {text}",
            message.tool_call_id.as_deref().unwrap_or("?")
        ),
        Role::Assistant => {
            let mut out = if text.is_empty() {
                String::from("Assistant:")
            } else {
                format!("Assistant: {text}")
            };
            for call in &message.tool_calls {
                out.push_str(&format!(
                    "\nAssistant called `{}` ({}) with {}",
                    call.name, call.id, call.arguments
                ));
            }
            out
        }
        role => format!("{}: {text}", role.as_str()),
    }
}

/// The messages as one transcript.
pub fn transcript(messages: &[&Message]) -> String {
    messages
        .iter()
        .map(|m| line(m))
        .collect::<Vec<_>>()
        .join("\n\n")
}

/// The transcript split into chunks of at most `limit` tokens each, on whole units (a tool
/// call stays with its results); a unit larger than `limit` on its own is cut, keeping its
/// start and end around a marker that says how many tokens were cut.
pub fn chunk_transcripts(messages: &[&Message], limit: u32, counter: &TokenCounter) -> Vec<String> {
    let owned: Vec<Message> = messages.iter().map(|m| (*m).clone()).collect();
    let mut pieces = Vec::new();
    for unit in units(&owned) {
        let refs: Vec<&Message> = owned[unit.messages()].iter().collect();
        let text = transcript(&refs);
        pieces.push(cut_to_fit(&text, limit, counter));
    }
    let mut chunks: Vec<String> = Vec::new();
    let mut current = String::new();
    for piece in pieces {
        if current.is_empty() {
            current = piece;
            continue;
        }
        let joined = format!("{current}\n\n{piece}");
        if counter.count_text(&joined) <= limit {
            current = joined;
        } else {
            chunks.push(std::mem::replace(&mut current, piece));
        }
    }
    if !current.is_empty() {
        chunks.push(current);
    }
    chunks
}

/// `text` cut to at most `limit` tokens: its start (two thirds of the room) and its end (one
/// third) around a marker naming how many tokens were cut.
pub fn cut_to_fit(text: &str, limit: u32, counter: &TokenCounter) -> String {
    keep_head_and_tail(text, limit, counter, |cut| {
        format!("\n[... {cut} tokens cut to fit the summarizer's window ...]\n")
    })
    .unwrap_or_else(|| text.to_owned())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::message::ToolCall;
    use crate::tokens::Encoding;

    fn counter() -> TokenCounter {
        TokenCounter::Exact {
            encoding: Encoding::O200kBase,
        }
    }

    #[test]
    fn instructions_follow_the_template_and_fill_in_nothing() {
        let prompt = with_instructions(DEFAULT_PROMPT, "Keep every {transcript} number.");
        assert!(check_template(&prompt).is_ok());
        let filled = summary_prompt(&prompt, "user: 42", None);
        assert!(filled.ends_with(
            "user: 42\n\nAdditional instructions for this summary: Keep every (transcript) number."
        ));
        assert_eq!(filled.matches("user: 42").count(), 1);
    }

    #[test]
    fn chunks_fit_and_keep_units_whole() {
        let mut messages = Vec::new();
        for n in 0..30 {
            messages.push(Message::user(format!(
                "Question {n}: {}",
                "what about the data? ".repeat(10)
            )));
            messages.push(Message::assistant_tool_calls(vec![ToolCall::new(
                format!("c{n}"),
                "lookup",
                "{}",
            )]));
            messages.push(Message::tool_result(format!("c{n}"), "result ".repeat(20)));
        }
        let refs: Vec<&Message> = messages.iter().collect();
        let chunks = chunk_transcripts(&refs, 300, &counter());
        assert!(chunks.len() > 3);
        for chunk in &chunks {
            assert!(counter().count_text(chunk) <= 300);
            // A call and its result land in the same chunk.
            for n in 0..30 {
                let call = format!("(c{n}) with");
                let result = format!("Tool result (c{n})");
                assert_eq!(chunk.contains(&call), chunk.contains(&result), "c{n}");
            }
        }
        assert_eq!(chunks.join("\n\n"), transcript(&refs));
    }

    #[test]
    fn an_oversized_message_is_cut_with_a_marker() {
        let text = format!("START {} END", "lorem ipsum dolor ".repeat(500));
        let message = Message::user(text);
        let chunks = chunk_transcripts(&[&message], 200, &counter());
        assert_eq!(chunks.len(), 1);
        let chunk = &chunks[0];
        assert!(
            counter().count_text(chunk) <= 200,
            "{}",
            counter().count_text(chunk)
        );
        assert!(chunk.starts_with("User: START"));
        assert!(chunk.ends_with("END"));
        assert!(chunk.contains("tokens cut to fit the summarizer's window"));
    }

    #[test]
    fn prompts_and_hashes() {
        let prompt = summary_prompt(DEFAULT_PROMPT, "User: hi", Some("Goal: greet"));
        assert!(prompt.contains("Extend it with the new messages"));
        assert!(prompt.ends_with("User: hi"));
        assert!(!summary_prompt(DEFAULT_PROMPT, "x", None).contains("{previous_summary}"));
        assert_eq!(prompt_hash("abc"), prompt_hash("abc"));
        assert_ne!(prompt_hash("abc"), prompt_hash("abd"));
        assert!(check_template("no placeholder").is_err());
        assert!(merge_prompt(&["a".into(), "b".into()]).contains("Part 2:\nb"));
    }
}
