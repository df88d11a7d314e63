//! The HTTP handlers, by resource.

pub mod chat;
pub mod chat_request;
pub mod conversations;
pub mod executions;
pub mod messages;
pub mod ops;
pub mod responses;
pub mod responses_call;
pub mod responses_compact;
pub mod threads;
pub(crate) mod translation;

/// A fresh id for a thread, an execution or a request the client did not name.
pub(crate) fn fresh_id() -> String {
    contexture_engine::system::new_id(&contexture_engine::system::RandomIds::default())
}
