//! The workflow context store (PRODUCT.md F14-F19): output parsing, transition flags, templates, expressions, iteration.
