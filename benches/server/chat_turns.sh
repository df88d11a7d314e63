#!/usr/bin/env bash
# Benchmark of the chat turn: the server's CPU per chat turn on a thread (the turn stored,
# the thread fitted, the upstream called, the answer recorded) through its doors: the chat
# endpoint (`POST /v1/chat/completions` with X-Contexture-Thread) and the Responses door
# (`POST /v1/responses` chained by `previous_response_id`), against a local fake upstream,
# on SQLite, for one or more builds of `contexture` in one run (builds and doors alternate,
# ROUNDS times, so that a noisy machine weighs on each alike). See "The chat endpoint's CPU
# per turn" and "The Responses door's CPU per turn" in docs/benchmarks.md.
#
#   benches/server/chat_turns.sh                                   # this tree's build
#   BUILDS="before=/tmp/before/contexture after=target/release/contexture" DOORS=chat \
#       SKIP_BUILD=1 benches/server/chat_turns.sh                    # two builds compared
#
# Needs wrk and curl. Settings (environment):
#   BUILDS="NAME=BIN ..." (default: this tree's release build) DOORS="chat responses"
#   ROUNDS=3 CLIENTS=8 MAX_CHAT_TURNS=256 (the tenant's turns in flight; over CLIENTS, so
#   that no turn is refused)
#   DURATION=20s WARMUP=5s TURNS_PER_THREAD=50 MODEL=gpt-4o-mini PORT=18089
#   UPSTREAM_PORT=18090 UPSTREAM_BIN=target/release/contexture-fake-upstream
#   SKIP_BUILD=1 (use the binaries as they are)
#   SERVE_CONFIG="[compaction]\ntrigger = { window_share = 0.8 }" (more of the server's
#   configuration, after its `[limits]`; printf escapes)
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
root="$(cd "$here/../.." && pwd)"
cd "$root"

ROUNDS="${ROUNDS:-3}"
CLIENTS="${CLIENTS:-8}"
MAX_CHAT_TURNS="${MAX_CHAT_TURNS:-256}"
DURATION="${DURATION:-20s}"
WARMUP="${WARMUP:-5s}"
TURNS_PER_THREAD="${TURNS_PER_THREAD:-50}"
MODEL="${MODEL:-gpt-4o-mini}"
PORT="${PORT:-18089}"
UPSTREAM_PORT="${UPSTREAM_PORT:-18090}"
BUILDS="${BUILDS:-this=$root/target/release/contexture}"
DOORS="${DOORS:-chat responses}"
UPSTREAM_BIN="${UPSTREAM_BIN:-$root/target/release/contexture-fake-upstream}"
SCRIPT="$here/chat_turns.lua"
ADDR="127.0.0.1:$PORT"

for tool in wrk curl; do
    command -v "$tool" >/dev/null || { echo "chat_turns.sh: $tool is not installed" >&2; exit 1; }
done
if [[ -z "${SKIP_BUILD:-}" ]]; then
    echo "== cargo build --release -p contexture-cli -p contexture-fake-upstream" >&2
    cargo build --release -p contexture-cli -p contexture-fake-upstream >&2
fi
for build in $BUILDS; do
    [[ -x "${build#*=}" ]] || { echo "chat_turns.sh: no binary at ${build#*=}" >&2; exit 1; }
done
[[ -x "$UPSTREAM_BIN" ]] || { echo "chat_turns.sh: no fake upstream at $UPSTREAM_BIN" >&2; exit 1; }

work="$(mktemp -d /tmp/contexture-chat-bench.XXXXXX)"
server_pid=""
upstream_pid=""
cleanup() {
    for pid in "$server_pid" "$upstream_pid"; do
        if [[ -n "$pid" ]] && kill -0 "$pid" 2>/dev/null; then
            kill "$pid" 2>/dev/null || true
            wait "$pid" 2>/dev/null || true
        fi
    done
}
trap cleanup EXIT

# shellcheck source=benches/server/cpu.sh
source "$here/cpu.sh"

"$UPSTREAM_BIN" "127.0.0.1:$UPSTREAM_PORT" 2>"$work/upstream.log" &
upstream_pid=$!
sleep 0.5
kill -0 "$upstream_pid" 2>/dev/null || { cat "$work/upstream.log" >&2; exit 1; }

results="$work/results.tsv"
printf '[limits]\nmax_chat_turns = %d\n%b\n' "$MAX_CHAT_TURNS" "${SERVE_CONFIG:-}" >"$work/serve.toml"
: >"$results"

