//! `contexture models`: list and show the models of the registry.

use std::path::PathBuf;

use anyhow::{Context, Result};
use clap::{Args, Subcommand};
use contexture_core::TokenCounter;
use contexture_core::registry::{ModelInfo, Registry};

/// Registry commands.
#[derive(Debug, Subcommand)]
pub enum ModelsCommand {
    /// List every model of the registry.
    List {
        /// Print JSON instead of a table.
        #[arg(long)]
        json: bool,
        #[command(flatten)]
        registry: RegistryArgs,
    },
    /// Show how a model id resolves: window, output limit, tokenizer, matched entry.
    Show {
        /// The model id, e.g. `gpt-4.1-mini` or `claude-sonnet-4-5-20250929`.
        model: String,
        #[command(flatten)]
        registry: RegistryArgs,
    },
}

/// Where the registry comes from: the built-in table, plus an optional TOML file.
#[derive(Debug, Args)]
pub struct RegistryArgs {
    /// A models TOML file adding or overriding registry entries (also $CONTEXTURE_MODELS).
    #[arg(long = "models", value_name = "FILE", env = "CONTEXTURE_MODELS")]
    models_file: Option<PathBuf>,
}

impl RegistryArgs {
    /// The built-in registry with the file's entries applied.
    pub fn load(&self) -> Result<Registry> {
        let mut registry = Registry::builtin();
        if let Some(path) = &self.models_file {
            let text = std::fs::read_to_string(path)
                .with_context(|| format!("cannot read models file {}", path.display()))?;
            registry.apply_toml(&text, &path.display().to_string())?;
        }
        Ok(registry)
    }
}

/// Runs a `models` command.
pub fn run(command: ModelsCommand) -> Result<()> {
    match command {
        ModelsCommand::List { json, registry } => {
            let models = registry.load()?.models();
            if json {
                println!("{}", serde_json::to_string_pretty(&models)?);
            } else {
                println!(
                    "{:<22} {:>10} {:>10}  {:<11} {:>9} {:>9}  tokenizer",
                    "model", "window", "output", "provider", "$/M in", "$/M out"
                );
                for model in &models {
                    let (input, output) =
                        model.pricing.map_or(("-".to_owned(), "-".to_owned()), |p| {
                            (p.input_per_mtok.to_string(), p.output_per_mtok.to_string())
                        });
                    println!(
                        "{:<22} {:>10} {:>10}  {:<11} {:>9} {:>9}  {}",
                        model.id,
                        model.context_window,
                        model.max_output_tokens,
                        model.provider.as_deref().unwrap_or("-"),
                        input,
                        output,
                        describe_counter(&model.counter)
                    );
                }
            }
        }
        ModelsCommand::Show { model, registry } => {
            let info: ModelInfo = registry.load()?.get(&model)?;
            println!("{}", serde_json::to_string_pretty(&info)?);
        }
    }
    Ok(())
}

fn describe_counter(counter: &TokenCounter) -> String {
    match counter {
        TokenCounter::Exact { encoding } => format!("{encoding} (exact)"),
        TokenCounter::Estimate { encoding, ratio } => format!("{encoding} x {ratio} (estimate)"),
    }
}
