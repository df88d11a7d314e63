//! YAML workflows: assistants, tools, states and transitions, loaded with
//! `yaml_serde` and validated before anything runs.
//!
//! ```yaml
//! assistants:
//!   - id: data-fetcher
//!     model: gpt-4o-mini
//!     system_prompt: You fetch user records.
//!     tools: [db-query]
//! tools:
//!   - id: db-query
//!     arguments: {sql: "SELECT * FROM users WHERE id = {{user_id}}"}
//! states:
//!   - id: fetch-user-data
//!     assistant_id: data-fetcher
//!     task: 'Fetch user profile for user ID {{user_id}}'
//!     next:
//!       state_id: process-user
//!       store_in_context: true
//!   - id: process-user
//!     assistant_id: data-fetcher
//!     task: 'Welcome {{name}}'
//!     next:
//!       condition:
//!         expression: "role == 'admin'"
//!         then: end
//!         otherwise: end
//! ```
//!
//! Every error names the file, line and column of the offending node
//! ([`WorkflowError`]); validation collects every problem rather than stopping at the first.
//!
//! The model (the types a file deserializes into) and loading (parsing, validating, placing
//! problems in the file) are separate submodules, as are the checks, node positions and
//! host permissions loading uses; every public item is re-exported here.

mod host;
mod load;
mod mcp;
mod model;
mod prompt_text;
mod spans;
mod validate;

pub use host::{Programs, WorkflowOrigin, program_declarations, program_refusals};
pub use load::{Diagnostic, WorkflowError};
pub use mcp::{
    DEFAULT_MCP_CALL_TIMEOUT, DEFAULT_MCP_START_TIMEOUT, MAX_MCP_SERVER_NAME, McpServer,
    McpServerConfig, McpServerUse,
};
pub use model::{
    Assistant, ConversationPolicy, END, ForkSettings, MAX_ITEM_CONCURRENCY, Next, State, StepKind,
    SubInput, SubResult, Tool, Workflow, WorkflowRef,
};
pub use prompt_text::PromptText;
pub use spans::Position;
