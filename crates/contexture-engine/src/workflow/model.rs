//! The workflow model: the types a workflow file deserializes into (assistants, tools,
//! states and their transitions), and the lookups a run makes on them.

use std::collections::BTreeMap;

use contexture_core::compact::CompactionPolicy;
use contexture_core::context::{
    Branch, ClearContextStore, MergePolicy, MissingPolicy, Switch, TransitionFlags,
};
use contexture_core::fit::FitPolicy;
use contexture_core::thread::{
    ConflictPolicy, MergeKeys, MergePolicy as ThreadMergePolicy, MergeSpec, RunLimits,
};
use serde::{Deserialize, Serialize};

use super::mcp::{McpServer, McpServerUse};
use super::prompt_text::PromptText;
use serde_json::{Map, Value};

/// The most items of an iteration that may run at once (`max_concurrency`): enough to
/// overlap slow calls, few enough that one workflow cannot open hundreds of connections.
pub const MAX_ITEM_CONCURRENCY: u32 = 64;

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
    /// MCP servers whose tools the assistants may use (`Assistant::mcp_servers` names
    /// them); each starts once per run, when a step first needs it.
    #[serde(default)]
    pub mcp_servers: Vec<McpServer>,
    /// The assistant of states that name none (`assistant_id`, `tool_id` and `transform`
    /// all absent). Default: the only assistant, when exactly one is declared.
    #[serde(default)]
    pub default_assistant: Option<String>,
    /// What a run may spend before it is stopped (the caller may override each limit).
    #[serde(default)]
    pub limits: RunLimits,
    /// What a template variable that does not resolve renders as: `keep` (the literal
    /// `{{name}}`, the default), `empty`, or `error` (the step fails).
    #[serde(default)]
    pub missing_variables: MissingPolicy,
    /// Sub-workflows by id (a state's `workflow` may also give a path).
    #[serde(default)]
    pub workflows: Vec<WorkflowRef>,
    /// How runs that continue a conversation load its history.
    #[serde(default)]
    pub conversation: ConversationPolicy,
    /// Programs called at the hook points of the workflow's steps, in order, before the
    /// hooks of whoever runs it (the CLI's `--hook`, the server's configuration). They start
    /// programs on the host: a workflow a client sent is refused when it declares any.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub hooks: Vec<crate::hooks::HookProgramSpec>,
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
    pub system_prompt: Option<PromptText>,
    /// Ids of the tools it may call.
    #[serde(default)]
    pub tools: Vec<String>,
    /// MCP servers whose tools it may call: names of the workflow's `mcp_servers` (or of
    /// the host's), or declarations of its own.
    #[serde(default)]
    pub mcp_servers: Vec<McpServerUse>,
    /// How its requests are fitted to the model's window (the key `context`).
    #[serde(default, rename = "context")]
    pub fit: FitPolicy,
    /// The most LLM calls one step may make (each reply with tool calls leads to one more);
    /// a step whose last allowed call still asks for tools fails. Default 10.
    #[serde(default = "default_max_iterations")]
    pub max_iterations: u32,
    /// Sampling temperature, sent as is.
    #[serde(default)]
    pub temperature: Option<f64>,
    /// When and how the shared history is compacted before this assistant's requests (and
    /// by its `context_manager` tool); see docs/compaction.md.
    #[serde(default)]
    pub compaction: Option<CompactionPolicy>,
}

fn default_max_iterations() -> u32 {
    10
}

/// A tool: a name, a description, configured arguments (templates over the context), and
/// what runs it.
///
/// What runs it, in order: `command` (a program on this machine), `response` (a fixed
/// answer, rendered as a template: for demos and tests), else `tool`, the name of a built-in
/// tool or of one the caller registered (default: the tool's id).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Tool {
    /// Its id, unique among tools; the name the model calls it by.
    pub id: String,
    /// The implementation's name (a built-in such as `echo`, or a registered tool).
    #[serde(default)]
    pub tool: Option<String>,
    /// What it does, for the model.
    #[serde(default)]
    pub description: Option<String>,
    /// Configured arguments; string values are templates. A context key never replaces one,
    /// and neither does an argument the model passes.
    #[serde(default)]
    pub arguments: BTreeMap<String, Value>,
    /// The JSON schema of the arguments the model may pass.
    #[serde(default)]
    pub parameters: Option<Value>,
    /// Run this program: the first item is the program, the rest its arguments (each a
    /// template). It receives the call's arguments as a JSON object on standard input; its
    /// standard output is the result. A non-zero exit is an error.
    #[serde(default)]
    pub command: Option<Vec<String>>,
    /// Answer every call with this value (strings are templates over the context and the
    /// call's arguments).
    #[serde(default)]
    pub response: Option<Value>,
    /// Seconds a call may take before it fails (default 60).
    #[serde(default)]
    pub timeout_seconds: Option<f64>,
    /// Render templates in the tool's output against the context before it is used.
    #[serde(default)]
    pub resolve_dynamic_values_in_response: bool,
}

