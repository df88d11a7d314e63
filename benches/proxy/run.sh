#!/usr/bin/env bash
# Contexture's doors against LiteLLM's proxy, both in front of one static upstream (nginx),
# in one run: CPU per request, requests/s and p99 at 1 and 32 connections, whole and
# streamed answers, and resident memory, for
#   - chat:        `POST /v1/chat/completions` passed through (Contexture: no thread named);
#   - chat-thread: the same naming a thread (Contexture only: each turn appended, the thread
#                  fitted, the answer recorded), compared with LiteLLM's plain chat;
#   - responses:   `POST /v1/responses`;
#   - messages:    `POST /v1/messages` (Anthropic's shape).
# Contexture runs on SQLite. See "The chat endpoint against LiteLLM's proxy" in
# docs/benchmarks.md.
#
#   benches/proxy/run.sh
#   DURATION=20s CONNECTIONS="1 32" SCENARIOS="chat chat-thread" benches/proxy/run.sh
#
# Needs wrk, nginx and curl (Debian's packages) and Python 3; installs LiteLLM's proxy from
# PyPI into a virtual environment under $LITELLM_HOME the first time. Settings (environment):
#   DURATION=10s WARMUP=3s CONNECTIONS="1 32" STREAMS="0 1"
#   SCENARIOS="chat chat-thread responses messages" TURNS_PER_THREAD=50
#   LITELLM_VERSION=1.108.0 LITELLM_HOME=~/.cache/contexture-bench/litellm-$LITELLM_VERSION
#   BIN=target/release/contexture SKIP_BUILD=1 (use the binary as it is)
#   PORT_BASE=18190 (nginx: PORT_BASE and +1; Contexture +2; LiteLLM +3)
#   WRK_CPUS, PROXY_CPUS: CPU lists (taskset) to keep the load and the proxies apart, e.g.
#   WRK_CPUS=1 PROXY_CPUS=0: the proxies' tail without wrk's threads in their run queue
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
root="$(cd "$here/../.." && pwd)"
cd "$root"

DURATION="${DURATION:-10s}"
WARMUP="${WARMUP:-3s}"
CONNECTIONS="${CONNECTIONS:-1 32}"
STREAMS="${STREAMS:-0 1}"
SCENARIOS="${SCENARIOS:-chat chat-thread responses messages}"
TURNS_PER_THREAD="${TURNS_PER_THREAD:-50}"
LITELLM_VERSION="${LITELLM_VERSION:-1.108.0}"
LITELLM_HOME="${LITELLM_HOME:-$HOME/.cache/contexture-bench/litellm-$LITELLM_VERSION}"
BIN="${BIN:-$root/target/release/contexture}"
PORT_BASE="${PORT_BASE:-18190}"
WHOLE_PORT=$PORT_BASE
STREAM_PORT=$((PORT_BASE + 1))
CONTEXTURE_PORT=$((PORT_BASE + 2))
LITELLM_PORT=$((PORT_BASE + 3))
SCRIPT="$here/proxy.lua"
wrk_run=(wrk)
proxy_run=()
[[ -n "${WRK_CPUS:-}" ]] && wrk_run=(taskset -c "$WRK_CPUS" wrk)
[[ -n "${PROXY_CPUS:-}" ]] && proxy_run=(taskset -c "$PROXY_CPUS")
# A whole answer comes from one upstream port, a streamed one from the other: nginx answers
# without reading the request, so each model is routed to the port of its answer's form.
WHOLE_MODEL=gpt-4o-mini
STREAM_MODEL=gpt-4o

for tool in wrk nginx curl python3; do
    command -v "$tool" >/dev/null || { echo "proxy/run.sh: $tool is not installed" >&2; exit 1; }
done
if [[ ! -x "$LITELLM_HOME/bin/litellm" ]]; then
    echo "== installing litellm[proxy]==$LITELLM_VERSION into $LITELLM_HOME" >&2
    python3 -m venv "$LITELLM_HOME"
    "$LITELLM_HOME/bin/pip" install -q "litellm[proxy]==$LITELLM_VERSION" >&2
fi
if [[ -z "${SKIP_BUILD:-}" ]]; then
    echo "== cargo build --release -p contexture-cli" >&2
    cargo build --release -p contexture-cli >&2
