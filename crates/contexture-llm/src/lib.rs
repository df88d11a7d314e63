//! LLM providers for Contexture.
//!
//! One [`Provider`] trait, three implementations:
//! - [`OpenAiProvider`]: OpenAI-compatible chat completions (OpenAI, Ollama, vLLM, llama.cpp
//!   server, ...), streaming or not;
//! - [`AnthropicProvider`]: Anthropic's messages API;
//! - [`ScriptedProvider`]: replays replies from a YAML script, for tests and demos.
//!
//! HTTP providers retry 429 and 5xx answers, timeouts and connection failures with
//! exponential backoff, honouring `Retry-After` ([`RetryPolicy`]); every call returns the
//! provider-reported [`Usage`]. API keys are never logged: the providers' `Debug` output
//! redacts them.
//!
//! [`passthrough`] forwards chat calls to an upstream provider (OpenAI-compatible or
//! Anthropic's), returning its response unchanged (streams chunk by chunk), for a server that
//! proxies them, and folds the upstream's answer into the assistant's message
//! ([`AnswerAccumulator`]). [`wire`] writes a wire-neutral call ([`ChatCall`]) in the
//! upstream's format, whatever format its client spoke. [`Upstreams`] picks the upstream of
//! a call by its model.

mod anthropic;
mod error;
mod http;
mod openai;
pub mod passthrough;
mod provider;
mod retry;
mod scripted;
mod sse;
mod upstreams;
pub mod wire;

pub use anthropic::AnthropicProvider;
pub use error::{LlmError, SCRIPT_EXHAUSTED};
pub use openai::OpenAiProvider;
pub use passthrough::{
    Answer, AnswerAccumulator, ChatUpstream, Passthrough, PassthroughError, UpstreamBody,
    UpstreamCall, UpstreamConfig, UpstreamResponse, UpstreamStream, record_stream,
};
pub use provider::{BoxFuture, ChatRequest, ChatResponse, Provider, StreamDelta, Usage};
pub use retry::RetryPolicy;
pub use scripted::{ScriptError, ScriptedProvider};
pub use upstreams::{ModelList, ModelListError, ModelListShape, PatternError, Upstreams};
pub use wire::{ChatCall, ClientFormat, ClientRequest, RequestBody, WireFormat};
