//! One module per command group.

pub mod input;
pub mod models;
pub mod tokens;
