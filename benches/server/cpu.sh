# Sourced by the server benchmarks: the CPU a process used.

# CPU seconds (user + system) of the processes whose ids are given, added up.
cpu_of() {
    local ticks=0 pid stat
    for pid in "$@"; do
        stat="$(cat "/proc/$pid/stat" 2>/dev/null)" || continue
        stat="${stat##*) }" # fields from 3 on; utime and stime are fields 14 and 15
        read -r -a f <<<"$stat"
        ticks=$((ticks + f[11] + f[12]))
    done
    echo "$ticks $(getconf CLK_TCK)" | awk '{printf "%.3f", $1 / $2}'
}