/// How a state run on a fork comes back: what the merge brings (`append-messages`, the
/// default: the fork's exchange; `summary-only`: its final answer; `output-keys`: the keys
/// only), which of the fork's context keys come back (`keys`: a list, or `all`, the
/// default: every key, as a deep copy merged back would), and how a key the execution holds
/// with another value resolves (`conflict`: `child-wins`, the default, `parent-wins`,
/// `error`, `append`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ForkSettings {
    /// What the merge brings back.
    #[serde(default)]
    pub merge: ThreadMergePolicy,
    /// How a key held with another value resolves.
    #[serde(default)]
    pub conflict: ConflictPolicy,
    /// The fork's context keys brought back.
    #[serde(default = "all_keys")]
    pub keys: MergeKeys,
}

fn all_keys() -> MergeKeys {
    MergeKeys::All
}

impl ForkSettings {
    /// The merge these settings describe.
    pub fn spec(&self) -> MergeSpec {
        MergeSpec {
            policy: self.merge,
            conflict: self.conflict,
            keys: self.keys.clone(),
        }
    }
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
    /// Compute new context values, with no LLM or tool call: each value's templates are
    /// rendered (a lone `{{ path }}` keeps its JSON type) and the object is the output.
    #[serde(default)]
    pub transform: Option<Map<String, Value>>,
    /// Arguments for the tool of a tool state, over the tool's configured ones (templates).
    #[serde(default)]
    pub tool_args: Option<BTreeMap<String, Value>>,
    /// Run another workflow: an id from `workflows`, or a path relative to this file.
    #[serde(default)]
    pub workflow: Option<String>,
    /// For a sub-workflow state: what the child receives (default: the last message).
    #[serde(default)]
    pub input: Option<SubInput>,
    /// For a sub-workflow state: what comes back as the state's output: the child's final
    /// `output` (the default) or its final `context` store as a JSON object.
    #[serde(default)]
    pub result: SubResult,
    /// For a sub-workflow state: add one message summarizing the child's result to this
    /// workflow's history (default false: the result is only stored).
    #[serde(default)]
    pub history_summary: bool,
    /// The named context of the execution's thread the state runs in (default `main`):
    /// its requests see that context's history, a clear or compaction it makes applies to
    /// that context only, and what it adds to the history is seen by every context. The
    /// switch is recorded with the step's start whenever the active context is another.
    #[serde(default)]
    pub thread_context: Option<String>,
    /// Run the state on a fork of the execution's thread (its calls, tool results and
    /// exchange recorded there), then merge the fork back as these settings say: one
    /// `merged` event in the execution's log, with the fork's usage and cost counted once.
    #[serde(default)]
    pub fork: Option<ForkSettings>,
    /// The task: a template over the context store.
    #[serde(default)]
    pub task: Option<PromptText>,
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

/// What a sub-workflow receives from its parent: exactly one of the three (none: the last
/// message). Nothing else of the parent's is visible to the child.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SubInput {
    /// The last message of the parent's history, as the child's input text.
    #[serde(default)]
    pub last_message: bool,
    /// The last output of this parent state, as the child's input text.
    #[serde(default)]
    pub state: Option<String>,
    /// A JSON object for the child's input: each child key takes the value at a dotted path
    /// of the parent's context (`request.topic`, `files[0].name`).
    #[serde(default)]
    pub mapping: Option<BTreeMap<String, String>>,
}

/// What a sub-workflow state's output is.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum SubResult {
    /// The child's final output.
    #[default]
    Output,
    /// The child's final context store, as a JSON object.
    Context,
}

/// A sub-workflow declared by id.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct WorkflowRef {
    /// Its id, unique among `workflows`.
    pub id: String,
    /// Its file, relative to this file.
    pub path: String,
}

/// How runs that continue a conversation load and keep its history.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct ConversationPolicy {
    /// The most earlier messages a run loads (default 20).
    pub history_messages: usize,
    /// The most tokens of earlier messages a run loads (default 16,000).
    pub history_tokens: u64,
    /// Compaction of the conversation's thread when a run loads it.
    pub compaction: Option<CompactionPolicy>,
}

