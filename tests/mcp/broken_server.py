"""A misbehaving MCP peer for Contexture's tests: each mode breaks the protocol one way.

Usage: broken_server.py MODE, MODE one of:
    exit      writes a complaint on standard error and exits with code 3 at once
    silent    reads its input and never answers
    version   answers the handshake with a protocol version nobody speaks
    schema    lists a tool whose input schema is not an object schema
It writes JSON-RPC by hand on purpose: no real server library would break the rules.
"""

import json
import sys
import time

mode = sys.argv[1]

if mode == "exit":
    print("broken_server: missing configuration file /nonexistent.toml", file=sys.stderr, flush=True)
    sys.exit(3)

if mode == "silent":
    print("broken_server: listening, never answering", file=sys.stderr, flush=True)
    while sys.stdin.readline():
        pass
    time.sleep(3600)


def send(message):
    sys.stdout.write(json.dumps(message) + "\n")
    sys.stdout.flush()


for line in sys.stdin:
    request = json.loads(line)
    method = request.get("method")
    if "id" not in request:
        continue
    if method == "initialize":
        version = "1999-01-01" if mode == "version" else request["params"]["protocolVersion"]
        send({"jsonrpc": "2.0", "id": request["id"], "result": {
            "protocolVersion": version,
            "capabilities": {"tools": {}},
            "serverInfo": {"name": "broken", "version": "0"},
        }})
    elif method == "tools/list":
        send({"jsonrpc": "2.0", "id": request["id"], "result": {"tools": [
            {"name": "odd", "description": "takes a string", "inputSchema": {"type": "string"}},
        ]}})
    else:
        send({"jsonrpc": "2.0", "id": request["id"], "result": {}})
