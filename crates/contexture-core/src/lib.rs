//! Contexture's engine core: messages, token counting, the model registry, request budgets,
//! fitting a history into a window, thread events and projections, and the workflow context
//! store with its output parsing, templates and expressions.
//!
//! The core is pure and synchronous. It does no I/O of any kind: no network, no disk, no
//! clock, no async. Time, ids, storage and LLMs reach it through values and traits passed in
//! by the caller, so every function here is deterministic and testable without mocks.

pub mod budget;
pub mod calibration;
pub mod compact;
pub mod context;
pub mod fit;
pub mod format;
pub mod map_only;
pub mod message;
pub mod names;
pub mod registry;
pub mod thread;
pub mod tokens;

pub use message::{
    Content, Message, MessageFields, MessageIdentity, Metadata, Part, Role, ToolCall,
};
pub use tokens::{Encoding, TokenCounter};
