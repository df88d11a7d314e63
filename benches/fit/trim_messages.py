"""LangChain's `trim_messages` as a whole process, the peer of `contexture fit`: read an
OpenAI-format history file, convert it to LangChain messages, keep the newest messages that
fit BUDGET tokens (o200k_base with tiktoken, OpenAI's chat recipe: 3 tokens per message and
3 to prime the reply; each message tokenized once), starting on a user message with the system message kept, and write
them back as OpenAI-format JSON.

    python trim_messages.py BUDGET FILE
"""

import json
import sys

import tiktoken
from langchain_core.messages import convert_to_messages, convert_to_openai_messages, trim_messages

ENCODING = tiktoken.get_encoding("o200k_base")


# trim_messages calls the counter on ever shorter lists while it searches for the cut; each
# message's count is remembered, so every message is tokenized once, as a careful user would.
COUNTS = {}


def message_tokens(message):
    content = message.content if isinstance(message.content, str) else ""
    tokens = 3 + len(ENCODING.encode_ordinary(content))
    for call in getattr(message, "tool_calls", None) or []:
        tokens += len(ENCODING.encode_ordinary(call["name"] + json.dumps(call["args"])))
    return tokens


def count(messages):
    total = 3
    for message in messages:
        key = id(message)
        if key not in COUNTS:
            COUNTS[key] = message_tokens(message)
        total += COUNTS[key]
    return total


def main():
    budget, path = int(sys.argv[1]), sys.argv[2]
    with open(path, encoding="utf-8") as file:
        messages = convert_to_messages(json.load(file))
    kept = trim_messages(
        messages,
        max_tokens=budget,
        token_counter=count,
        strategy="last",
        start_on="human",
        include_system=True,
    )
    json.dump(convert_to_openai_messages(kept), sys.stdout, indent=2)


if __name__ == "__main__":
    main()
