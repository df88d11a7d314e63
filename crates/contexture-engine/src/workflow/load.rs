//! Loading a workflow: parsing its YAML, validating it and the sub-workflows it names, and
//! placing every problem found at its line and column in the file.

use serde::Serialize;

use super::Workflow;
use super::host::{self, Programs};
use super::spans::SpanIndex;
use super::validate;
use crate::sources::WorkflowSource;

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
        let mut diagnostics = located(text, file, problems);
        diagnostics.sort_by(|a, b| (a.line, a.column, &a.path).cmp(&(b.line, b.column, &b.path)));
        Err(WorkflowError { diagnostics })
    }

    /// Loads a workflow and, through `source`, every sub-workflow it names, recursively:
    /// a child that cannot be read, that does not validate, or that names one of its own
    /// ancestors is reported (the parent's `states[i].workflow` position for the first and
    /// the last, the child's own positions for the second).
    pub fn load_tree(
        text: &str,
        file: &str,
        source: &dyn WorkflowSource,
    ) -> Result<Workflow, WorkflowError> {
        Workflow::load_tree_for(text, file, source, &Programs::Allowed)
    }

    /// [`Workflow::load_tree`], and every program the tree declares is a problem when
    /// `programs` refuses them (each diagnostic names the tool or MCP server and why).
    pub fn load_tree_for(
        text: &str,
        file: &str,
        source: &dyn WorkflowSource,
        programs: &Programs,
    ) -> Result<Workflow, WorkflowError> {
        let workflow = Workflow::load(text, file)?;
        let mut diagnostics = host::program_diagnostics(&workflow, text, file, programs);
        check_children(
            &workflow,
            text,
            file,
            source,
            programs,
            &mut vec![file.to_owned()],
            &mut diagnostics,
        );
        if diagnostics.is_empty() {
            Ok(workflow)
        } else {
            Err(WorkflowError { diagnostics })
        }
    }
}

/// Diagnostics for `problems` (node path, message) of the workflow `text` named `file`,
/// each at its node's line and column.
pub(super) fn located(text: &str, file: &str, problems: Vec<(String, String)>) -> Vec<Diagnostic> {
    let index = SpanIndex::build(text);
    problems
        .into_iter()
        .map(|(path, message)| diagnostic_at(&index, file, path, message))
        .collect()
}

/// The diagnostic `message` at the node `path` of `file`, placed by `index`.
fn diagnostic_at(index: &SpanIndex, file: &str, path: String, message: String) -> Diagnostic {
    let position = index.locate(&path);
    Diagnostic {
        file: file.to_owned(),
        line: position.line,
        column: position.column,
        path,
        message,
    }
}

/// Checks the sub-workflows `workflow` names, depth first; `ancestors` are the files being
/// checked above it.
fn check_children(
    workflow: &Workflow,
    text: &str,
    file: &str,
    source: &dyn WorkflowSource,
    programs: &Programs,
    ancestors: &mut Vec<String>,
    diagnostics: &mut Vec<Diagnostic>,
) {
    let index = SpanIndex::build(text);
    let at = |path: String, message: String| diagnostic_at(&index, file, path, message);
    for (n, state) in workflow.states.iter().enumerate() {
        let Some(reference) = &state.workflow else {
            continue;
        };
        let path = format!("states[{n}].workflow");
        let (child_file, child_text) = match source.load(workflow.workflow_path(reference), file) {
            Ok(child) => child,
            Err(error) => {
                diagnostics.push(at(path, format!("sub-workflow `{reference}`: {error}")));
                continue;
            }
        };
        if ancestors.contains(&child_file) {
            diagnostics.push(at(
                path,
                format!(
                    "sub-workflow `{reference}` runs itself: {} -> {child_file}",
                    ancestors.join(" -> ")
                ),
            ));
            continue;
        }
        match Workflow::load(&child_text, &child_file) {
            Ok(child) => {
                diagnostics.extend(host::program_diagnostics(
                    &child,
                    &child_text,
                    &child_file,
                    programs,
                ));
                ancestors.push(child_file.clone());
                check_children(
                    &child,
                    &child_text,
                    &child_file,
                    source,
                    programs,
                    ancestors,
                    diagnostics,
                );
                ancestors.pop();
            }
            Err(error) => diagnostics.extend(error.diagnostics),
        }
    }
}

/// yaml_serde appends " at line L column C" to its messages; diagnostics print it their way.
fn strip_location(message: &str) -> String {
    message
        .rfind(" at line ")
        .map_or(message, |index| &message[..index])
        .to_owned()
}
