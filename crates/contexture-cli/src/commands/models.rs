//! `contexture models`: list and show the models of the registry.

use std::path::{Path, PathBuf};

use anyhow::{Context, Result};
use clap::{Args, Subcommand};
use contexture_core::TokenCounter;
use contexture_core::registry::{ModelInfo, Registry};
use contexture_store::{AnyStore, Store};
use serde_json::{Value, json};

use super::runtime;

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
    /// Show how a model id resolves: window, output limit, tokenizer, matched entry; for a
    /// model whose tokens are estimated, what its family's calibration has learnt from the
    /// usage providers reported (the counter shown is the calibrated one).
    Show {
        /// The model id, e.g. `gpt-4.1-mini` or `claude-sonnet-4-5-20250929`.
        model: String,
        #[command(flatten)]
        registry: RegistryArgs,
        /// The store holding the calibrations (also $CONTEXTURE_DB; default
        /// `sqlite:contexture.db` when that file exists, else none is read).
        #[arg(long, env = "CONTEXTURE_DB")]
        db: Option<String>,
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
        ModelsCommand::Show {
            model,
            registry,
            db,
        } => {
            let info: ModelInfo = registry.load()?.get(&model)?;
            let shown = match info.calibration_key().map(str::to_owned) {
                None => serde_json::to_value(&info)?,
                Some(family) => {
                    let db = db.or_else(|| {
                        Path::new(DEFAULT_DB_FILE)
                            .exists()
                            .then(|| format!("sqlite:{DEFAULT_DB_FILE}"))
                    });
                    with_calibration(info, &family, db.as_deref())?
                }
            };
            println!("{}", serde_json::to_string_pretty(&shown)?);
        }
    }
    Ok(())
}

/// The store file `--db` names by default.
const DEFAULT_DB_FILE: &str = "contexture.db";

/// `info` shown with its family's calibration read from the store `db` (none without one):
/// the counter calibrated, and what was learnt under `estimate_calibration`.
fn with_calibration(info: ModelInfo, family: &str, db: Option<&str>) -> Result<Value> {
    let calibration = match db {
        Some(db) => runtime::on_worker_threads(Some(1), async {
            let store = AnyStore::open(db)
                .await
                .with_context(|| format!("cannot open the store {db}"))?;
            store
                .calibration(family)
                .await
                .with_context(|| format!("cannot read the calibration of {family} in {db}"))
        })?,
        None => None,
    };
    let learnt = calibration.as_ref().map_or_else(
        || {
            json!({
                "family": family,
                "factor": null,
                "observations": 0,
                "kept": 0,
                "outliers": 0,
                "store": db,
            })
        },
        |calibration| {
            json!({
                "family": family,
                "factor": calibration.factor(),
                "observations": calibration.observations.len(),
                "kept": calibration.kept,
                "outliers": calibration.outliers,
                "store": db,
            })
        },
    );
    let info = match &calibration {
        Some(calibration) => info.calibrated(calibration),
        None => info,
    };
    let mut shown = serde_json::to_value(&info)?;
    shown["estimate_calibration"] = learnt;
    Ok(shown)
}

fn describe_counter(counter: &TokenCounter) -> String {
    match counter {
        TokenCounter::Exact { encoding } => format!("{encoding} (exact)"),
        TokenCounter::Estimate {
            encoding,
            ratio,
            calibration: None,
        } => format!("{encoding} x {ratio} (estimate)"),
        TokenCounter::Estimate {
            encoding,
            ratio,
            calibration: Some(factor),
        } => format!("{encoding} x {ratio} x {factor} (calibrated estimate)"),
    }
}
