#!/usr/bin/env bash
# Storage of a 1,000-message conversation whose every request sends the whole conversation:
# Contexture's SQLite store (request records by reference) against LangGraph's SQLite
# checkpointer, the same texts, in one run. Prints each one's bytes on disk per byte of
# message text and the time of a turn at the end of the conversation.
set -euo pipefail
cd "$(dirname "$0")/../.."
python3 -c 'import langgraph.checkpoint.sqlite' 2>/dev/null \
  || python3 -m pip install --quiet langgraph langgraph-checkpoint-sqlite
cargo bench -p contexture-store --bench request_records -- \
  --measurement-time 5 --warm-up-time 1 --sample-size 20 2>&1 \
  | grep -E '1,000 messages|^request_records|time:|while pruning'
python3 benches/storage/langgraph_chat.py
