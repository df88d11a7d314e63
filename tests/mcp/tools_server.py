"""An MCP server for Contexture's tests (the Python `mcp` package, 2.x).

Usage:
    tools_server.py [--name NAME] [--project PATH] [--tools a,b]              # over stdio
    tools_server.py --http PORT [--name NAME] [--project PATH] [--tools a,b]  # streamable HTTP at /mcp

Its tools show what a client sent and make the failures a client must survive: a tool
error, a slow call, and a crash of the whole server in the middle of a call.
"""

import argparse
import os
import sys

import anyio
from mcp.server import MCPServer
from mcp.server.mcpserver import Context
from mcp.server.mcpserver.exceptions import ToolError

parser = argparse.ArgumentParser()
parser.add_argument("--http", type=int, default=None)
parser.add_argument("--name", default="test-tools")
parser.add_argument("--project", default=None)
parser.add_argument("--tools", default=None, help="offer only these tools (comma-separated)")
options = parser.parse_args()

server = MCPServer(options.name, instructions="Tools for Contexture's tests.", version="1.0.0")


@server.tool()
def echo(text: str) -> str:
    """Answers with the text it was given."""
    return text


@server.tool()
def add(a: int, b: int) -> int:
    """Adds two integers."""
    return a + b


@server.tool()
def search(query: str) -> str:
    """Searches this server's little index: answers which server saw the query."""
    return f"{options.name} found: {query}"


@server.tool()
def project() -> dict:
    """Tells the project path this server was started with, and its LOG variable."""
    return {"project": options.project, "log": os.environ.get("LOG"), "home": os.environ.get("HOME")}


@server.tool()
def pid() -> int:
    """Tells this server's process id."""
    return os.getpid()


@server.tool()
def whoami(ctx: Context) -> dict:
    """Tells the Authorization header of the call (over HTTP)."""
    headers = ctx.headers
    return {"authorization": headers.get("authorization") if headers else None}


@server.tool()
def fail(reason: str) -> str:
    """Fails with the reason given."""
    raise ToolError(f"failed on purpose: {reason}")


@server.tool()
async def sleep(seconds: float) -> str:
    """Sleeps, then answers."""
    await anyio.sleep(seconds)
    return f"slept {seconds} s"


@server.tool()
def crash() -> str:
    """Ends the whole server at once, in the middle of the call."""
    print("crashing on purpose: the server ends now", file=sys.stderr, flush=True)
    os._exit(3)


if options.tools is not None:
    offered = set(options.tools.split(","))
    for name in ["echo", "add", "search", "project", "pid", "whoami", "fail", "sleep", "crash"]:
        if name not in offered:
            server.remove_tool(name)

if __name__ == "__main__":
    print(f"{options.name} starting", file=sys.stderr, flush=True)
    if options.http is None:
        server.run()
    else:
        server.run("streamable-http", host="127.0.0.1", port=options.http)