impl Default for ConversationPolicy {
    fn default() -> Self {
        ConversationPolicy {
            history_messages: 20,
            history_tokens: 16_000,
            compaction: None,
        }
    }
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
    /// With `iter_key`: how the items' outputs come together in the store once every item
    /// has run: `last_wins` (default: each item's output is stored in turn, under the
    /// iterated state's flags), `append` (as if that state had `append_to_context`: each key
    /// collects the items' values in a list), or `error` (two items giving one key different
    /// values fail the step).
    #[serde(default)]
    pub iter_merge: Option<MergePolicy>,
    /// With `iter_key`: the only context keys each item's run sees (an object item's own
    /// keys are added, and `item`/`item_index` are always there); default all of them. What
    /// an item writes comes back by `iter_merge` whatever it saw.
    #[serde(default)]
    pub include_in_iterator_context: Option<Vec<String>>,
    /// With `iter_key`: how many items run at once, from 1 (the default: one after another,
    /// in item order) to [`MAX_ITEM_CONCURRENCY`]. Whatever order they finish in, their
    /// results are recorded and come together in item order. Items still run one at a time
    /// where running them at once could break a guarantee (a token, cost or step budget
    /// shared with sub-workflows, a state that compacts the shared history).
    #[serde(default)]
    pub max_concurrency: Option<u32>,
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

impl Workflow {
    /// The file a sub-workflow reference names, relative to this workflow's file: the path
    /// of the `workflows` entry with that id, or the reference itself.
    pub fn workflow_path<'a>(&'a self, reference: &'a str) -> &'a str {
        self.workflows
            .iter()
            .find(|w| w.id == reference)
            .map_or(reference, |w| w.path.as_str())
    }

    /// Where the workflow compacts on its own and when, in words, as `(where, when)`: each
    /// assistant's `compaction` (before its requests) and the conversation's (when a run
    /// loads it); a policy that names no trigger fires past
    /// [`contexture_core::compact::DEFAULT_TRIGGER_TOKENS`], one with `trigger: {}` never.
    pub fn compaction_triggers(&self) -> Vec<(String, String)> {
        let describe = |policy: &CompactionPolicy| {
            let when = policy.trigger.describe();
            if policy.trigger == CompactionPolicy::default().trigger {
                format!("{when} (the default: the policy names no trigger)")
            } else {
                when
            }
        };
        let mut triggers: Vec<(String, String)> = self
            .assistants
            .iter()
            .filter_map(|assistant| {
                let policy = assistant.compaction.as_ref()?;
                Some((format!("assistant `{}`", assistant.id), describe(policy)))
            })
            .collect();
        if let Some(policy) = &self.conversation.compaction {
            triggers.push(("the conversation".to_owned(), describe(policy)));
        }
        triggers
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

    /// The assistant of states that name none: `default_assistant`, else the only
    /// assistant when exactly one is declared.
    pub fn default_assistant(&self) -> Option<&Assistant> {
        match &self.default_assistant {
            Some(id) => self.assistant(id),
            None => match self.assistants.as_slice() {
                [only] => Some(only),
                _ => None,
            },
        }
    }

    /// Every MCP server the workflow declares, with its node path: the workflow's
    /// `mcp_servers`, then the assistants' own declarations.
    pub fn mcp_declarations(&self) -> impl Iterator<Item = (String, &McpServer)> {
        let top = self
            .mcp_servers
            .iter()
            .enumerate()
            .map(|(n, server)| (format!("mcp_servers[{n}]"), server));
        let inline = self
            .assistants
            .iter()
            .enumerate()
            .flat_map(|(a, assistant)| {
                assistant
                    .mcp_servers
                    .iter()
                    .enumerate()
                    .filter_map(move |(n, used)| match used {
                        McpServerUse::Inline(server) => {
                            Some((format!("assistants[{a}].mcp_servers[{n}]"), server))
                        }
                        McpServerUse::Name(_) => None,
                    })
            });
        top.chain(inline)
    }

    /// The MCP server the workflow declares under `name` (at its top or in an assistant).
    pub fn mcp_server(&self, name: &str) -> Option<&McpServer> {
        self.mcp_declarations()
            .map(|(_, server)| server)
            .find(|server| server.name == name)
    }

    /// What `state` runs.
    pub fn step_kind<'a>(&'a self, state: &'a State) -> Option<StepKind<'a>> {
        if let Some(reference) = &state.workflow {
            return Some(StepKind::Workflow(reference));
        }
        if let Some(id) = &state.tool_id {
            return self.tool(id).map(StepKind::Tool);
        }
        if let Some(values) = &state.transform {
            return Some(StepKind::Transform(values));
        }
        match &state.assistant_id {
            Some(id) => self.assistant(id),
            None => self.default_assistant(),
        }
        .map(StepKind::Assistant)
    }
}

/// What a state runs.
#[derive(Debug, Clone, Copy)]
pub enum StepKind<'a> {
    /// An assistant: LLM calls, with its tools, until it answers.
    Assistant(&'a Assistant),
    /// A tool, called once with its configured arguments.
    Tool(&'a Tool),
    /// Context values computed from templates.
    Transform(&'a Map<String, Value>),
    /// Another workflow, run as a child execution (its reference: an id or a path).
    Workflow(&'a str),
}