fi
[[ -x "$BIN" ]] || { echo "proxy/run.sh: no binary at $BIN" >&2; exit 1; }

work="$(mktemp -d /tmp/contexture-proxy-bench.XXXXXX)"
pids=()
cleanup() {
    for pid in "${pids[@]}"; do
        kill -- -"$pid" 2>/dev/null || kill "$pid" 2>/dev/null || true
    done
    wait 2>/dev/null || true
}
trap cleanup EXIT

# shellcheck source=benches/server/cpu.sh
source "$root/benches/server/cpu.sh"

# The processes of the process group led by $1 (a server and the workers it started).
group_of() {
    ps -o pid= -g "$1" 2>/dev/null | tr -s ' \n' ' '
}

# Resident kilobytes of the given processes, added up.
rss_of() {
    local kb=0 pid value
    for pid in "$@"; do
        value="$(awk '/^VmRSS:/ {print $2}' "/proc/$pid/status" 2>/dev/null)" || continue
        kb=$((kb + ${value:-0}))
    done
    echo "$kb"
}

wait_ready() { # URL PID LOG
    for _ in $(seq 1 600); do
        if curl -fsS -o /dev/null "$1" 2>/dev/null; then return 0; fi
        kill -0 "$2" 2>/dev/null || break
        sleep 0.1
    done
    echo "proxy/run.sh: not ready at $1" >&2
    tail -30 "$3" >&2
    exit 1
}

# --- the static upstream -------------------------------------------------------------------
chat_whole='{"id":"chatcmpl-bench","object":"chat.completion","created":1700000000,"model":"gpt-4o-mini","choices":[{"index":0,"message":{"role":"assistant","content":"The static upstream answer."},"finish_reason":"stop"}],"usage":{"prompt_tokens":12,"completion_tokens":5,"total_tokens":17}}'
chunk() { # DELTA FINISH: one event of a streamed chat completion
    printf '{"id":"chatcmpl-bench","object":"chat.completion.chunk","created":1700000000,"model":"gpt-4o","choices":[{"index":0,"delta":%s,"finish_reason":%s}]}' "$1" "$2"
}
usage_chunk='{"id":"chatcmpl-bench","object":"chat.completion.chunk","created":1700000000,"model":"gpt-4o","choices":[],"usage":{"prompt_tokens":12,"completion_tokens":5,"total_tokens":17}}'
# printf -v keeps the trailing blank line that ends each event.
printf -v chat_stream 'data: %s\n\ndata: %s\n\ndata: %s\n\ndata: %s\n\ndata: [DONE]\n\n' \
    "$(chunk '{"role":"assistant","content":"The static"}' null)" \
    "$(chunk '{"content":" upstream answer."}' null)" \
    "$(chunk '{}' '"stop"')" "$usage_chunk"
response_object() { # STATUS MODEL OUTPUT
    printf '{"id":"resp_bench","object":"response","created_at":1700000000,"status":"%s","model":"%s","output":%s,"usage":{"input_tokens":12,"output_tokens":5,"total_tokens":17,"input_tokens_details":{"cached_tokens":0},"output_tokens_details":{"reasoning_tokens":0}}}' "$1" "$2" "$3"
}
output='[{"type":"message","id":"msg_bench","status":"completed","role":"assistant","content":[{"type":"output_text","text":"The static upstream answer.","annotations":[]}]}]'
responses_whole="$(response_object completed gpt-4o-mini "$output")"
printf -v responses_stream 'event: %s\ndata: %s\n\nevent: %s\ndata: %s\n\nevent: %s\ndata: %s\n\n' \
    response.created \
    "{\"type\":\"response.created\",\"sequence_number\":0,\"response\":$(response_object in_progress gpt-4o '[]')}" \
    response.output_text.delta \
    '{"type":"response.output_text.delta","sequence_number":1,"item_id":"msg_bench","output_index":0,"content_index":0,"delta":"The static upstream answer."}' \
    response.completed \
    "{\"type\":\"response.completed\",\"sequence_number\":2,\"response\":$(response_object completed gpt-4o "$output")}"
