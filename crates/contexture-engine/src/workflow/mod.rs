//! YAML workflows (PRODUCT.md F20): assistants, tools, states and transitions, loaded with
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

mod spans;
mod validate;

use std::collections::BTreeMap;

use contexture_core::context::{Branch, ClearContextStore, Switch, TransitionFlags};
use serde::{Deserialize, Serialize};
use serde_json::Value;

pub use spans::Position;

/// The target name that ends a workflow.
pub const END: &str = "end";

/// A whole workflow file.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Workflow {
    /// An optional display name.
    #[serde(default)]
    pub name: Option<String>,
    /// The assistants (LLM configurations) states may use.
    #[serde(default)]
    pub assistants: Vec<Assistant>,
    /// The tools states and assistants may use.
    #[serde(default)]
    pub tools: Vec<Tool>,
    /// The states; the first one runs first.
    pub states: Vec<State>,
}

/// An LLM configuration.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Assistant {
    /// Its id, unique among assistants.
    pub id: String,
    /// The model id (resolved through the model registry).
    pub model: String,
    /// The system prompt (a template over the context store).
    #[serde(default)]
    pub system_prompt: Option<String>,
    /// Ids of the tools it may call.
    #[serde(default)]
    pub tools: Vec<String>,
    /// How its requests are fitted to the model's window.
    #[serde(default)]
    pub context: ContextPolicy,
}

/// How an assistant's requests are fitted to its model's window.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct ContextPolicy {
    /// Which messages trimming keeps: `last`, `first` or `head_tail`.
    pub strategy: String,
    /// Tokens reserved for the reply; default: the model's output limit, at most a quarter
    /// of the window.
    pub reserve: Option<u32>,
    /// The share of the window a request may use, in (0, 1].
    pub budget_ratio: f64,
}

impl Default for ContextPolicy {
    fn default() -> Self {
        ContextPolicy {
            strategy: "last".to_owned(),
            reserve: None,
            budget_ratio: 1.0,
        }
    }
}

/// A tool: a name, a description, and configured arguments (templates over the context).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Tool {
    /// Its id, unique among tools.
    pub id: String,
    /// What it does, for the model.
    #[serde(default)]
    pub description: Option<String>,
    /// Configured arguments; string values are templates. A context key never replaces one.
    #[serde(default)]
    pub arguments: BTreeMap<String, Value>,
    /// The JSON schema of the arguments the model may pass.
    #[serde(default)]
    pub parameters: Option<Value>,
}

/// One step of a workflow.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct State {
    /// Its id, unique among states (`end` is reserved).
    pub id: String,
    /// Run this assistant.
    #[serde(default)]
    pub assistant_id: Option<String>,
    /// Run this tool.
    #[serde(default)]
    pub tool_id: Option<String>,
    /// Compute new context values from templates, with no LLM or tool call.
    #[serde(default)]
    pub transform: Option<BTreeMap<String, String>>,
    /// The task: a template over the context store.
    #[serde(default)]
    pub task: Option<String>,
    /// Resolve templates in the prompt (default true).
    #[serde(default = "default_true")]
    pub resolve_dynamic_values_in_prompt: bool,
    /// Where to go next; absent means the workflow ends after this state.
    #[serde(default)]
    pub next: Option<Next>,
}

fn default_true() -> bool {
    true
}

/// A state's transition and the context flags applied on it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Next {
    /// Go to this state (`end` ends the workflow).
    #[serde(default)]
    pub state_id: Option<String>,
    /// Two-way branch on an expression.
    #[serde(default)]
    pub condition: Option<Branch<String>>,
    /// First matching case.
    #[serde(default)]
    pub switch: Option<Switch<String>>,
    /// End the workflow.
    #[serde(default)]
    pub end: bool,
    /// Run the target once per item of this context list, or of this JSON pointer
    /// (`/items`) into the output.
    #[serde(default)]
    pub iter_key: Option<String>,
    /// See [`TransitionFlags::store_in_context`].
    #[serde(default = "default_true")]
    pub store_in_context: bool,
    /// See [`TransitionFlags::include_in_llm_history`].
    #[serde(default = "default_true")]
    pub include_in_llm_history: bool,
    /// See [`TransitionFlags::clear_prior_messages`].
    #[serde(default)]
    pub clear_prior_messages: bool,
    /// See [`TransitionFlags::clear_context_store`].
    #[serde(default)]
    pub clear_context_store: ClearContextStore,
    /// See [`TransitionFlags::reset_keys_in_context_store`].
    #[serde(default)]
    pub reset_keys_in_context_store: Vec<String>,
    /// See [`TransitionFlags::output_key`].
    #[serde(default)]
    pub output_key: Option<String>,
    /// See [`TransitionFlags::append_to_context`].
    #[serde(default)]
    pub append_to_context: bool,
}

