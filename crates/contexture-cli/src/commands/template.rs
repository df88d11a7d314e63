//! `contexture template render`: render a template against a context file, as a workflow
//! step would.

use std::io::Write;
use std::path::PathBuf;

use anyhow::{Context, Result, anyhow};
use clap::{Args, Subcommand};
use contexture_core::context::{
    ContextStore, MissingPolicy, TemplateFormat, render, render_fstring,
};
use serde_json::Value;

use contexture_core::format::json_type;

use super::input;

/// Template commands.
#[derive(Debug, Subcommand)]
pub enum TemplateCommand {
    /// Render a template (Jinja syntax, or the simple `{name}` one with --format fstring;
    /// sandboxed) against a JSON context and print the text exactly, with no newline added.
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
    /// The template's syntax: jinja (`{{ name }}`, filters, tags) or fstring (`{name}`, with
    /// `{{` and `}}` for literal braces).
    #[arg(long, default_value = "jinja", value_parser = ["jinja", "fstring"])]
    format: String,
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

fn render_command(args: RenderArgs) -> Result<()> {
    let store = read_context(&args.context)?;
    let template = input::read_text(args.template.as_deref())?;
    let missing: MissingPolicy = args.missing.parse().map_err(|e: String| anyhow!(e))?;
    let options = contexture_engine::system::render_options(args.now).with_missing(missing);
    let format: TemplateFormat = args.format.parse().map_err(|e: String| anyhow!(e))?;
    let rendered = match format {
        TemplateFormat::Jinja => render(&template, &store, &options),
        TemplateFormat::Fstring => render_fstring(&template, &store, &options),
    }
    .with_context(|| {
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
