//! The offline summarizer: no model, no network. It keeps what a summary most often needs
//! verbatim (the first user request, the identifiers, numbers and file names, and the last
//! line of each turn) within a token budget, dropping the oldest turns first.

use std::collections::HashSet;

use crate::message::{Message, Role};
use crate::tokens::TokenCounter;

/// How much of the first request and of each turn's last line is kept, in characters.
const REQUEST_CHARS: usize = 600;
const LINE_CHARS: usize = 240;

/// An extractive summary of `messages` of at most `budget` tokens.
pub fn extractive_summary(messages: &[&Message], budget: u32, counter: &TokenCounter) -> String {
    let heading =
        "(extractive summary: the first request, identifiers and the last line of each turn)";
    let request = messages
        .iter()
        .find(|m| m.role == Role::User)
        .map(|m| format!("First request: {}", clip(&m.text(), REQUEST_CHARS)));
    let mut facts: Vec<String> = Vec::new();
    let mut seen = HashSet::new();
    for message in messages {
        for id in identifiers(&message.text()) {
            if seen.insert(id.clone()) {
                facts.push(id);
            }
        }
        for call in &message.tool_calls {
            for id in std::iter::once(call.name.to_string()).chain(identifiers(&call.arguments)) {
                if seen.insert(id.clone()) {
                    facts.push(id);
                }
            }
        }
    }
    let turns: Vec<String> = messages
        .iter()
        .filter_map(|m| {
            let last = m
                .text()
                .lines()
                .rev()
                .find(|l| !l.trim().is_empty())
                .map(|l| clip(l.trim(), LINE_CHARS));
            let calls: Vec<&str> = m.tool_calls.iter().map(|c| &*c.name).collect();
            match (last, calls.is_empty()) {
                (Some(line), true) => Some(format!("- {}: {line}", m.role.as_str())),
                (Some(line), false) => Some(format!(
                    "- {}: {line} (called {})",
                    m.role.as_str(),
                    calls.join(", ")
                )),
                (None, false) => Some(format!(
                    "- {}: called {}",
                    m.role.as_str(),
                    calls.join(", ")
                )),
                (None, true) => None,
            }
        })
        .collect();

    // Fill the budget: heading and request first, then as many identifiers as fit, then
    // the most recent turns that fit (shown oldest first).
    let fits = |text: &str| counter.count_text(text) <= budget;
    let mut summary = heading.to_owned();
    if let Some(request) = request {
        let with = format!("{summary}\n{request}");
        if fits(&with) {
            summary = with;
        }
    }
    // Identifiers take at most two fifths of what is left, so the turns get room too.
    let used = counter.count_text(&summary);
    let facts_budget = used + budget.saturating_sub(used) * 2 / 5;
    let mut kept_facts = Vec::new();
    for fact in &facts {
        kept_facts.push(fact.as_str());
        let with = format!("{summary}\nIdentifiers: {}", kept_facts.join(", "));
        if counter.count_text(&with) > facts_budget {
            kept_facts.pop();
            break;
        }
    }
    if !kept_facts.is_empty() {
        summary = format!("{summary}\nIdentifiers: {}", kept_facts.join(", "));
    }
    let mut kept_turns: Vec<&str> = Vec::new();
    for turn in turns.iter().rev() {
        kept_turns.insert(0, turn);
        let with = format!("{summary}\nTurns:\n{}", kept_turns.join("\n"));
        if !fits(&with) {
            kept_turns.remove(0);
            break;
        }
    }
    if !kept_turns.is_empty() {
        let omitted = turns.len() - kept_turns.len();
        let note = if omitted > 0 {
            format!(" ({omitted} earlier turns omitted)")
        } else {
            String::new()
        };
        let with = format!("{summary}\nTurns{note}:\n{}", kept_turns.join("\n"));
        if fits(&with) {
            summary = with;
        } else {
            summary = format!("{summary}\nTurns:\n{}", kept_turns.join("\n"));
        }
    }
    summary
}

