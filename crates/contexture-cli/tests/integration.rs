//! The crate's integration tests as one test binary: each module is one file of tests
//! (linking a binary per file took most of a clean build's time).

mod common;
mod compact_cli;
mod context_cli;
mod fit_cli;
mod inspector_browser;
mod mcp_door;
mod real_model;
mod run_cli;
mod scale_out;
mod serve_agents_sdk;
mod serve_anthropic_sdk;
mod serve_anthropic_tool_loop;
mod serve_openai_sdk_anthropic_upstream;
mod serve_responses_sdk;
mod serve_schemathesis;
mod serve_sdk;
mod serve_secrets;
mod thread_cli;
mod tokens_cli;
