//! Request budgets (PRODUCT.md F4): what a request may spend, part by part.
