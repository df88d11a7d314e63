//! One module per command group.

pub mod expr;
pub mod fit;
pub mod input;
pub mod models;
pub mod output;
pub mod template;
pub mod thread;
pub mod tokens;
pub mod validate;
