#!/usr/bin/env bash
# Benchmark of `contexture serve`: "append one message + get the fitted projection", on
# SQLite and on PostgreSQL, with 1 and 32 concurrent clients, measured with wrk on loopback.
# See the section "contexture serve: append + fitted projection" of docs/benchmarks.md.
#
#   benches/server/run.sh                  # both stores
#   STORES=sqlite benches/server/run.sh    # one of them
#
# Needs wrk (`apt-get install wrk`), curl, and for PostgreSQL psql and a server at PG_URL.
# Settings (environment):
#   DURATION=20s WARMUP=5s CLIENTS="1 32" PAIRS_PER_THREAD=100 SEED_MESSAGES=20
#   MODEL=gpt-4o-mini PORT=18089 STORES="sqlite postgres"
#   SQLITE_DIR=<fresh temporary directory>   (e.g. /dev/shm to take the disk out)
#   PG_URL=postgres://postgres@127.0.0.1:5432/test  PG_SCHEMA=contexture_bench (dropped and
#   recreated: every run starts from empty tables)
#   BIN=target/release/contexture  SKIP_BUILD=1 (use BIN as it is)
#   KEEP_DB=1 with SQLITE_DIR: go on with the SQLite file an earlier run left (a grown file)
#   CONTEXTURE_LOG=warn (the server's log filter; its log is kept with the raw outputs)
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
root="$(cd "$here/../.." && pwd)"
cd "$root"

DURATION="${DURATION:-20s}"
WARMUP="${WARMUP:-5s}"
CLIENTS="${CLIENTS:-1 32}"
PAIRS_PER_THREAD="${PAIRS_PER_THREAD:-100}"
SEED_MESSAGES="${SEED_MESSAGES:-20}"
MODEL="${MODEL:-gpt-4o-mini}"
PORT="${PORT:-18089}"
STORES="${STORES:-sqlite postgres}"
PG_URL="${PG_URL:-postgres://postgres@127.0.0.1:5432/test}"
PG_SCHEMA="${PG_SCHEMA:-contexture_bench}"
BIN="${BIN:-$root/target/release/contexture}"
SCRIPT="$here/append_and_fit.lua"
ADDR="127.0.0.1:$PORT"

for tool in wrk curl; do
    command -v "$tool" >/dev/null || { echo "run.sh: $tool is not installed" >&2; exit 1; }
done

if [[ -z "${SKIP_BUILD:-}" ]]; then
    echo "== cargo build --release -p contexture-cli" >&2
    cargo build --release -p contexture-cli >&2
fi
[[ -x "$BIN" ]] || { echo "run.sh: no binary at $BIN" >&2; exit 1; }

work="$(mktemp -d /tmp/contexture-bench.XXXXXX)"
SQLITE_DIR="${SQLITE_DIR:-$work}"
server_pid=""
cleanup() {
    if [[ -n "$server_pid" ]] && kill -0 "$server_pid" 2>/dev/null; then
        kill "$server_pid" 2>/dev/null || true
        wait "$server_pid" 2>/dev/null || true
    fi
}
trap cleanup EXIT

# shellcheck source=benches/server/cpu.sh
source "$here/cpu.sh"
postgres_pids() { pgrep -x postgres || true; }

start_server() { # DB_URL
    local db="$1" log="$work/server-$2.log"
    CONTEXTURE_RATE_LIMIT=0 CONTEXTURE_LOG="${CONTEXTURE_LOG:-warn}" "$BIN" serve --db "$db" --bind "$ADDR" \
        2>"$log" &
    server_pid=$!
    for _ in $(seq 1 200); do
        if curl -fsS "http://$ADDR/readyz" >/dev/null 2>&1; then return 0; fi
        kill -0 "$server_pid" 2>/dev/null || { cat "$log" >&2; exit 1; }
        sleep 0.1
    done
    echo "run.sh: the server did not become ready" >&2
    cat "$log" >&2
    exit 1
}

stop_server() {
    kill "$server_pid"
    wait "$server_pid" 2>/dev/null || true
    server_pid=""
}

results="$work/results.tsv"
: >"$results"

