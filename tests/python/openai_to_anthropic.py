"""The official OpenAI Python SDK against `contexture serve` for a model whose upstream is
Anthropic's Messages API: the chat endpoint and the Responses door, whole and streamed, a
tool call among them, each written in the SDK's own format from Anthropic's answers.

Run by crates/contexture-cli/tests/serve_openai_sdk_anthropic_upstream.rs, which reads the
one JSON object this prints: what the SDK read of each call.
"""

import json
import os

from openai import OpenAI

client = OpenAI(
    base_url=os.environ["CONTEXTURE_BASE_URL"],
    api_key=os.environ["CONTEXTURE_API_KEY"],
    max_retries=0,
)
MODEL = os.environ["CLAUDE_MODEL"]
tools = [
    {
        "type": "function",
        "function": {
            "name": "weather",
            "description": "The weather in a city.",
            "parameters": {"type": "object", "properties": {"city": {"type": "string"}}},
        },
    }
]
seen = {}

answer = client.chat.completions.create(
    model=MODEL,
    max_tokens=200,
    messages=[{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hello?"}],
)
seen["chat"] = {
    "text": answer.choices[0].message.content,
    "finish_reason": answer.choices[0].finish_reason,
    "usage": [answer.usage.prompt_tokens, answer.usage.completion_tokens],
}

called = client.chat.completions.create(
    model=MODEL,
    max_tokens=200,
    tools=tools,
    messages=[{"role": "user", "content": "Weather in Lisbon?"}],
)
call = called.choices[0].message.tool_calls[0]
seen["chat_tool"] = {
    "name": call.function.name,
    "arguments": json.loads(call.function.arguments),
    "finish_reason": called.choices[0].finish_reason,
}

pieces = []
for chunk in client.chat.completions.create(
    model=MODEL,
    max_tokens=200,
    stream=True,
    messages=[{"role": "user", "content": "Stream it."}],
):
    if chunk.choices and chunk.choices[0].delta.content:
        pieces.append(chunk.choices[0].delta.content)
seen["chat_stream"] = "".join(pieces)

response = client.responses.create(model=MODEL, input="Hello from Responses?", max_output_tokens=200)
seen["responses"] = {"text": response.output_text, "status": response.status}
followed = client.responses.create(
    model=MODEL, input="And again?", previous_response_id=response.id, max_output_tokens=200
)
seen["responses_chained"] = followed.output_text

stream = client.responses.create(model=MODEL, input="Stream a response.", stream=True)
deltas = []
completed = None
for event in stream:
    if event.type == "response.output_text.delta":
        deltas.append(event.delta)
    if event.type == "response.completed":
        completed = event.response.output_text
seen["responses_stream"] = {"deltas": "".join(deltas), "completed": completed}

print(json.dumps(seen))
