//! The crate's integration tests as one test binary: each module is one file of tests
//! (linking a binary per file took most of a clean build's time).

mod anthropic_upstream;
mod http_providers;
mod passthrough;
