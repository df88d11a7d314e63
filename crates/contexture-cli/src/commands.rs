//! One module per command group.

pub mod cancel;
pub mod expr;
pub mod fit;
pub mod input;
pub mod inspect;
pub mod keys;
pub mod llm;
pub mod mcp;
pub mod message_array;
pub mod models;
pub mod output;
pub mod run;
pub mod runtime;
pub mod serve;
pub mod store_args;
pub mod template;
pub mod template_worker;
pub mod thread;
pub mod tokens;
pub mod validate;
