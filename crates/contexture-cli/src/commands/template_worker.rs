//! `contexture template-worker`: a worker process that renders templates for a server, under
//! the memory limit the server sends first (see the engine's render workers). Not for people:
//! `contexture serve` starts these itself.

use std::io::BufReader;

use anyhow::Result;
use contexture_engine::render_workers::serve_worker;

/// Serves render jobs on standard input and output until the input ends.
pub fn run() -> Result<()> {
    serve_worker(BufReader::new(std::io::stdin()), std::io::stdout())?;
    Ok(())
}
