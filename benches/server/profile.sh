#!/usr/bin/env bash
# Where the time of `contexture serve` goes under the append + fit load of run.sh, on SQLite:
# fsync calls per append and their duration (perf trace), context switches per second, and a
# flat CPU profile (perf record, no call graphs) grouped by component. Needs perf, wrk, curl
# and a release build (run.sh builds it).
#
#   benches/server/profile.sh              # 32 clients, the database in a temporary directory
#   CLIENTS=32 DB_DIR=/dev/shm benches/server/profile.sh
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
root="$(cd "$here/../.." && pwd)"
BIN="${BIN:-$root/target/release/contexture}"
CLIENTS="${CLIENTS:-32}"
PORT="${PORT:-18090}"
SCRIPT="$here/append_and_fit.lua"
work="$(mktemp -d /tmp/contexture-profile.XXXXXX)"
DB_DIR="${DB_DIR:-$work}"
db="sqlite:$DB_DIR/profile.db"
rm -f "$DB_DIR/profile.db" "$DB_DIR/profile.db-wal" "$DB_DIR/profile.db-shm"

CONTEXTURE_BENCH_KEY="$("$BIN" keys create --tenant profile --db "$db" 2>/dev/null)"
export CONTEXTURE_BENCH_KEY
CONTEXTURE_RATE_LIMIT=0 CONTEXTURE_LOG=warn "$BIN" serve --db "$db" --bind "127.0.0.1:$PORT" \
    2>"$work/server.log" &
server=$!
trap 'kill "$server" 2>/dev/null || true; wait "$server" 2>/dev/null || true' EXIT
until curl -fsS "http://127.0.0.1:$PORT/readyz" >/dev/null 2>&1; do
    kill -0 "$server" || { cat "$work/server.log" >&2; exit 1; }
    sleep 0.1
done
url="http://127.0.0.1:$PORT"
wrk -t2 -c2 -d3s -s "$SCRIPT" "$url" -- warm >/dev/null

switches() { cat /proc/"$server"/task/*/status | awk '/ctxt_switches/ {n += $2} END {print n}'; }

# 1. fsync: a 20 s load, traced for 10 s in its middle.
wrk -t"$CLIENTS" -c"$CLIENTS" -d20s -s "$SCRIPT" "$url" -- trace >"$work/wrk-trace.txt" &
load=$!
sleep 5
before=$(switches)
perf trace -s -e fsync,fdatasync -p "$server" -o "$work/trace.txt" -- sleep 10
after=$(switches)
wait "$load"
grep '^clients' "$work/wrk-trace.txt"
grep -E '^ +(append|fit) ' "$work/wrk-trace.txt"
echo "server threads: $(ls /proc/"$server"/task | wc -l); context switches: $(((after - before) / 10))/s"
pairs_per_s=$(awk '/^clients/ {gsub(/\(/, "", $7); print $7}' "$work/wrk-trace.txt")
awk -v rate="$pairs_per_s" '/^ +(fsync|fdatasync) / {n += $2; t += $4; if ($7 > m) m = $7}
    END {printf "fsync: %d calls in 10 s (%.2f per pair at %s pairs/s), %.0f ms in all, mean %.3f ms, max %.2f ms\n",
        n, n / (rate * 10), rate, t, t / n, m}' "$work/trace.txt"

# 2. CPU: a flat profile of the server over 10 s of a second load.
wrk -t"$CLIENTS" -c"$CLIENTS" -d20s -s "$SCRIPT" "$url" -- perf >"$work/wrk-perf.txt" &
load=$!
sleep 5
perf record -q -F 499 -p "$server" -o "$work/perf.data" -- sleep 10 2>/dev/null
wait "$load"
echo "server CPU samples by component:"
perf report -i "$work/perf.data" --no-children --sort sym 2>/dev/null | grep -v '^#' | grep '%' |
    awk '{
        p = $1 + 0; line = $0
        if (line ~ /\[k\]/) {
            if (line ~ /finish_task_switch|schedule|_raw_spin_unlock_irq|futex|try_to_wake|select_task|enqueue|dequeue|pick_next/) c = "kernel: scheduling, wake-ups"
            else c = "kernel: other (TCP, file system, interrupts)"
        } else if (line ~ /malloc|free|memmove|memcpy|memset|_int_|unlink_chunk|realloc|cfree|memcmp/) c = "libc: malloc, free, memcpy"
        else if (line ~ /sqlite3|pcache|yy_|wal|btree|Btree|Vdbe|vdbe/) c = "SQLite"
        else if (line ~ /bpe|regex|tokens|Tokeni/) c = "token counting (bpe, regex)"
        else if (line ~ /serde|json|Serialize|Deserialize|to_value|escape|ryu|itoa/) c = "JSON (serde_json)"
        else if (line ~ /hyper|axum|http|h1|tokio|mio|bytes/) c = "hyper, axum, tokio"
        else c = "other"
        share[c] += p
    } END { for (c in share) printf "  %5.1f%%  %s\n", share[c], c }' | sort -rn
echo "top symbols:"
perf report -i "$work/perf.data" --no-children --sort sym 2>/dev/null | grep -v '^#' | grep '%' | head -12
echo "raw outputs: $work" >&2
