//! The inspector's first view: a tenant's threads and executions, newest first, searchable
//! by id.

use contexture_store::{RecentCursor, ThreadInfo};
use serde::Serialize;

use crate::thread::date;

/// One thread or execution of the list.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct ListRow {
    /// What the store says of it.
    pub facts: ThreadInfo,
    /// Whether it is an execution's log.
    pub execution: bool,
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
    pub fn new(query: &str, threads: Vec<ThreadInfo>, more: bool, first_page: bool) -> HomeView {
        let next_before = more
            .then(|| threads.last())
            .flatten()
            .map(|last| RecentCursor::after(last).to_string());
        HomeView {
            query: query.to_owned(),
            rows: threads
                .into_iter()
                .map(|facts| ListRow {
                    updated: date(facts.updated_at_ms),
                    execution: facts.execution,
                    facts,
                })
                .collect(),
            next_before,
            first_page,
        }
    }
}
