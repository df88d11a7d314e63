//! The crate's integration tests as one test binary: each module is one file of tests
//! (linking a binary per file took most of a clean build's time). Tests that measure this
//! process's memory have binaries of their own: `trust`, `bounded_responses`.

mod api;
mod architecture;
mod chat;
mod common;
mod context_editing;
mod doors;
mod executions;
mod hostile;
mod inspector_page;
mod messages;
mod request_records;
mod responses;
mod responses_turns;
mod retention;
mod storage;
mod tenancy;
mod thread_policy;
mod turns;
mod upstream_bounds;
mod upstream_routes;
