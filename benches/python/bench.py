"""The measurements of benches/python/run.sh: each peer and Contexture on the same input
in the same process, the median of REPEATS runs (and the fastest), and their ratio."""

import json
import os
import pathlib
import platform
import statistics
import time

import tiktoken
from langchain_openai import ChatOpenAI
from langchain_core.messages import AIMessage, BaseMessage, HumanMessage, SystemMessage, ToolMessage
from langchain_core.messages import trim_messages

import contexture
from contexture.langchain import trim_messages as contexture_trim_messages

REPEATS = int(os.environ.get("REPEATS", "7"))
ROOT = pathlib.Path(__file__).resolve().parents[2]


def timed(function, repeats=REPEATS):
    """Median and fastest seconds of `repeats` calls (after one warm-up call)."""
    function()
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        function()
        times.append(time.perf_counter() - start)
    return statistics.median(times), min(times)


def corpus() -> str:
    """The repository's own text: Rust sources and docs, a few MB of code and prose."""
    files = sorted([*ROOT.glob("crates/*/src/**/*.rs"), *ROOT.glob("docs/*.md")])
    return "\n".join(path.read_text(encoding="utf-8") for path in files)


def history(turns=2500):
    """A 10,000-message tool-calling history: per turn a question, a tool call, its result
    (about 600 characters) and an answer."""
    messages = [{"role": "system", "content": "You are a support agent with a lookup tool."}]
    for turn in range(turns):
        messages.append({"role": "user", "content": f"What is the status of order {turn}?"})
        messages.append(
            {
                "role": "assistant",
                "content": None,
                "tool_calls": [
                    {
                        "id": f"call_{turn}",
                        "type": "function",
                        "function": {"name": "lookup_order", "arguments": json.dumps({"order": turn})},
                    }
                ],
            }
        )
        messages.append(
            {
                "role": "tool",
                "tool_call_id": f"call_{turn}",
                "content": json.dumps(
                    {"order": turn, "status": "shipped", "carrier": "DHL", "events": ["packed", "left the warehouse", "in transit"] * 6}
                ),
            }
        )
        messages.append({"role": "assistant", "content": f"Order {turn} has shipped with DHL and is in transit."})
    return messages[:10_000]


def as_langchain(messages):
    converted = []
    for message in messages:
        if message["role"] == "system":
            converted.append(SystemMessage(message["content"]))
        elif message["role"] == "user":
            converted.append(HumanMessage(message["content"]))
        elif message["role"] == "tool":
            converted.append(ToolMessage(message["content"], tool_call_id=message["tool_call_id"]))
        elif message.get("tool_calls"):
            calls = [
                {"id": call["id"], "name": call["function"]["name"], "args": json.loads(call["function"]["arguments"])}
                for call in message["tool_calls"]
            ]
            converted.append(AIMessage("", tool_calls=calls))
        else:
            converted.append(AIMessage(message["content"]))
    return converted


def tiktoken_counter(encoding):
    """OpenAI's chat recipe with tiktoken (3 tokens per message, 3 to prime the reply),
    as a LangChain token counter of a message list."""

    def count(messages):
        total = 3
        for message in messages:
            total += 3 + len(encoding.encode_ordinary(message.content if isinstance(message.content, str) else ""))
            for call in getattr(message, "tool_calls", None) or []:
                total += len(encoding.encode_ordinary(call["name"] + json.dumps(call["args"])))
        return total

    return count


def row(label, peer, ours):
    ratio = peer[0] / ours[0]
    print(
        f"| {label} | {peer[0] * 1000:.2f} ms (fastest {peer[1] * 1000:.2f}) "
        f"| {ours[0] * 1000:.3f} ms (fastest {ours[1] * 1000:.3f}) | {ratio:.1f}x |"
    )
    return ratio


def main():
    print(f"Python {platform.python_version()}, tiktoken {tiktoken.__version__}, contexture {contexture.__version__}, {REPEATS} runs each")
    print()
    print("| measurement | peer | contexture | ratio |")
    print("|---|---|---|---|")
    text = corpus()
    megabytes = len(text.encode()) / 1e6
    for name in ("cl100k_base", "o200k_base"):
        encoding = tiktoken.get_encoding(name)
        assert contexture.count_tokens(text, encoding=name) == len(encoding.encode_ordinary(text))
        peer = timed(lambda: len(encoding.encode_ordinary(text)))
        ours = timed(lambda: contexture.count_tokens(text, encoding=name))
        row(f"count {megabytes:.1f} MB of source and docs, {name} (tiktoken `encode_ordinary`)", peer, ours)
    messages = [message["content"] or "" for message in history()]
    encoding = tiktoken.get_encoding("o200k_base")
    peer = timed(lambda: [len(encoding.encode_ordinary(text)) for text in messages])
    ours = timed(lambda: [contexture.count_tokens(text) for text in messages])
    row("count 10,000 chat messages one call each, o200k_base", peer, ours)

    dicts = history()
    langchain = as_langchain(dicts)
    # LangChain's own tiktoken counter for OpenAI models (no call is made).
    counter = ChatOpenAI(model="gpt-4o", api_key="not-used")
    budget = 8_000
    kept_theirs = trim_messages(langchain, max_tokens=budget, token_counter=counter, include_system=True)
    fitted, report = contexture.fit(dicts, "gpt-4o", max_tokens=budget)
    assert contexture.validate(fitted) == []
    peer = timed(lambda: trim_messages(langchain, max_tokens=budget, token_counter=counter, include_system=True), repeats=3)
    ours = timed(lambda: contexture.fit(dicts, "gpt-4o", max_tokens=budget))
    row("fit 10,000 tool-calling messages to 8,000 tokens: `trim_messages` counting with tiktoken (`ChatOpenAI.get_num_tokens_from_messages`) vs `contexture.fit`", peer, ours)
    recipe = tiktoken_counter(tiktoken.get_encoding("o200k_base"))
    peer = timed(lambda: trim_messages(langchain, max_tokens=budget, token_counter=recipe, include_system=True), repeats=3)
    row("the same, `trim_messages` counting with a plain tiktoken function of the chat recipe", peer, ours)

    precomputed = {id(message): recipe([message]) - 3 for message in langchain}

    def lookup(message: BaseMessage) -> int:
        return precomputed[id(message)]

    peer = timed(lambda: trim_messages(langchain, max_tokens=budget, token_counter=lookup, include_system=True))
    row("the same, `trim_messages` with precomputed counts vs `contexture.fit`", peer, ours)
    adapter = timed(lambda: contexture_trim_messages(langchain, max_tokens=budget, include_system=True))
    row("the same, `trim_messages` with precomputed counts vs `contexture.langchain.trim_messages` (LangChain messages in and out)", peer, adapter)
    print()
    print(f"kept: trim_messages {len(kept_theirs)} messages, contexture.fit {len(fitted)} messages ({report['tokens_after']} tokens)")


if __name__ == "__main__":
    main()
