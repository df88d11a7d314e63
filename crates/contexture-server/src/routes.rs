//! The HTTP handlers, by resource.

pub mod chat;
pub mod executions;
pub mod ops;
pub mod threads;
