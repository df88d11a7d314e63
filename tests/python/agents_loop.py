#!/usr/bin/env python3
"""The OpenAI Agents SDK's default model (Responses) running a long tool loop against
`contexture serve`.

Run by crates/contexture-cli/tests/serve_agents_sdk.rs against a server whose upstream is a
fake that calls `read_log` for parts 1 to 30 and then answers; it can be run by hand against
any `contexture serve` too.

Environment:
  CONTEXTURE_BASE_URL  the server's base URL with /v1, e.g. http://127.0.0.1:8080/v1
  CONTEXTURE_API_KEY   a key made with `contexture keys create` (ctx_...)
  CONTEXTURE_MODEL     the model to name (it must be in the server's registry)
  AGENT_MODE           `whole` (the SDK sends its whole input each turn, its default) or
                       `chained` (auto_previous_response_id: each turn continues the last)

Each log part is about a thousand tokens, so thirty of them do not fit a 16,000-token
window: the server fits every request. Prints one JSON object on stdout; exits non-zero on
any problem.
"""

import asyncio
import json
import os
import sys

try:
    from agents import (
        Agent,
        OpenAIResponsesModel,
        Runner,
        function_tool,
        set_tracing_disabled,
    )
    from openai import AsyncOpenAI
except ImportError as error:
    print(
        f"missing ({error}): python3 -m pip install 'openai-agents==0.24.0'",
        file=sys.stderr,
    )
    sys.exit(3)

set_tracing_disabled(True)

calls = []


@function_tool
def read_log(part: int) -> str:
    """Reads one part of the incident log of node-7."""
    calls.append(part)
    line = f"part {part}: disk pressure on node-7, write latency {part * 7} ms. "
    return f"LOG PART {part} BEGINS. " + line * 45 + f"LOG PART {part} ENDS."


async def main():
    mode = os.environ.get("AGENT_MODE", "whole")
    client = AsyncOpenAI(
        base_url=os.environ["CONTEXTURE_BASE_URL"],
        api_key=os.environ["CONTEXTURE_API_KEY"],
        max_retries=0,
    )
    agent = Agent(
        name="investigator",
        instructions="Read every part of the log with read_log, then say what fails.",
        model=OpenAIResponsesModel(
            model=os.environ["CONTEXTURE_MODEL"], openai_client=client
        ),
        tools=[read_log],
    )
    result = await Runner.run(
        agent,
        input="TASK: find out why node-7 fails. Read parts 1 to 30.",
        max_turns=40,
        auto_previous_response_id=(mode == "chained"),
    )
    print(
        json.dumps(
            {
                "mode": mode,
                "final": result.final_output,
                "tool_calls": calls,
                "last_response_id": result.last_response_id,
            }
        )
    )


if __name__ == "__main__":
    asyncio.run(main())
