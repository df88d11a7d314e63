//! `contexture template render`: render a template against a context file, as a workflow
//! step would.

use std::collections::hash_map::RandomState;
use std::hash::BuildHasher;
use std::io::Write;
use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{SystemTime, UNIX_EPOCH};

use anyhow::{Context, Result, anyhow};
use clap::{Args, Subcommand};
use contexture_core::context::{
    Clock, ContextStore, FixedClock, IdSource, MissingPolicy, RenderOptions, Timestamp, render,
};
use serde_json::Value;

use contexture_core::format::json_type;

use super::input;

/// Template commands.
#[derive(Debug, Subcommand)]
pub enum TemplateCommand {
    /// Render a template (Jinja syntax, sandboxed) against a JSON context and print the text
    /// exactly, with no newline added.
    Render(RenderArgs),
}

/// Arguments of `contexture template render`.
#[derive(Debug, Args)]
pub struct RenderArgs {
    /// A JSON file holding the context store (an object).
    #[arg(long)]
    context: PathBuf,
    /// What a `{{ path }}` that does not resolve renders as: kept literally, empty, or an error.
    #[arg(long, default_value = "keep", value_parser = ["keep", "empty", "error"])]
    missing: String,
    /// Fix the clock at these Unix seconds (UTC) for current_date and friends; default: now.
    #[arg(long)]
    now: Option<i64>,
    /// Print the context keys the render used to standard error.
    #[arg(long)]
    show_keys: bool,
    /// The template file; standard input when absent or `-`.
    template: Option<PathBuf>,
}

/// Runs a `template` command.
pub fn run(command: TemplateCommand) -> Result<()> {
    match command {
        TemplateCommand::Render(args) => render_command(args),
    }
}

/// Reads a JSON object file as a context store.
pub fn read_context(path: &std::path::Path) -> Result<ContextStore> {
    let value: Value = input::read_json(Some(path))?;
    match value {
        Value::Object(map) => Ok(ContextStore::from_map(map)),
        other => Err(anyhow!(
            "{}: the context must be a JSON object, not {}",
            path.display(),
            json_type(&other)
        )),
    }
}

/// The real clock, in UTC.
struct SystemClock;

impl Clock for SystemClock {
    fn now(&self) -> Timestamp {
        let unix_seconds = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(0, |d| i64::try_from(d.as_secs()).unwrap_or(i64::MAX));
        Timestamp {
            unix_seconds,
            utc_offset_minutes: 0,
        }
    }
}

/// Random ids from the standard library's randomly keyed hasher (no extra dependency).
struct RandomIds {
    state: RandomState,
    counter: AtomicU64,
}

impl IdSource for RandomIds {
    fn next_id(&self) -> [u8; 16] {
        let n = self.counter.fetch_add(1, Ordering::Relaxed);
        let nanos = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(0, |d| d.as_nanos());
        let a = self.state.hash_one((n, nanos, 0u8));
        let b = self.state.hash_one((n, nanos, 1u8));
        let mut bytes = [0u8; 16];
        bytes[..8].copy_from_slice(&a.to_le_bytes());
        bytes[8..].copy_from_slice(&b.to_le_bytes());
        bytes
    }
}

/// The system variables a render may use: `hostname`, `username`, `os`,
/// `working_directory` (each only when it can be found).
fn system_variables() -> Vec<(&'static str, String)> {
    let mut variables = vec![("os", std::env::consts::OS.to_owned())];
    let hostname = std::env::var("HOSTNAME").ok().or_else(|| {
        std::fs::read_to_string("/etc/hostname")
            .ok()
            .map(|h| h.trim().to_owned())
    });
    if let Some(hostname) = hostname.filter(|h| !h.is_empty()) {
        variables.push(("hostname", hostname));
    }
    if let Some(user) = std::env::var("USER")
        .ok()
        .or_else(|| std::env::var("USERNAME").ok())
    {
        variables.push(("username", user));
    }
    if let Ok(dir) = std::env::current_dir() {
        variables.push(("working_directory", dir.display().to_string()));
    }
    variables
}

/// Render options with the real (or a fixed) clock, random ids and the system variables.
pub fn options(now: Option<i64>) -> RenderOptions {
    let clock: Arc<dyn Clock> = match now {
        Some(seconds) => Arc::new(FixedClock::utc(seconds)),
        None => Arc::new(SystemClock),
    };
    let mut options = RenderOptions::new(
        clock,
        Arc::new(RandomIds {
            state: RandomState::new(),
            counter: AtomicU64::new(0),
        }),
    );
    for (name, value) in system_variables() {
        options = options.with_variable(name, Value::String(value));
    }
    options
}

fn render_command(args: RenderArgs) -> Result<()> {
    let store = read_context(&args.context)?;
    let template = input::read_text(args.template.as_deref())?;
    let missing: MissingPolicy = args.missing.parse().map_err(|e: String| anyhow!(e))?;
    let options = options(args.now).with_missing(missing);
    let rendered = render(&template, &store, &options).with_context(|| {
        format!(
            "cannot render {}",
            input::describe(args.template.as_deref())
        )
    })?;
    if args.show_keys {
        eprintln!("used keys: {}", rendered.used_keys.join(", "));
        if !rendered.missing.is_empty() {
            eprintln!("missing: {}", rendered.missing.join(", "));
        }
    }
    let mut stdout = std::io::stdout().lock();
    stdout.write_all(rendered.text.as_bytes())?;
    stdout.flush()?;
    Ok(())
}
