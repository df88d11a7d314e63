"""A 30-step tool loop driven by the official Anthropic Python SDK through `contexture
serve`'s Messages door, with Anthropic's context editing (`clear_tool_uses_20250919`).

The client behaves as Anthropic's clients do: it keeps the whole history and sends all of
it on every call, each tool result in full; the door clears old results before the call
goes upstream. Run by crates/contexture-cli/tests/serve_anthropic_tool_loop.rs, which
reads the one JSON object this prints: per call, what the SDK read of the answer
(`stop_reason`, `context_management.applied_edits`), and the text of every result sent.
"""

import json
import os

import anthropic

BASE = os.environ["CONTEXTURE_BASE_URL"]
ROOT = BASE[: -len("/v1")] if BASE.endswith("/v1") else BASE
KEY = os.environ["CONTEXTURE_API_KEY"]
MODEL = os.environ["MODEL"]
TASK = os.environ["TASK"]
TRIGGER = int(os.environ["TRIGGER_TOKENS"])

client = anthropic.Anthropic(base_url=ROOT, api_key=KEY, max_retries=0)
tools = [
    {
        "name": "read_file",
        "description": "Reads a file of the repository.",
        "input_schema": {
            "type": "object",
            "properties": {"path": {"type": "string"}},
            "required": ["path"],
        },
    }
]
edits = [
    {
        "type": "clear_tool_uses_20250919",
        "trigger": {"type": "input_tokens", "value": TRIGGER},
        "keep": {"type": "tool_uses", "value": 3},
    }
]


def file_text(path):
    """A long, distinct file body: about 1,200 tokens."""
    return "".join(
        f"{path} line {n}: let value_{n} = compute({n}, \"{path}\");\n" for n in range(80)
    )


messages = [{"role": "user", "content": TASK}]
calls = []
results = {}
final = None
for step in range(40):
    answer = client.beta.messages.create(
        model=MODEL,
        max_tokens=1000,
        tools=tools,
        messages=messages,
        context_management={"edits": edits},
        betas=["context-management-2025-06-27"],
    )
    applied = (
        [edit.model_dump() for edit in answer.context_management.applied_edits]
        if answer.context_management is not None
        else None
    )
    calls.append({"stop_reason": answer.stop_reason, "applied_edits": applied})
    messages.append(
        {"role": "assistant", "content": [block.model_dump(exclude_none=True) for block in answer.content]}
    )
    uses = [block for block in answer.content if block.type == "tool_use"]
    if not uses:
        final = "".join(block.text for block in answer.content if block.type == "text")
        break
    outcome = []
    for use in uses:
        text = file_text(use.input["path"])
        results[use.id] = text
        outcome.append({"type": "tool_result", "tool_use_id": use.id, "content": text})
    messages.append({"role": "user", "content": outcome})

print(json.dumps({"sdk_version": anthropic.__version__, "calls": calls, "results": results, "final": final}))
