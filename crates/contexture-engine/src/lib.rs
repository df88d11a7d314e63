//! Contexture's workflow engine (PRODUCT.md F20-F24).
//!
//! Today: [`workflow`], YAML workflows and their validation, with file, line and column in
//! every error. The executor, hooks and sub-workflows build on it.

pub mod workflow;