/// The identifiers, numbers, file names, paths and URLs in `text`, in order of appearance:
/// words with a digit (`420`, `T-1042`, `v2.4`, `2024-05-06`; not bare numbers under 100), with a path separator or a file
/// extension (`src/main.rs`, `report.pdf`), with an underscore or an inner capital
/// (`user_id`, `getUser`), or in capitals (`ACME`).
pub fn identifiers(text: &str) -> Vec<String> {
    let mut found = Vec::new();
    for raw in text.split(|c: char| {
        c.is_whitespace()
            || matches!(
                c,
                ',' | ';' | '(' | ')' | '[' | ']' | '{' | '}' | '"' | '\'' | '<' | '>' | '`' | '|'
            )
    }) {
        let word = raw.trim_matches(|c: char| matches!(c, '.' | ':' | '!' | '?' | '*'));
        if word.chars().count() < 2 || !word.chars().any(char::is_alphanumeric) {
            continue;
        }
        // Short bare numbers ("step 3", "12 items") are too common to be worth keeping.
        let short_number = word.len() < 3 && word.chars().all(|c| c.is_ascii_digit());
        if is_identifier(word) && !short_number {
            found.push(word.to_owned());
        }
    }
    found
}

fn is_identifier(word: &str) -> bool {
    let has_digit = word.chars().any(|c| c.is_ascii_digit());
    let path = word.contains('/') || word.contains('\\');
    let extension = word.rsplit_once('.').is_some_and(|(stem, ext)| {
        !stem.is_empty()
            && (1..=5).contains(&ext.len())
            && ext.chars().all(|c| c.is_ascii_alphanumeric())
            && ext.chars().any(|c| c.is_ascii_alphabetic())
    });
    let underscore = word.contains('_');
    let chars: Vec<char> = word.chars().collect();
    let inner_capital = chars
        .windows(2)
        .any(|w| w[0].is_lowercase() && w[1].is_uppercase());
    let capitals = chars.len() >= 2
        && chars
            .iter()
            .all(|c| c.is_uppercase() || c.is_ascii_digit() || *c == '-')
        && chars.iter().filter(|c| c.is_uppercase()).count() >= 2;
    has_digit || path || extension || underscore || inner_capital || capitals
}

fn clip(text: &str, chars: usize) -> String {
    if text.chars().count() <= chars {
        text.to_owned()
    } else {
        let kept: String = text.chars().take(chars).collect();
        format!("{kept}...")
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::message::ToolCall;
    use crate::tokens::Encoding;

    #[test]
    fn identifiers_are_found_and_plain_words_are_not() {
        let text = "Deploy v2.4 of ACME's api to eu-west-1: see src/deploy.rs, report.pdf \
                    and ticket T-1042 (user_id 12345, getUser). It costs $3.50 today.";
        assert_eq!(
            identifiers(text),
            [
                "v2.4",
                "ACME",
                "eu-west-1",
                "src/deploy.rs",
                "report.pdf",
                "T-1042",
                "user_id",
                "12345",
                "getUser",
                "$3.50"
            ]
        );
    }

    #[test]
    fn the_summary_keeps_the_request_ids_and_recent_turns_within_budget() {
        let counter = TokenCounter::Exact {
            encoding: Encoding::O200kBase,
        };
        let mut messages = vec![Message::user(
            "Migrate the billing service to Postgres 16; the cutover is on 2026-12-01.",
        )];
        for n in 0..40 {
            messages.push(Message::assistant(format!(
                "Step {n} done.\nMigrated table invoice_{n}."
            )));
        }
        messages.push(Message::assistant_tool_calls(vec![ToolCall::new(
            "c1",
            "run_sql",
            r#"{"query": "SELECT count(*) FROM invoices_2026"}"#,
        )]));
        let refs: Vec<&Message> = messages.iter().collect();
        let summary = extractive_summary(&refs, 300, &counter);
        assert!(counter.count_text(&summary) <= 300, "{summary}");
        assert!(summary.contains("First request: Migrate the billing service to Postgres 16"));
        assert!(summary.contains("2026-12-01"));
        assert!(summary.contains("- assistant: called run_sql"), "{summary}");
        assert!(summary.contains("earlier turns omitted"), "{summary}");
        assert!(
            !summary.contains("invoice_0."),
            "the oldest turns go first: {summary}"
        );
    }
}
