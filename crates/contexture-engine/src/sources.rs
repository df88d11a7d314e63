//! Where sub-workflows come from: a state's `workflow` names another
//! workflow by id (declared under `workflows`) or by path; a [`WorkflowSource`] turns that
//! into the child's file name and YAML text.

use std::path::Path;

/// Reads sub-workflows.
pub trait WorkflowSource: Send + Sync {
    /// The file name and text of the workflow at `path`, as named in the workflow
    /// `parent_file`.
    fn load(&self, path: &str, parent_file: &str) -> Result<(String, String), String>;
}

/// Sub-workflows are files; a relative path is relative to the parent workflow's directory.
#[derive(Debug, Clone, Copy, Default)]
pub struct FileSource;

impl WorkflowSource for FileSource {
    fn load(&self, path: &str, parent_file: &str) -> Result<(String, String), String> {
        let file = match Path::new(parent_file).parent() {
            Some(dir) if Path::new(path).is_relative() => dir.join(path),
            _ => Path::new(path).to_path_buf(),
        };
        let text = std::fs::read_to_string(&file)
            .map_err(|error| format!("cannot read {}: {error}", file.display()))?;
        Ok((file.display().to_string(), text))
    }
}
