//! The inspector's tests, one binary.

mod execution_views;
