#!/usr/bin/env bash
# Builds the `contexture` Python package into a virtual environment and runs its tests
# with pytest (its exit status is this script's). The venv and its pinned test
# dependencies are made once and reused while requirements.txt is unchanged; the package
# is rebuilt every run, with `pip install ./crates/contexture-py` as a user installs it.
#
# The build uses Cargo's dev profile (MATURIN_PEP517_ARGS), sharing the workspace's
# compiled dependencies with `cargo test`; set CONTEXTURE_PY_PROFILE=release for an
# optimized build.
set -euo pipefail
cd "$(dirname "$0")/../../.."
VENV="${CONTEXTURE_PY_VENV:-target/python-venv}"
REQUIREMENTS=crates/contexture-py/tests/requirements.txt
if [ ! -x "$VENV/bin/python" ]; then
  python3 -m venv "$VENV"
fi
STAMP="$VENV/.requirements.sha256"
if [ "$(cat "$STAMP" 2>/dev/null)" != "$(sha256sum "$REQUIREMENTS" | cut -d' ' -f1)" ]; then
  "$VENV/bin/python" -m pip install --quiet --upgrade pip
  "$VENV/bin/python" -m pip install --quiet -r "$REQUIREMENTS"
  sha256sum "$REQUIREMENTS" | cut -d' ' -f1 > "$STAMP"
fi
MATURIN_PEP517_ARGS="--profile ${CONTEXTURE_PY_PROFILE:-dev}" \
  "$VENV/bin/python" -m pip install --quiet --force-reinstall --no-deps ./crates/contexture-py
exec "$VENV/bin/python" -m pytest -q -p no:cacheprovider crates/contexture-py/tests "$@"
