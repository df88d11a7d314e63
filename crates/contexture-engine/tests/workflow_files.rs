//! Workflow files as data: every file under `tests/workflows/` is loaded; `ok_*` files must
//! validate, `err_*` files must fail, and the outcome of each is pinned by a snapshot.

use std::path::Path;

use contexture_engine::workflow::Workflow;

fn outcome(path: &Path) -> String {
    let text = std::fs::read_to_string(path).unwrap();
    let name = format!("workflows/{}", path.file_name().unwrap().to_string_lossy());
    match Workflow::load(&text, &name) {
        Ok(workflow) => format!(
            "ok: {} assistants, {} tools, states: {}",
            workflow.assistants.len(),
            workflow.tools.len(),
            workflow
                .states
                .iter()
                .map(|s| &*s.id)
                .collect::<Vec<_>>()
                .join(" ")
        ),
        Err(error) => error.to_string(),
    }
}

#[test]
fn workflow_files() {
    insta::glob!("workflows/*.yaml", |path| {
        let stem = path.file_stem().unwrap().to_string_lossy().into_owned();
        let result = outcome(path);
        if stem.starts_with("ok_") {
            assert!(result.starts_with("ok:"), "{stem}: {result}");
        } else {
            assert!(!result.starts_with("ok:"), "{stem} should fail");
        }
        insta::assert_snapshot!(result);
    });
}

#[test]
fn every_problem_is_reported_with_its_position() {
    let text = std::fs::read_to_string(
        Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/workflows/err_references.yaml"),
    )
    .unwrap();
    let error = Workflow::load(&text, "refs.yaml").unwrap_err();
    let found: Vec<(usize, usize, &str)> = error
        .diagnostics
        .iter()
        .map(|d| (d.line, d.column, d.path.as_str()))
        .collect();
    assert_eq!(
        found,
        vec![
            (4, 13, "assistants[0].tools[0]"),
            (8, 19, "states[0].assistant_id"),
            (11, 17, "states[0].next.state_id"),
            (13, 9, "states[1].id"),
            (15, 11, "states[1].task"),
            (19, 9, "states[2].id"),
            (20, 14, "states[2].tool_id"),
            (25, 20, "states[2].next.condition.otherwise"),
        ]
    );
}
