#!/usr/bin/env python3
"""Reading a long thread for fitting: `GET /v1/threads/{id}/context` on one thread of N
messages, served by `contexture serve` over SQLite. Prints the append time, five sequential
reads, and six concurrent reads with the server's resident memory (VmRSS, VmHWM).
See "Fitting a long thread over HTTP" in docs/benchmarks.md.

    python3 benches/server/long_thread.py [BIN] [MESSAGES]
    # BIN: target/release/contexture (build it first); MESSAGES: 100000

Needs only the Python standard library; uses port 18123 and a fresh temporary directory.
"""
import concurrent.futures
import json
import os
import subprocess
import sys
import tempfile
import time
import urllib.request

BIN = sys.argv[1] if len(sys.argv) > 1 else "target/release/contexture"
MESSAGES = int(sys.argv[2]) if len(sys.argv) > 2 else 100_000
PORT = 18123
BASE = f"http://127.0.0.1:{PORT}"
MODEL = "gpt-4o-mini"


def call(method, path, body=None):
    data = None if body is None else json.dumps(body).encode()
    request = urllib.request.Request(
        BASE + path, data=data, method=method, headers={"content-type": "application/json"}
    )
    with urllib.request.urlopen(request, timeout=600) as response:
        return json.loads(response.read())


def memory(pid, key):
    with open(f"/proc/{pid}/status") as status:
        for line in status:
            if line.startswith(key):
                return line.split(":")[1].strip()
    return "?"


def main():
    work = tempfile.mkdtemp(prefix="contexture-long-thread-")
    config = os.path.join(work, "contexture.toml")
    with open(config, "w") as file:
        file.write(
            f'bind = "127.0.0.1:{PORT}"\ndatabase = "sqlite:{work}/long.db"\n'
            '[auth]\nanonymous_tenant = "bench"\n'
            "[limits]\nrequests_per_second = 0.0\nmax_body_bytes = 16777216\n"
        )
    server = subprocess.Popen(
        [BIN, "serve", "--config", config], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
    )
    try:
        for _ in range(100):
            try:
                urllib.request.urlopen(BASE + "/healthz")
                break
            except OSError:
                time.sleep(0.1)
        started = time.time()
        for batch in range(MESSAGES // 1000):
            messages = [
                {
                    "role": "user" if i % 2 == 0 else "assistant",
                    "content": f"message {batch * 1000 + i}: the quick brown fox jumps over the lazy dog",
                }
                for i in range(1000)
            ]
            call("POST", "/v1/threads/long/messages", {"messages": messages})
        print(f"appended {MESSAGES} messages in {time.time() - started:.1f} s")
        print("server memory before reads:", memory(server.pid, "VmRSS"))
        path = f"/v1/threads/long/context?model={MODEL}"
        times = []
        for _ in range(5):
            started = time.time()
            answer = call("GET", path)
            times.append(time.time() - started)
        print(
            "sequential reads:",
            " ".join(f"{t * 1000:.0f} ms" for t in times),
            f"({len(answer['messages'])} messages sent)",
        )
        started = time.time()
        with concurrent.futures.ThreadPoolExecutor(6) as pool:
            list(pool.map(lambda _: call("GET", path), range(6)))
        print(
            f"6 concurrent reads: {(time.time() - started) * 1000:.0f} ms;",
            "memory:", memory(server.pid, "VmRSS"), "peak:", memory(server.pid, "VmHWM"),
        )
    finally:
        server.terminate()
        server.wait()


if __name__ == "__main__":
    main()
