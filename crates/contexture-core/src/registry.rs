//! Model registry (PRODUCT.md F3): window and output limits per model, longest-prefix match.
