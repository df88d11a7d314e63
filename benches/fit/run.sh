#!/usr/bin/env bash
# Whole-process fitting of a 10,000-message tool-calling history (about 23 MB) to 8,000
# tokens: `contexture fit` against LangChain's `trim_messages` (reading the file,
# converting, counting with tiktoken, writing the kept messages), in one run. See "Fitting a
# long history file, whole process" in docs/benchmarks.md.
#
#   benches/fit/run.sh
#
# The history is made once under target/ from the repository's own text. Each tool runs
# REPEATS times, alternating with the other. The peer is installed into its own venv
# (target/fit-bench-venv, made once) with the pinned versions of the Python package's
# tests. Settings (environment): REPEATS=9 BUDGET=8000 BIN=target/release/contexture
# SKIP_BUILD=1 (use BIN as it is).
set -euo pipefail
cd "$(dirname "$0")/../.."
BIN="${BIN:-$PWD/target/release/contexture}"
VENV="${BENCH_VENV:-target/fit-bench-venv}"

# Peak memory is GNU time's (Debian's `time`).
[ -x /usr/bin/time ] || { echo "fit/run.sh: needs /usr/bin/time (apt-get install time)" >&2; exit 1; }
if [[ -z "${SKIP_BUILD:-}" ]]; then
    cargo build --release -p contexture-cli >&2
fi
[ -x "$VENV/bin/python" ] || python3 -m venv "$VENV"
"$VENV/bin/python" -m pip install --quiet \
    "$(grep '^pytest==' crates/contexture-py/tests/requirements.txt)" \
    "$(grep '^tiktoken==' crates/contexture-py/tests/requirements.txt)" \
    "$(grep '^langchain-core==' crates/contexture-py/tests/requirements.txt)"
# tiktoken reads its encodings from the copies the Python tests' set-up puts in its cache
# (it imports pytest).
"$VENV/bin/python" -c "import sys; sys.path.insert(0, 'crates/contexture-py/tests'); import conftest"
work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
TIKTOKEN_CACHE_DIR="$PWD/target/tiktoken-cache" \
    "$VENV/bin/python" benches/fit/bench.py "$work" "$BIN" "$VENV/bin/python"
