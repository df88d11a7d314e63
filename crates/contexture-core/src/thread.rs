//! Threads (PRODUCT.md F5-F8): the append-only event log, projections, context operations, fork and merge.
