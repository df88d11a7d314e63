#!/usr/bin/env bash
# Whole-process exact token counting of a 100 MB file: `contexture tokens count` against
# quicktok (PyPI `quicktok-v1`, an exact C++ BPE), for cl100k_base and o200k_base, in one
# run. See "Token counting: a 100 MB file, whole process" in docs/benchmarks.md.
#
#   benches/tokens/run.sh
#
# The file is the repository's own text (its Rust, Markdown, Python, JSON and YAML files in
# `git ls-files` order) repeated to 100 MB, made once under target/. Each tool runs REPEATS
# times, alternating with the other, and the best wall time and the peak resident memory are
# printed; both must give the same count. The peer is installed into its own venv
# (target/tokens-bench-venv, made once). Settings (environment): REPEATS=3 SIZE_MB=100
# BIN=target/release/contexture SKIP_BUILD=1 (use BIN as it is).
set -euo pipefail
cd "$(dirname "$0")/../.."
REPEATS="${REPEATS:-3}"
SIZE_MB="${SIZE_MB:-100}"
BIN="${BIN:-$PWD/target/release/contexture}"
VENV="${BENCH_VENV:-target/tokens-bench-venv}"
FILE="target/tokens-bench-${SIZE_MB}mb.txt"

if [[ -z "${SKIP_BUILD:-}" ]]; then
    cargo build --release -p contexture-cli >&2
fi
[ -x "$VENV/bin/python" ] || python3 -m venv "$VENV"
"$VENV/bin/python" -m pip install --quiet 'quicktok-v1==0.4.0'

if [[ ! -f "$FILE" ]]; then
    mapfile -t sources < <(git ls-files '*.rs' '*.md' '*.py' '*.json' '*.yaml')
    target=$((SIZE_MB * 1000 * 1000))
    : >"$FILE.part"
    while (($(stat -c %s "$FILE.part") < target)); do
        cat "${sources[@]}" >>"$FILE.part"
    done
    head -c "$target" "$FILE.part" >"$FILE.cut"
    # Cut at a line end, so the file is valid UTF-8.
    "$VENV/bin/python" -c "
import sys
data = open(sys.argv[1], 'rb').read()
open(sys.argv[2], 'wb').write(data[: data.rfind(b'\n') + 1])
" "$FILE.cut" "$FILE"
    rm -f "$FILE.part" "$FILE.cut"
fi

measure() { # NAME ENCODING COMMAND...: prints 'count seconds kilobytes'
    local out
    out="$({ /usr/bin/time -f '%e %M' "${@:3}" >"$work/count"; } 2>&1 | tail -1)"
    echo "$(cat "$work/count") $out"
}

work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
# The peer's whole process: start Python, read the file, count.
cat >"$work/quicktok_count.py" <<'PY'
import sys, quicktok
encoding = quicktok.get_encoding(sys.argv[1])
with open(sys.argv[2], encoding="utf-8") as f:
    print(encoding.count(f.read()))
PY
printf 'file: %s (%s bytes)\n\n' "$FILE" "$(stat -c %s "$FILE")"
printf '| encoding | tool | best wall | peak resident | count |\n|---|---|---|---|---|\n'
for encoding in cl100k_base o200k_base; do
    best_ours=999999 best_peer=999999 mem_ours=0 mem_peer=0 count_ours="" count_peer=""
    for _ in $(seq "$REPEATS"); do
        read -r count_ours secs kb < <(measure contexture "$encoding" \
            "$BIN" tokens count --encoding "$encoding" "$FILE")
        best_ours="$(printf '%s\n%s\n' "$best_ours" "$secs" | sort -g | head -1)"
        ((kb > mem_ours)) && mem_ours=$kb
        read -r count_peer secs kb < <(measure quicktok "$encoding" \
            "$VENV/bin/python" "$work/quicktok_count.py" "$encoding" "$FILE")
        best_peer="$(printf '%s\n%s\n' "$best_peer" "$secs" | sort -g | head -1)"
        ((kb > mem_peer)) && mem_peer=$kb
    done
    if [[ "$count_ours" != "$count_peer" ]]; then
        echo "tokens/run.sh: $encoding counts differ: contexture $count_ours, quicktok $count_peer" >&2
        exit 1
    fi
    printf '| %s | contexture | %s s | %s MB | %s |\n' "$encoding" "$best_ours" "$((mem_ours / 1024))" "$count_ours"
    printf '| %s | quicktok | %s s | %s MB | %s |\n' "$encoding" "$best_peer" "$((mem_peer / 1024))" "$count_peer"
    ratio="$("$VENV/bin/python" -c "print(f'{$best_peer / $best_ours:.2f}')")"
    printf '| %s | quicktok / contexture | %sx | | |\n' "$encoding" "$ratio"
done
