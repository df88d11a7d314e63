#!/usr/bin/env python3
"""The official OpenAI Python SDK's Responses client against `contexture serve`.

Run by crates/contexture-cli/tests/serve_responses_sdk.rs against a server whose upstream
is a fake that answers `reply N` (`streamed reply N` when streamed); it can be run by hand
against any `contexture serve` too.

Environment:
  CONTEXTURE_BASE_URL  the server's base URL with /v1, e.g. http://127.0.0.1:8080/v1
  CONTEXTURE_API_KEY   a key made with `contexture keys create` (ctx_...)
  CONTEXTURE_MODEL     the model to name (default gpt-4o-mini; it must be in the registry)

What it does, in order: three chained turns (`previous_response_id`), the first with
instructions; a branch from the first response; retrieve; the input items of the second; a
streamed turn (the event types and the text); a turn with `store=False` (which cannot be
retrieved or continued); an input over the window with `truncation="disabled"`; a turn that
asks for compaction past a threshold; a window compacted on demand; a conversation named by
its thread.

Prints one JSON object (what it saw) on stdout; exits non-zero on any problem.
"""

import json
import os
import sys

try:
    import openai
    from openai import OpenAI
except ImportError:
    print(
        "the Python package `openai` is missing: python3 -m pip install 'openai==3.57.0'",
        file=sys.stderr,
    )
    sys.exit(3)


def fail(message):
    print(f"responses_sdk.py: {message}", file=sys.stderr)
    sys.exit(1)


def main():
    client = OpenAI(
        base_url=os.environ["CONTEXTURE_BASE_URL"],
        api_key=os.environ["CONTEXTURE_API_KEY"],
        max_retries=0,
    )
    model = os.environ.get("CONTEXTURE_MODEL", "gpt-4o-mini")
    seen = {"sdk_version": openai.__version__}

    first = client.responses.create(
        model=model, input="user 1", instructions="You are terse."
    )
    second = client.responses.create(
        model=model, input="user 2", previous_response_id=first.id
    )
    third = client.responses.create(
        model=model,
        input=[{"role": "user", "content": "user 3"}],
        previous_response_id=second.id,
    )
    seen["chain"] = [first.output_text, second.output_text, third.output_text]
    seen["chain_previous"] = [second.previous_response_id == first.id,
                              third.previous_response_id == second.id]
    seen["instructions"] = [first.instructions, second.instructions]
    seen["usage_total"] = first.usage.total_tokens if first.usage else None

    branch = client.responses.create(
        model=model, input="branch question", previous_response_id=first.id
    )
    seen["branch"] = branch.output_text

    read = client.responses.retrieve(first.id)
    seen["retrieved_same"] = (
        read.id == first.id
        and read.output_text == first.output_text
        and read.status == "completed"
    )
    items = client.responses.input_items.list(second.id)
    seen["input_items"] = [
        part.text for item in items.data for part in (item.content or [])
    ]

    events = client.responses.create(model=model, input="stream please", stream=True)
    types = []
    deltas = []
    completed = None
    for event in events:
        types.append(event.type)
        if event.type == "response.output_text.delta":
            deltas.append(event.delta)
        if event.type == "response.completed":
            completed = event.response
    if completed is None:
        fail(f"no response.completed among {types}")
    seen["stream"] = {
        "types": types,
        "text": "".join(deltas),
        "completed_text": completed.output_text,
    }
    after_stream = client.responses.create(
        model=model, input="after the stream", previous_response_id=completed.id
    )
    seen["after_stream"] = after_stream.output_text
    window = client.responses.compact(model=model, previous_response_id=after_stream.id)
    seen["compact_object"] = window.object
    seen["compact_first_item"] = window.output[0].type

    unstored = client.responses.create(
        model=model, input="not kept", store=False, previous_response_id=third.id
    )
    seen["unstored_text"] = unstored.output_text
    try:
        client.responses.retrieve(unstored.id)
        seen["unstored_retrieve"] = "found"
    except openai.NotFoundError:
        seen["unstored_retrieve"] = "not found"
    try:
        client.responses.create(
            model=model, input="again", previous_response_id=unstored.id
        )
        seen["unstored_continue"] = "answered"
    except openai.NotFoundError:
        seen["unstored_continue"] = "not found"

    try:
        client.responses.create(
            model=model,
            input="disk pressure on node-7 again. " * 40000,
            truncation="disabled",
        )
        seen["truncation_disabled"] = "answered"
    except openai.BadRequestError as error:
        seen["truncation_disabled"] = error.code

    compacted = client.responses.create(
        model=model,
        input="user 4",
        previous_response_id=third.id,
        extra_body={
            "context_management": [{"type": "compaction", "compact_threshold": 20}]
        },
    )
    seen["compaction_first_item"] = compacted.output[0].type
    seen["compaction_text"] = getattr(compacted.output[0], "encrypted_content", None)
    seen["compacted_answer"] = compacted.output_text

    conversation = os.environ.get("CONVERSATION")
    if conversation:
        in_conversation = client.responses.create(
            model=model, input="in the conversation", conversation=conversation
        )
        seen["conversation_answer"] = in_conversation.output_text

    print(json.dumps(seen))


if __name__ == "__main__":
    try:
        main()
    except openai.APIStatusError as error:
        fail(f"{error.status_code}: {error.response.text}")
