//! `contexture serve`: Contexture over HTTP, for services in any language.
//!
//! - a REST API for threads and workflow executions, described by `/openapi.json`;
//! - an OpenAI-compatible `/v1/chat/completions` that keeps each thread's history for the
//!   client (fitted to the model's window, compacted by policy) and forwards to an upstream
//!   provider, streaming passed through;
//! - API keys stored hashed and bound to tenants; a tenant never sees another's data (404);
//!   body size limits, a rate limit per key; Prometheus metrics at `/metrics`.
//!
//! Servers hold no state of their own beyond caches: several share one PostgreSQL database
//! (appends stay gap-free; a cancel reaches a run on another server through the database).
//! This crate is the only one that knows HTTP serving; storage, fitting, compaction and runs
//! are the other crates' work.

mod active_runs;
mod app;
mod auth;
mod body;
mod config;
mod error;
mod execution_worker;
mod fit_settings;
mod json_shape;
pub mod mcp;
mod metrics;
mod routes;
mod tenancy;
mod tenant_store;
mod ui;

pub use app::{AppState, Audience, StartError, bind, router, serve, shutdown_signal};
pub use auth::{IssuedKey, hash_key, issue_key};
pub use config::{
    McpEndpointConfig, RegisteredTool, RoutedUpstream, ServerConfig, UpstreamConfig, UpstreamKind,
    redacted_database,
};
pub use routes::chat::chat_request_digest;
pub use tenancy::Tenant;
