"""Drives Contexture's MCP server with the Python `mcp` package's client (2.x), as an MCP
host would: initialize, list the tools, then call them in order.

Usage:
    contexture_client.py CALLS.json --stdio PROGRAM [ARG...]   # starts `contexture mcp`
    contexture_client.py CALLS.json --http URL [--key KEY]     # streamable HTTP (/mcp)

CALLS.json holds a list of {"tool": NAME, "arguments": {...}}; a call may wait for an earlier
answer's field with {"$from": [INDEX, "field"]} as an argument's value. Prints one JSON
object: the tools listed and each call's result (isError, its text, its structured content).
"""

import json
import sys

import anyio
import httpx2
from mcp import ClientSession, StdioServerParameters
from mcp.client.stdio import stdio_client
from mcp.client.streamable_http import streamable_http_client


def resolve(value, results):
    if isinstance(value, dict):
        if set(value) == {"$from"}:
            index, field = value["$from"]
            return results[index]["structured"][field]
        return {key: resolve(item, results) for key, item in value.items()}
    if isinstance(value, list):
        return [resolve(item, results) for item in value]
    return value


async def drive(session, calls):
    initialized = await session.initialize()
    listed = await session.list_tools()
    results = []
    for call in calls:
        arguments = resolve(call.get("arguments", {}), results)
        result = await session.call_tool(call["tool"], arguments)
        text = "".join(block.text for block in result.content if block.type == "text")
        results.append(
            {
                "tool": call["tool"],
                "isError": bool(result.is_error),
                "text": text,
                "structured": result.structured_content,
            }
        )
    return {
        "server": initialized.server_info.name,
        "protocol": initialized.protocol_version,
        "tools": [
            {"name": tool.name, "description": tool.description, "inputSchema": tool.input_schema}
            for tool in listed.tools
        ],
        "results": results,
    }


async def main():
    calls = json.load(open(sys.argv[1]))
    mode = sys.argv[2]
    if mode == "--stdio":
        params = StdioServerParameters(command=sys.argv[3], args=sys.argv[4:])
        async with stdio_client(params) as (read, write):
            async with ClientSession(read, write) as session:
                summary = await drive(session, calls)
    elif mode == "--http":
        url = sys.argv[3]
        headers = {}
        if len(sys.argv) > 5 and sys.argv[4] == "--key":
            headers["Authorization"] = f"Bearer {sys.argv[5]}"
        async with httpx2.AsyncClient(headers=headers, timeout=60) as http:
            async with streamable_http_client(url, http_client=http) as streams:
                read, write = streams[0], streams[1]
                async with ClientSession(read, write) as session:
                    summary = await drive(session, calls)
    else:
        raise SystemExit(f"unknown mode {mode}")
    print(json.dumps(summary))


anyio.run(main)
