//! One module per command group.

pub mod input;
pub mod models;
pub mod thread;
pub mod tokens;
