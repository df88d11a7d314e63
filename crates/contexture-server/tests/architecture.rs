//! ARCHITECTURE.md's table of operations stays true: every operation the server serves (as
//! its OpenAPI document lists them, which the router's own test keeps complete) has its row,
//! and every engine or store entry point a row names exists.

use std::path::{Path, PathBuf};

use serde_json::Value;

fn repository() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

/// The rows of the table under `## Operations`, as cells.
fn operations() -> Vec<Vec<String>> {
    let text = std::fs::read_to_string(repository().join("ARCHITECTURE.md")).unwrap();
    let section = text
        .split("## Operations")
        .nth(1)
        .expect("ARCHITECTURE.md has a section `## Operations`");
    section
        .lines()
        .skip_while(|line| !line.starts_with('|'))
        .take_while(|line| line.starts_with('|'))
        .skip(2) // the header and its rule
        .map(|line| {
            // No cell holds a `|`.
            line.trim_matches('|')
                .split('|')
                .map(|cell| cell.trim().to_owned())
                .collect()
        })
        .collect()
}

/// The text of every Rust file under `dir`.
fn sources(dir: &Path) -> String {
    let mut text = String::new();
    for entry in std::fs::read_dir(dir).unwrap() {
        let path = entry.unwrap().path();
        if path.is_dir() {
            text.push_str(&sources(&path));
        } else if path.extension().is_some_and(|e| e == "rs") {
            text.push_str(&std::fs::read_to_string(&path).unwrap());
        }
    }
    text
}

#[test]
fn every_route_served_has_its_row() {
    let rows = operations();
    assert!(rows.len() > 20, "{rows:?}");
    let document: Value = serde_json::from_str(
        &std::fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join("openapi.json"))
            .unwrap(),
    )
    .unwrap();
    for (path, operations) in document["paths"].as_object().unwrap() {
        for method in operations.as_object().unwrap().keys() {
            let method = method.to_uppercase();
            let found = rows.iter().any(|row| {
                let http = &row[2];
                http.contains(&format!("{path}`"))
                    && http
                        .split(|c: char| !c.is_ascii_alphabetic())
                        .any(|word| word == method)
            });
            assert!(found, "ARCHITECTURE.md has no row for {method} {path}");
        }
    }
}

#[test]
fn every_entry_point_named_exists() {
    let engine = sources(&repository().join("crates/contexture-engine/src"));
    let store = sources(&repository().join("crates/contexture-store/src"));
    let llm = sources(&repository().join("crates/contexture-llm/src"));
    for row in operations() {
        for entry in row[3].split('`').skip(1).step_by(2) {
            let Some((owner, name)) = entry.rsplit_once("::") else {
                continue;
            };
            let (crate_text, crate_name) = match owner {
                "Store" => (&store, "store"),
                "Upstreams" => (&llm, "LLM crate"),
                _ => (&engine, "engine"),
            };
            assert!(
                crate_text.contains(&format!("fn {name}("))
                    || crate_text.contains(&format!("fn {name}<")),
                "`{entry}` (ARCHITECTURE.md, {}) is not a function of the {crate_name}",
                row[0],
            );
        }
    }
}
