//! Fitting a history into a window (PRODUCT.md F9-F11): provider-rule validation and repair, trimming, clearing old tool results.