mkdir -p "$work/nginx/logs"
cat >"$work/nginx/nginx.conf" <<EOF
worker_processes 1;
error_log $work/nginx/logs/error.log warn;
pid $work/nginx/nginx.pid;
events { worker_connections 1024; }
http {
    access_log off;
    client_body_temp_path $work/nginx/body;
    proxy_temp_path $work/nginx/proxy;
    fastcgi_temp_path $work/nginx/fastcgi;
    uwsgi_temp_path $work/nginx/uwsgi;
    scgi_temp_path $work/nginx/scgi;
    keepalive_requests 1000000;
    server {
        listen 127.0.0.1:$WHOLE_PORT;
        default_type application/json;
        location = /v1/models { return 200 '{"object":"list","data":[{"id":"gpt-4o-mini","object":"model","created":0,"owned_by":"bench"}]}'; }
        location = /v1/chat/completions { return 200 '$chat_whole'; }
        location = /v1/responses { return 200 '$responses_whole'; }
    }
    server {
        listen 127.0.0.1:$STREAM_PORT;
        default_type text/event-stream;
        location = /v1/chat/completions { return 200 '$chat_stream'; }
        location = /v1/responses { return 200 '$responses_stream'; }
    }
}
EOF
setsid nginx -p "$work/nginx" -c "$work/nginx/nginx.conf" -g 'daemon off;' \
    2>"$work/nginx/stderr.log" &
pids+=($!)
nginx_pid=$!
wait_ready "http://127.0.0.1:$WHOLE_PORT/v1/models" "$nginx_pid" "$work/nginx/stderr.log"

# --- the two proxies -----------------------------------------------------------------------
cat >"$work/contexture.toml" <<EOF
[upstream]
base_url = "http://127.0.0.1:$WHOLE_PORT/v1"
api_key = "upstream-key"
[[upstreams]]
models = ["$STREAM_MODEL"]
base_url = "http://127.0.0.1:$STREAM_PORT/v1"
api_key = "upstream-key"
[limits]
requests_per_second = 0.0
max_chat_turns = 256
EOF
contexture_key="$("$BIN" keys create --tenant bench --name bench --db "sqlite:$work/contexture.db" 2>/dev/null)"
CONTEXTURE_LOG=warn setsid "${proxy_run[@]}" "$BIN" serve --config "$work/contexture.toml" \
    --db "sqlite:$work/contexture.db" --bind "127.0.0.1:$CONTEXTURE_PORT" \
    2>"$work/contexture.log" &
pids+=($!)
contexture_pid=$!
wait_ready "http://127.0.0.1:$CONTEXTURE_PORT/readyz" "$contexture_pid" "$work/contexture.log"

litellm_key="sk-$(python3 -c 'import secrets; print(secrets.token_hex(32))')"
cat >"$work/litellm.yaml" <<EOF
model_list:
  - model_name: $WHOLE_MODEL
    litellm_params:
      model: openai/$WHOLE_MODEL
      api_base: http://127.0.0.1:$WHOLE_PORT/v1
      api_key: upstream-key
  - model_name: $STREAM_MODEL
    litellm_params:
      model: openai/$STREAM_MODEL
      api_base: http://127.0.0.1:$STREAM_PORT/v1
      api_key: upstream-key
litellm_settings:
  telemetry: false
  drop_params: true
general_settings:
  master_key: $litellm_key
EOF
LITELLM_LOCAL_MODEL_COST_MAP=True LITELLM_LOG=ERROR DISABLE_SCHEMA_UPDATE=true \
    setsid "${proxy_run[@]}" "$LITELLM_HOME/bin/litellm" --config "$work/litellm.yaml" \
    --host 127.0.0.1 --port "$LITELLM_PORT" >"$work/litellm.log" 2>&1 &
pids+=($!)
litellm_pid=$!
wait_ready "http://127.0.0.1:$LITELLM_PORT/health/liveliness" "$litellm_pid" "$work/litellm.log"

# --- the runs ------------------------------------------------------------------------------
results="$work/results.tsv"
: >"$results"

