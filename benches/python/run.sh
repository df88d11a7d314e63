#!/usr/bin/env bash
# The Python package against its peers, in one run: `count_tokens` against tiktoken, and
# `fit` of a 10,000-message tool-calling history against LangChain's `trim_messages`
# (tiktoken counting, and precomputed counts). See "The Python package" in
# docs/benchmarks.md.
#
#   benches/python/run.sh
#
# Builds the package with Cargo's release profile into its own venv
# (target/python-bench-venv, made once), with the pinned peers of
# crates/contexture-py/tests/requirements.txt and langchain-openai (whose chat model
# counts with tiktoken, LangChain's own counter for OpenAI models). Settings (environment): REPEATS=7.
set -euo pipefail
cd "$(dirname "$0")/../.."
VENV="${BENCH_VENV:-target/python-bench-venv}"
[ -x "$VENV/bin/python" ] || python3 -m venv "$VENV"
"$VENV/bin/python" -m pip install --quiet -r crates/contexture-py/tests/requirements.txt \
  'langchain-openai==1.7.4'
MATURIN_PEP517_ARGS="--profile release" \
  "$VENV/bin/python" -m pip install --quiet --force-reinstall --no-deps ./crates/contexture-py
# tiktoken reads its encodings from the copies the tests put in its cache.
"$VENV/bin/python" -c "import sys; sys.path.insert(0, 'crates/contexture-py/tests'); import conftest"
TIKTOKEN_CACHE_DIR="$PWD/target/tiktoken-cache" exec "$VENV/bin/python" benches/python/bench.py