run_build() { # NAME BIN ROUND DOOR
    local name="$1" bin="$2" round="$3" door="$4" dir="$work/$1-$4-$3" key
    mkdir -p "$dir"
    key="$("$bin" keys create --tenant bench --name bench --db "sqlite:$dir/chat.db" 2>/dev/null)"
    export CONTEXTURE_BENCH_KEY="$key"
    CONTEXTURE_RATE_LIMIT=0 CONTEXTURE_LOG=warn \
        CONTEXTURE_UPSTREAM_URL="http://127.0.0.1:$UPSTREAM_PORT/v1" \
        "$bin" serve --config "$work/serve.toml" --db "sqlite:$dir/chat.db" --bind "$ADDR" \
        2>"$dir/server.log" &
    server_pid=$!
    local ready=""
    for _ in $(seq 1 200); do
        if curl -fsS "http://$ADDR/readyz" >/dev/null 2>&1; then ready=1; break; fi
        kill -0 "$server_pid" 2>/dev/null || break
        sleep 0.1
    done
    [[ -n "$ready" ]] || { cat "$dir/server.log" >&2; exit 1; }
    wrk -t2 -c2 -d"$WARMUP" -s "$SCRIPT" "http://$ADDR" -- "warm-$name-$round" \
        "$TURNS_PER_THREAD" "$MODEL" "$door" >"$dir/warmup.txt"
    local server_before upstream_before server_after upstream_after
    server_before=$(cpu_of "$server_pid")
    upstream_before=$(cpu_of "$upstream_pid")
    wrk -t"$CLIENTS" -c"$CLIENTS" -d"$DURATION" --latency -s "$SCRIPT" "http://$ADDR" -- \
        "run-$name-$round" "$TURNS_PER_THREAD" "$MODEL" "$door" >"$dir/wrk.txt"
    server_after=$(cpu_of "$server_pid")
    upstream_after=$(cpu_of "$upstream_pid")
    kill "$server_pid"
    wait "$server_pid" 2>/dev/null || true
    server_pid=""
    local seconds p50 p99
    seconds=$(awk '/requests in/ {for (i = 1; i <= NF; i++) if ($i ~ /s,$/) {sub(/s,/, "", $i); print $i}}' "$dir/wrk.txt")
    p50=$(awk '/^ +50%/ {print $2}' "$dir/wrk.txt")
    p99=$(awk '/^ +99%/ {print $2}' "$dir/wrk.txt")
    awk -v name="$name" -v door="$door" -v round="$round" -v secs="$seconds" -v p50="$p50" -v p99="$p99" \
        -v server="$(awk -v a="$server_before" -v b="$server_after" 'BEGIN{print b - a}')" \
        -v upstream="$(awk -v a="$upstream_before" -v b="$upstream_after" 'BEGIN{print b - a}')" \
        '/^RESULT/ {
            turns = $2; errors = $3
            printf "%s\t%s\t%s\t%d\t%d\t%.1f\t%s\t%s\t%.3f\t%.3f\n", name, door, round, turns, errors,
                turns / secs, p50, p99, server * 1000 / turns, upstream * 1000 / turns
        }' "$dir/wrk.txt" | tee -a "$results" >&2
}

for round in $(seq 1 "$ROUNDS"); do
    for build in $BUILDS; do
        for door in $DOORS; do
            echo "== round $round: ${build%%=*}, $door, $CLIENTS clients, $DURATION" >&2
            run_build "${build%%=*}" "${build#*=}" "$round" "$door"
        done
    done
done

echo
echo "chat turns on threads (SQLite, fake upstream); $(nproc) cores;" \
    "wrk -t$CLIENTS -c$CLIENTS -d$DURATION; a new thread every $TURNS_PER_THREAD turns"
echo
echo "| build | door | round | turns | errors | turns/s | p50 | p99 | server CPU ms/turn | upstream CPU ms/turn |"
echo "|---|---|---|---|---|---|---|---|---|---|"
awk -F'\t' '{printf "| %s | %s | %s | %s | %s | %s | %s | %s | %s | %s |\n", $1, $2, $3, $4, $5, $6, $7, $8, $9, $10}' "$results"
echo
echo "median server CPU per turn (ms):"
for build in $BUILDS; do
    for door in $DOORS; do
        name="${build%%=*}"
        awk -F'\t' -v name="$name" -v door="$door" '$1 == name && $2 == door {print $9}' "$results" | sort -n |
            awk -v label="$name $door" '{v[NR] = $1} END {m = (NR % 2) ? v[(NR + 1) / 2] : (v[NR / 2] + v[NR / 2 + 1]) / 2; printf "  %s: %.3f\n", label, m}'
    done
done
echo "raw outputs: $work" >&2
