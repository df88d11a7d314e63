//! The crate's integration tests as one test binary: each module is one file of tests
//! (linking a binary per file took most of a clean build's time). Tests that measure this
//! process's memory have binaries of their own: `context_limits`.

mod compact_props;
mod context_api;
mod context_data;
mod context_pylit_prop;
mod fit_props;
mod fit_table;
mod format_errors;
mod format_proptest;
mod format_responses;
mod format_roundtrip;
mod loop_props;
mod prompt_templates;
mod thread_log;
mod thread_projection_props;
mod tokens_oracle;
