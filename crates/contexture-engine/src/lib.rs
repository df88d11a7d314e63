//! Contexture's workflow engine.
//!
//! - [`workflow`]: YAML workflows and their validation, with file, line and column in every
//!   error;
//! - [`executor`]: runs a workflow against a [`contexture_store::Store`] and LLM providers,
//!   recording every step and request in the execution's thread, and resumes from that log;
//! - [`fitting`]: the one way a request is fitted to a model's window (a step's, a chat
//!   turn's, a thread read for a model);
//! - [`chat`]: a stateful chat turn (new messages stored, compaction, fitting, the request
//!   and its end recorded) and the retry of a keyed turn;
//! - [`turns`]: turns on one thread one at a time, in arrival order, across servers;
//! - [`compaction`]: summarizing the older part of a thread into one recorded replace;
//! - [`cpu`]: CPU work (fitting) on a bounded pool of blocking threads, a share per tenant;
//! - [`conversation`]: history carried across runs that name one conversation;
//! - [`threads`]: thread operations a caller asks for by name (create, fork, merge, restore);
//! - [`sources`]: where sub-workflows are read from;
//! - [`llm`]: which provider answers each assistant (`scripted:FILE`, `openai:MODEL`, ...);
//! - [`tools`]: tool implementations (programs, fixed answers, registered tools);
//! - [`hooks`]: caller code around steps and LLM calls;
//! - [`report`]: an execution's steps, calls and totals, read from its log;
//! - [`system`]: the real clock, ids and machine variables for templates.

mod calls;
pub mod chat;
pub mod chat_service;
pub mod compaction;
pub mod conversation;
pub mod cpu;
pub mod estimates;
pub mod executor;
pub mod fit_report;
pub mod fitting;
pub mod hooks;
pub mod in_flight;
pub mod keyed_turns;
pub mod llm;
mod mcp;
mod per_key;
pub mod render_workers;
pub mod report;
pub mod sources;
pub mod system;
pub mod tenant_slots;
pub mod threads;
pub mod tools;
pub mod turns;
pub mod workflow;
