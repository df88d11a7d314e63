//! The inspector's first view: a tenant's threads and executions, newest first, searchable
//! by id.

use serde::Serialize;

use crate::thread::{ThreadFacts, date};

/// One thread or execution of the list.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct ListRow {
    /// What the store says of it.
    pub facts: ThreadFacts,
    /// When it was last appended to, as a date.
    pub updated: String,
}

/// The list, a page at a time.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct HomeView {
    /// The text searched for in ids (empty: every one).
    pub query: String,
    /// The page's threads, newest first.
    pub rows: Vec<ListRow>,
    /// Where the next (older) page starts, as the view's `before` parameter.
    pub next_before: Option<String>,
    /// Whether the page is the first (the newest).
    pub first_page: bool,
}

impl HomeView {
    /// The view of a page of threads (newest first); `more` when older ones follow.
    pub fn new(query: &str, threads: Vec<ThreadFacts>, more: bool, first_page: bool) -> HomeView {
        let next_before = more
            .then(|| threads.last())
            .flatten()
            .map(|last| cursor_text(last.updated_at_ms, &last.id));
        HomeView {
            query: query.to_owned(),
            rows: threads
                .into_iter()
                .map(|facts| ListRow {
                    updated: date(facts.updated_at_ms),
                    facts,
                })
                .collect(),
            next_before,
            first_page,
        }
    }
}

/// A place in the list as the view's `before` parameter: `MILLISECONDS:ID`.
pub fn cursor_text(updated_at_ms: i64, id: &str) -> String {
    format!("{updated_at_ms}:{id}")
}

/// The place a `before` parameter names (see [`cursor_text`]); `None` when it is not one.
pub fn parse_cursor(text: &str) -> Option<(i64, String)> {
    let (ms, id) = text.split_once(':')?;
    Some((ms.parse().ok()?, id.to_owned()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cursors_read_back_ids_that_hold_colons() {
        let text = cursor_text(1_764_000_000_000, "conversation:alice:support");
        assert_eq!(
            parse_cursor(&text),
            Some((1_764_000_000_000, "conversation:alice:support".to_owned()))
        );
        for bad in ["", "12", "x:id", ":id"] {
            assert_eq!(parse_cursor(bad), None, "{bad}");
        }
    }
}