run() { # PROXY SCENARIO STREAM CONNECTIONS
    local proxy="$1" scenario="$2" stream="$3" connections="$4" port pid key door prefix=""
    local model=$WHOLE_MODEL
    [[ "$stream" == 1 ]] && model=$STREAM_MODEL
    door="${scenario%-thread}"
    if [[ "$proxy" == contexture ]]; then
        port=$CONTEXTURE_PORT pid=$contexture_pid key=$contexture_key
    else
        port=$LITELLM_PORT pid=$litellm_pid key=$litellm_key
    fi
    [[ "$scenario" == *-thread ]] && prefix="$proxy-$stream-$connections"
    local name="$proxy-$scenario-$stream-$connections"
    export PROXY_BENCH_KEY="$key"
    "${wrk_run[@]}" -t"$connections" -c"$connections" -d"$WARMUP" -s "$SCRIPT" "http://127.0.0.1:$port" -- \
        "$door" "$stream" "${prefix:+warm-$prefix}" "$TURNS_PER_THREAD" "$model" >"$work/$name.warm.txt"
    local procs before after
    # shellcheck disable=SC2046
    procs="$(group_of "$pid")"
    # shellcheck disable=SC2086
    before=$(cpu_of $procs)
    "${wrk_run[@]}" -t"$connections" -c"$connections" -d"$DURATION" --latency -s "$SCRIPT" \
        "http://127.0.0.1:$port" -- "$door" "$stream" "$prefix" "$TURNS_PER_THREAD" "$model" \
        >"$work/$name.txt"
    # shellcheck disable=SC2086
    after=$(cpu_of $procs)
    local rss seconds p50 p99
    # shellcheck disable=SC2086
    rss=$(rss_of $procs)
    seconds=$(awk '/requests in/ {for (i = 1; i <= NF; i++) if ($i ~ /s,$/) {sub(/s,/, "", $i); print $i}}' "$work/$name.txt")
    p50=$(awk '/^ +50%/ {print $2}' "$work/$name.txt")
    p99=$(awk '/^ +99%/ {print $2}' "$work/$name.txt")
    awk -v proxy="$proxy" -v scenario="$scenario" -v stream="$stream" -v conns="$connections" \
        -v secs="$seconds" -v p50="$p50" -v p99="$p99" -v rss="$rss" \
        -v cpu="$(awk -v a="$before" -v b="$after" 'BEGIN{print b - a}')" \
        '/^RESULT/ {
            n = $2; errors = $3
            printf "%s\t%s\t%s\t%s\t%d\t%d\t%.0f\t%s\t%s\t%.3f\t%.0f\n", proxy, scenario,
                stream ? "streamed" : "whole", conns, n, errors, n / secs, p50, p99,
                n ? cpu * 1000 / n : 0, rss / 1024
        }' "$work/$name.txt" | tee -a "$results" >&2
}

for connections in $CONNECTIONS; do
    for stream in $STREAMS; do
        for scenario in $SCENARIOS; do
            echo "== $scenario, $([[ $stream == 1 ]] && echo streamed || echo whole), $connections connections, $DURATION" >&2
            run contexture "$scenario" "$stream" "$connections"
            [[ "$scenario" == *-thread ]] || run litellm "$scenario" "$stream" "$connections"
        done
    done
done

echo
echo "Contexture $("$BIN" --version 2>/dev/null | head -1) (SQLite) and LiteLLM $LITELLM_VERSION" \
    "in front of nginx $(nginx -v 2>&1 | sed 's/.*\///'); $(nproc) cores; wrk -tN -cN -d$DURATION"
echo
echo "| proxy | scenario | answer | connections | requests | errors | requests/s | p50 | p99 | CPU ms/request | resident MB |"
echo "|---|---|---|---|---|---|---|---|---|---|---|"
awk -F'\t' '{printf "| %s | %s | %s | %s | %s | %s | %s | %s | %s | %s | %s |\n", $1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11}' "$results"
echo
echo "LiteLLM's CPU per request over Contexture's (chat-thread against LiteLLM's chat):"
awk -F'\t' '
    { cpu[$1 FS $2 FS $3 FS $4] = $10 }
    END {
        for (key in cpu) {
            split(key, k, FS)
            if (k[1] != "contexture") continue
            peer = k[2]; sub(/-thread$/, "", peer)
            other = cpu["litellm" FS peer FS k[3] FS k[4]]
            if (other != "" && cpu[key] > 0)
                printf "  %s, %s, %s connections: %.0fx\n", k[2], k[3], k[4], other / cpu[key]
        }
    }' "$results" | sort
echo "raw outputs: $work" >&2