impl Next {
    /// The context flags of this transition.
    pub fn flags(&self) -> TransitionFlags {
        TransitionFlags {
            store_in_context: self.store_in_context,
            include_in_llm_history: self.include_in_llm_history,
            clear_prior_messages: self.clear_prior_messages,
            clear_context_store: self.clear_context_store,
            reset_keys_in_context_store: self.reset_keys_in_context_store.clone(),
            output_key: self.output_key.clone(),
            append_to_context: self.append_to_context,
        }
    }

    /// Every state id this transition may lead to, with the path of the node naming it.
    pub fn targets(&self) -> Vec<(&str, String)> {
        let mut targets = Vec::new();
        if let Some(id) = &self.state_id {
            targets.push((id.as_str(), "state_id".to_owned()));
        }
        if let Some(branch) = &self.condition {
            targets.push((branch.then.as_str(), "condition.then".to_owned()));
            targets.push((branch.otherwise.as_str(), "condition.otherwise".to_owned()));
        }
        if let Some(switch) = &self.switch {
            for (index, case) in switch.cases.iter().enumerate() {
                targets.push((
                    case.target.as_str(),
                    format!("switch.cases[{index}].target"),
                ));
            }
            if let Some(default) = &switch.default {
                targets.push((default.as_str(), "switch.default".to_owned()));
            }
        }
        targets
    }
}

/// One problem found in a workflow file.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Diagnostic {
    /// The file (as named to [`Workflow::load`]).
    pub file: String,
    /// Where in the file.
    pub line: usize,
    /// Where in the line.
    pub column: usize,
    /// The node's path (`states[2].next.state_id`), empty for the whole document.
    pub path: String,
    /// What is wrong.
    pub message: String,
}

impl std::fmt::Display for Diagnostic {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}:{}:{}: ", self.file, self.line, self.column)?;
        if !self.path.is_empty() {
            write!(f, "{}: ", self.path)?;
        }
        f.write_str(&self.message)
    }
}

/// A workflow file that cannot run: every problem found, in file order.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{}", diagnostics.iter().map(ToString::to_string).collect::<Vec<_>>().join("\n"))]
pub struct WorkflowError {
    /// The problems, sorted by position.
    pub diagnostics: Vec<Diagnostic>,
}

impl Workflow {
    /// Parses and validates a workflow. `file` names the text in diagnostics.
    pub fn load(text: &str, file: &str) -> Result<Workflow, WorkflowError> {
        let workflow: Workflow = yaml_serde::from_str(text).map_err(|error| {
            let (line, column) = error
                .location()
                .map_or((1, 1), |location| (location.line(), location.column()));
            WorkflowError {
                diagnostics: vec![Diagnostic {
                    file: file.to_owned(),
                    line,
                    column,
                    path: String::new(),
                    message: strip_location(&error.to_string()),
                }],
            }
        })?;
        let problems = validate::problems(&workflow);
        if problems.is_empty() {
            return Ok(workflow);
        }
        let index = spans::SpanIndex::build(text);
        let mut diagnostics: Vec<Diagnostic> = problems
            .into_iter()
            .map(|(path, message)| {
                let position = index.locate(&path);
                Diagnostic {
                    file: file.to_owned(),
                    line: position.line,
                    column: position.column,
                    path,
                    message,
                }
            })
            .collect();
        diagnostics.sort_by(|a, b| (a.line, a.column, &a.path).cmp(&(b.line, b.column, &b.path)));
        Err(WorkflowError { diagnostics })
    }

    /// The state with id `id`.
    pub fn state(&self, id: &str) -> Option<&State> {
        self.states.iter().find(|state| state.id == id)
    }

    /// The assistant with id `id`.
    pub fn assistant(&self, id: &str) -> Option<&Assistant> {
        self.assistants.iter().find(|assistant| assistant.id == id)
    }

    /// The tool with id `id`.
    pub fn tool(&self, id: &str) -> Option<&Tool> {
        self.tools.iter().find(|tool| tool.id == id)
    }
}

/// yaml_serde appends " at line L column C" to its messages; diagnostics print it their way.
fn strip_location(message: &str) -> String {
    message
        .rfind(" at line ")
        .map_or(message, |index| &message[..index])
        .to_owned()
}
