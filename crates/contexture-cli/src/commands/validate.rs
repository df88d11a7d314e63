//! `contexture validate`: check workflow files without running them.

use std::path::PathBuf;

use anyhow::{Result, bail};
use clap::Args;
use contexture_engine::sources::FileSource;
use contexture_engine::workflow::Workflow;

use super::input;

/// Arguments of `contexture validate` (sub-workflows are checked too, read relative to the
/// workflow that names them).
#[derive(Debug, Args)]
pub struct ValidateArgs {
    /// Workflow YAML files.
    #[arg(required = true)]
    files: Vec<PathBuf>,
}

/// Validates each file; prints `FILE: ok` per valid file, with when each compaction policy
/// it declares fires, and every problem of the others (with file, line and column), and fails
/// when any file has a problem.
pub fn run(args: ValidateArgs) -> Result<()> {
    let mut failed = 0;
    for path in &args.files {
        let text = input::read_text(Some(path))?;
        match Workflow::load_tree(&text, &path.display().to_string(), &FileSource) {
            Ok(workflow) => {
                println!("{}: ok ({} states)", path.display(), workflow.states.len());
                for (place, when) in workflow.compaction_triggers() {
                    println!("  {place} compacts {when}");
                }
            }
            Err(error) => {
                eprintln!("{error}");
                failed += 1;
            }
        }
    }
    if failed > 0 {
        bail!(
            "{failed} of {} workflow files have problems",
            args.files.len()
        );
    }
    Ok(())
}
