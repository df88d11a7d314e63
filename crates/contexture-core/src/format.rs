//! Provider wire formats (PRODUCT.md F1): lossless import and export of OpenAI chat and Anthropic messages.
