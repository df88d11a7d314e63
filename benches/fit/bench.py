"""The measurements of benches/fit/run.sh: whole processes, each started REPEATS times,
alternating, on the same history file. Prints the median and best wall time and the peak
resident memory of each, and the ratio of the medians."""

import json
import os
import pathlib
import statistics
import subprocess
import sys
import time

ROOT = pathlib.Path(__file__).resolve().parents[2]
REPEATS = int(os.environ.get("REPEATS", "9"))
BUDGET = int(os.environ.get("BUDGET", "8000"))


def corpus() -> str:
    """The repository's own text: Rust sources and docs."""
    files = sorted([*ROOT.glob("crates/*/src/**/*.rs"), *ROOT.glob("docs/*.md")])
    return "\n".join(path.read_text(encoding="utf-8") for path in files)


def history(turns=2500):
    """A 10,000-message tool-calling history of about 23 MB: per turn a question, a tool
    call, its result (about 8 KB of the repository's text) and an answer."""
    text = corpus()
    at = 0

    def take(size):
        nonlocal at
        if at + size > len(text):
            at = 0
        piece = text[at : at + size]
        at += size
        return piece

    messages = [{"role": "system", "content": "You are a code assistant with a file reading tool."}]
    for turn in range(turns):
        messages.append({"role": "user", "content": f"Question {turn}: {take(300)}"})
        messages.append(
            {
                "role": "assistant",
                "content": None,
                "tool_calls": [
                    {
                        "id": f"call_{turn}",
                        "type": "function",
                        "function": {"name": "read_file", "arguments": json.dumps({"path": f"src/file_{turn}.rs"})},
                    }
                ],
            }
        )
        messages.append({"role": "tool", "tool_call_id": f"call_{turn}", "content": take(8400)})
        messages.append({"role": "assistant", "content": f"Answer {turn}: {take(500)}"})
    return messages[:10_000]


def run(command, output, work):
    """Wall seconds and peak resident kilobytes of one whole process.

    The peak is GNU time's: its own small process starts the command. Python's `wait4` would
    report Python's own peak too, which the kernel counts into the child's when the child
    starts as a copy of Python (fork or vfork) before it runs the command.
    """
    peak = work / "peak"
    with open(output, "wb") as out:
        start = time.perf_counter()
        status = subprocess.run(["/usr/bin/time", "-f", "%M", "-o", str(peak), *command], stdout=out).returncode
        seconds = time.perf_counter() - start
    if status != 0:
        sys.exit(f"fit/bench.py: {command[0]} failed with status {status}")
    return seconds, int(peak.read_text().split()[-1])


def main():
    work = pathlib.Path(sys.argv[1])
    contexture, python = sys.argv[2], sys.argv[3]
    history_file = ROOT / "target" / "fit-bench-history.json"
    if not history_file.exists():
        history_file.write_text(json.dumps(history()), encoding="utf-8")
    size = history_file.stat().st_size
    commands = {
        "contexture fit": [contexture, "fit", "--model", "gpt-4o", "--max-tokens", str(BUDGET), "--start-on", "user", str(history_file)],
        "trim_messages": [python, str(ROOT / "benches" / "fit" / "trim_messages.py"), str(BUDGET), str(history_file)],
    }
    times = {name: [] for name in commands}
    memory = {name: 0 for name in commands}
    for _ in range(REPEATS):
        for name, command in commands.items():
            seconds, kilobytes = run(command, work / f"{name}.json", work)
            times[name].append(seconds)
            memory[name] = max(memory[name], kilobytes)
    messages = len(json.loads(history_file.read_text(encoding="utf-8")))
    print(f"history: {history_file.relative_to(ROOT)}, {messages} messages, {size / 1e6:.1f} MB; budget {BUDGET} tokens; {REPEATS} runs each, alternating")
    print()
    print("| tool | median wall | best wall | peak resident | resident / file | messages kept |")
    print("|---|---|---|---|---|---|")
    for name in commands:
        kept = len(json.loads((work / f"{name}.json").read_text(encoding="utf-8")))
        print(
            f"| {name} | {statistics.median(times[name]) * 1000:.1f} ms | {min(times[name]) * 1000:.1f} ms "
            f"| {memory[name] / 1024:.1f} MB | {memory[name] * 1024 / size:.2f}x | {kept} |"
        )
    ratio = statistics.median(times["trim_messages"]) / statistics.median(times["contexture fit"])
    print(f"| trim_messages / contexture fit | {ratio:.1f}x | | | | |")


if __name__ == "__main__":
    main()
