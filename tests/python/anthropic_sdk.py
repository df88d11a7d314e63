"""The official Anthropic Python SDK against `contexture serve`'s Messages door.

Run by crates/contexture-cli/tests/serve_anthropic_sdk.rs, which starts the server (its
default upstream an OpenAI-compatible fake, `claude-*` models routed to an Anthropic-kind
fake) and reads the one JSON object this prints: what the SDK saw of each call.
"""

import json
import os

import anthropic

BASE = os.environ["CONTEXTURE_BASE_URL"]
# The SDK appends /v1/messages to a base URL without /v1.
ROOT = BASE[: -len("/v1")] if BASE.endswith("/v1") else BASE
KEY = os.environ["CONTEXTURE_API_KEY"]
OPENAI_MODEL = os.environ["OPENAI_MODEL"]
CLAUDE_MODEL = os.environ["CLAUDE_MODEL"]
THINKING = json.loads(os.environ["THINKING_BLOCK"])

client = anthropic.Anthropic(base_url=ROOT, api_key=KEY, max_retries=0)
seen = {"sdk_version": anthropic.__version__}


def summary(message):
    return {
        "type": message.type,
        "role": message.role,
        "text": "".join(block.text for block in message.content if block.type == "text"),
        "stop_reason": message.stop_reason,
        "input_tokens": message.usage.input_tokens,
        "output_tokens": message.usage.output_tokens,
    }


# A stateless turn to the OpenAI-compatible upstream.
seen["plain"] = summary(
    client.messages.create(
        model=OPENAI_MODEL,
        max_tokens=100,
        system="Be brief.",
        messages=[{"role": "user", "content": "Hello?"}],
    )
)

# The same, streamed: the SDK assembles the named events.
with client.messages.stream(
    model=OPENAI_MODEL,
    max_tokens=100,
    messages=[{"role": "user", "content": "Stream, please."}],
) as stream:
    pieces = list(stream.text_stream)
    final = stream.get_final_message()
seen["stream"] = {"pieces": pieces, "final": summary(final)}

# A turn routed to the Anthropic upstream, sending back an earlier turn's thinking block.
seen["claude"] = summary(
    client.messages.create(
        model=CLAUDE_MODEL,
        max_tokens=200,
        thinking={"type": "enabled", "budget_tokens": 1024},
        messages=[
            {"role": "user", "content": "Hi"},
            {"role": "assistant", "content": [THINKING, {"type": "text", "text": "Hello."}]},
            {"role": "user", "content": "Who are you?"},
        ],
    )
)
with client.messages.stream(
    model=CLAUDE_MODEL,
    max_tokens=100,
    messages=[{"role": "user", "content": "Stream, Claude."}],
) as stream:
    seen["claude_stream"] = "".join(stream.text_stream)

# Turns of a named thread: the second sends only its new message.
seen["thread"] = [
    summary(
        client.messages.create(
            model=OPENAI_MODEL,
            max_tokens=50,
            messages=[{"role": "user", "content": text}],
            extra_headers={"X-Contexture-Thread": "sdk-thread"},
        )
    )["text"]
    for text in ["My name is Ada.", "What is my name?"]
]

# The door's count of a request, through the SDK's own call.
seen["count_tokens"] = client.messages.count_tokens(
    model=OPENAI_MODEL,
    system="Be brief.",
    messages=[{"role": "user", "content": "How many tokens is this?"}],
).input_tokens

# The model list, as Anthropic's clients read it.
seen["models"] = [model.id for model in client.models.list()]

# Errors reach the SDK as its own exception types, with Anthropic's error body.
try:
    client.messages.create(
        model="no-such-model", max_tokens=5, messages=[{"role": "user", "content": "x"}]
    )
    seen["bad_model"] = "accepted"
except anthropic.BadRequestError as error:
    seen["bad_model"] = {
        "status": error.status_code,
        "type": error.body["error"]["type"],
        "message": error.body["error"]["message"],
    }
try:
    anthropic.Anthropic(base_url=ROOT, api_key="ctx_not_a_key", max_retries=0).messages.create(
        model=OPENAI_MODEL, max_tokens=5, messages=[{"role": "user", "content": "x"}]
    )
    seen["bad_key"] = "accepted"
except anthropic.AuthenticationError as error:
    seen["bad_key"] = {"status": error.status_code, "type": error.body["error"]["type"]}

# Compaction (Anthropic's context editing, carried out by the door): a long history is
# compacted in a streamed turn, whose compaction block the SDK assembles; the next turn
# sends the whole history back with the block, which stands for what it covered.
history = []
for n in range(15):
    history.append({"role": "user", "content": f"Question {n} about topic-{n}. " + "Context. " * 40})
    history.append({"role": "assistant", "content": f"Answer {n}. " + "Detail. " * 40})
history.append({"role": "user", "content": "Where are we?"})
edits = {"edits": [{"type": "compact_20260112", "trigger": {"type": "input_tokens", "value": 2000}}]}
with client.beta.messages.stream(
    model=OPENAI_MODEL, max_tokens=100, messages=history, context_management=edits
) as stream:
    compacted = stream.get_final_message()
blocks = [block.model_dump(exclude_none=True) for block in compacted.content]
history.append({"role": "assistant", "content": blocks})
history.append({"role": "user", "content": "Go on."})
after = client.beta.messages.create(
    model=OPENAI_MODEL, max_tokens=100, messages=history, context_management=edits
)
seen["compaction"] = {
    "types": [block["type"] for block in blocks],
    "summary": blocks[0].get("content"),
    "text": blocks[-1].get("text"),
    "stop_reason": compacted.stop_reason,
    "after": [block.type for block in after.content],
}

print(json.dumps(seen))