run_store() { # NAME DB_URL
    local store="$1" db="$2" key
    key="$("$BIN" keys create --tenant "bench-$store" --name bench --db "$db" 2>/dev/null)"
    export CONTEXTURE_BENCH_KEY="$key"
    start_server "$db" "$store"
    local stamp
    stamp="$(date +%s)"
    echo "== $store: warm-up $WARMUP, 2 clients" >&2
    wrk -t2 -c2 -d"$WARMUP" -s "$SCRIPT" "http://$ADDR" -- "warm-$stamp" \
        "$PAIRS_PER_THREAD" "$SEED_MESSAGES" "$MODEL" >"$work/$store-warmup.txt"
    grep -m1 '^clients' "$work/$store-warmup.txt" >&2
    local clients
    for clients in $CLIENTS; do
        echo "== $store: $clients client(s), $DURATION" >&2
        local out="$work/$store-c$clients.txt" pg_before=0 pg_after=0 server_before server_after
        server_before=$(cpu_of "$server_pid")
        if [[ "$store" == postgres ]]; then
            # shellcheck disable=SC2046
            pg_before=$(cpu_of $(postgres_pids))
        fi
        local TIMEFORMAT='%U %S'
        { time wrk -t"$clients" -c"$clients" -d"$DURATION" --latency -s "$SCRIPT" \
            "http://$ADDR" -- "c$clients-$stamp" "$PAIRS_PER_THREAD" "$SEED_MESSAGES" \
            "$MODEL" >"$out"; } 2>"$work/$store-c$clients.time"
        server_after=$(cpu_of "$server_pid")
        if [[ "$store" == postgres ]]; then
            # shellcheck disable=SC2046
            pg_after=$(cpu_of $(postgres_pids))
        fi
        cat "$out" >&2
        local wrk_cpu seconds
        wrk_cpu=$(tail -n1 "$work/$store-c$clients.time" | awk '{printf "%.2f", $1 + $2}')
        seconds=$(awk '/^clients/ {print $3 + 0}' "$out")
        awk -v store="$store" -v clients="$clients" -v secs="$seconds" \
            -v server="$(awk -v a="$server_before" -v b="$server_after" 'BEGIN{print b - a}')" \
            -v pg="$(awk -v a="$pg_before" -v b="$pg_after" 'BEGIN{print b - a}')" \
            -v wrkcpu="$wrk_cpu" \
            '/^RESULT/ {
                printf "%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%.2f\t%.2f\t%.2f\t%s..%s\n",
                    store, clients, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13,
                    server / secs, pg / secs, wrkcpu / secs, $14, $15
            }' "$out" >>"$results"
        local wrk_p50 wrk_p99
        wrk_p50=$(awk '/^ +50%/ {print $2}' "$out")
        wrk_p99=$(awk '/^ +99%/ {print $2}' "$out")
        echo "   wrk's own histogram (every request, seeds included): p50 $wrk_p50, p99 $wrk_p99" >&2
    done
    stop_server
}

for store in $STORES; do
    case "$store" in
    sqlite)
        if [[ -z "${KEEP_DB:-}" ]]; then
            rm -f "$SQLITE_DIR/bench.db" "$SQLITE_DIR/bench.db-wal" "$SQLITE_DIR/bench.db-shm"
        fi
        run_store sqlite "sqlite:$SQLITE_DIR/bench.db"
        ;;
    postgres)
        psql "$PG_URL" -q -v ON_ERROR_STOP=1 \
            -c "DROP SCHEMA IF EXISTS $PG_SCHEMA CASCADE" -c "CREATE SCHEMA $PG_SCHEMA" >&2
        run_store postgres "$PG_URL?options=-c%20search_path%3D$PG_SCHEMA"
        [[ -n "${KEEP_SCHEMA:-}" ]] ||
            psql "$PG_URL" -q -c "DROP SCHEMA IF EXISTS $PG_SCHEMA CASCADE" >&2
        ;;
    *)
        echo "run.sh: unknown store $store" >&2
        exit 1
        ;;
    esac
done

echo
echo "append one message + GET /v1/threads/{id}/context?model=$MODEL; $(nproc) cores;" \
    "wrk -tN -cN -d$DURATION; fitted history $SEED_MESSAGES+1..$((SEED_MESSAGES + PAIRS_PER_THREAD)) messages"
echo "(latencies in ms; pair = append then fit, one operation; CPU in cores used on average)"
echo
echo "| store | clients | pairs/s | requests/s | pair p50 | pair p90 | pair p99 | pair max | append p50 | append p99 | fit p50 | fit p99 | errors | server CPU | postgres CPU | wrk CPU | fitted msgs |"
echo "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|"
awk -F'\t' '{
    printf "| %s | %s | %s | %s | %.2f | %.2f | %.2f | %.2f | %.2f | %.2f | %.2f | %.2f | %s | %s | %s | %s | %s |\n",
        $1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13, $14, ($1 == "postgres" ? $15 : "-"), $16, $17
}' "$results"
echo
echo "raw outputs: $work" >&2
