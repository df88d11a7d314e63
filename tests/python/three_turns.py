#!/usr/bin/env python3
"""The official OpenAI Python SDK as a client of `contexture serve`.

Run by crates/contexture-cli/tests/serve_sdk.rs against a server whose upstream is a fake
that answers `reply N`; it can be run by hand against any `contexture serve` too.

Environment:
  CONTEXTURE_BASE_URL  the server's OpenAI-compatible base URL, e.g. http://127.0.0.1:8080/v1
  CONTEXTURE_API_KEY   a key made with `contexture keys create` (ctx_...)
  CONTEXTURE_MODEL     the model to name (default gpt-4o-mini; it must be in the registry)
  THREAD_CHAT          the thread of the three-turn conversation (default sdk-chat)
  THREAD_STREAM        the thread of the streamed turn (default sdk-stream)

Each turn sends only its new message: the thread keeps the history. Turns 1 and 2 name the
thread with the X-Contexture-Thread header, turn 3 with metadata.contexture_thread. A second
thread gets one streamed turn (its deltas collected) and then a plain follow-up turn.

Prints one JSON object (the answers) on stdout; exits non-zero on any problem.
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
    print(f"three_turns.py: {message}", file=sys.stderr)
    sys.exit(1)


def text_of(completion, turn):
    """The answer's text, checked to be a non-empty string."""
    if not completion.choices:
        fail(f"{turn}: no choices in {completion!r}")
    content = completion.choices[0].message.content
    if not isinstance(content, str) or not content:
        fail(f"{turn}: no text in {completion!r}")
    return content


def main():
    base_url = os.environ.get("CONTEXTURE_BASE_URL")
    api_key = os.environ.get("CONTEXTURE_API_KEY")
    if not base_url or not api_key:
        fail("set CONTEXTURE_BASE_URL and CONTEXTURE_API_KEY")
    model = os.environ.get("CONTEXTURE_MODEL", "gpt-4o-mini")
    chat_thread = os.environ.get("THREAD_CHAT", "sdk-chat")
    stream_thread = os.environ.get("THREAD_STREAM", "sdk-stream")

    # No retries: a failure shows at once instead of being hidden by a second attempt.
    client = OpenAI(base_url=base_url, api_key=api_key, max_retries=0, timeout=30.0)
    header = {"X-Contexture-Thread": chat_thread}

    # Turn 1: a system prompt and the first question (the thread is created).
    first = client.chat.completions.create(
        model=model,
        messages=[
            {"role": "system", "content": "You are terse."},
            {"role": "user", "content": "user 1"},
        ],
        extra_headers=header,
    )
    # Turn 2: only the new question; the raw response shows the thread the server used.
    raw = client.chat.completions.with_raw_response.create(
        model=model,
        messages=[{"role": "user", "content": "user 2"}],
        extra_headers=header,
    )
    second = raw.parse()
    second_thread = raw.headers.get("x-contexture-thread")
    # Turn 3: the thread named in metadata instead of the header.
    raw = client.chat.completions.with_raw_response.create(
        model=model,
        messages=[{"role": "user", "content": "user 3"}],
        metadata={"contexture_thread": chat_thread},
    )
    third = raw.parse()
    third_thread = raw.headers.get("x-contexture-thread")

    # A streamed turn on a second thread, delta by delta.
    stream = client.chat.completions.create(
        model=model,
        messages=[{"role": "user", "content": "stream please"}],
        stream=True,
        extra_headers={"X-Contexture-Thread": stream_thread},
    )
    deltas = []
    finish_reason = None
    chunks = 0
    for chunk in stream:
        chunks += 1
        if chunk.object != "chat.completion.chunk":
            fail(f"stream: unexpected object {chunk.object!r}")
        for choice in chunk.choices:
            if choice.delta is not None and choice.delta.content:
                deltas.append(choice.delta.content)
            if choice.finish_reason is not None:
                finish_reason = choice.finish_reason
    if len(deltas) < 2:
        fail(f"stream: expected several deltas, got {deltas!r} in {chunks} chunks")
    # The next turn on that thread: its history must hold the streamed answer.
    follow_up = client.chat.completions.create(
        model=model,
        messages=[{"role": "user", "content": "after the stream"}],
        extra_headers={"X-Contexture-Thread": stream_thread},
    )

    summary = {
        "sdk_version": openai.__version__,
        "answers": [
            text_of(first, "turn 1"),
            text_of(second, "turn 2"),
            text_of(third, "turn 3"),
        ],
        "response_threads": [second_thread, third_thread],
        "stream": {
            "deltas": deltas,
            "text": "".join(deltas),
            "chunks": chunks,
            "finish_reason": finish_reason,
        },
        "follow_up": text_of(follow_up, "follow-up"),
    }
    print(json.dumps(summary))


if __name__ == "__main__":
    try:
        main()
    except openai.APIStatusError as error:
        fail(f"the server answered {error.status_code}: {error.response.text}")
    except openai.APIError as error:
        fail(f"{type(error).__name__}: {error}")
