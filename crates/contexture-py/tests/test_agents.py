"""`contexture.agents.ContextureSession`: the OpenAI Agents SDK running a tool loop with
its history in a Contexture thread, against the workspace's fake provider over HTTP."""

import asyncio
import json

import pytest
from agents import Agent, OpenAIChatCompletionsModel, Runner, function_tool, set_tracing_disabled
from agents.memory import Session
from openai import AsyncOpenAI

import contexture
from contexture.agents import ContextureSession

set_tracing_disabled(True)

looked_up = []


@function_tool
def lookup(item: int) -> str:
    """Looks one item up in the catalogue."""
    looked_up.append(item)
    return f"ITEM {item}: " + f"catalogue entry {item}, in stock. " * 60


def agent_for(upstream):
    client = AsyncOpenAI(base_url=upstream.base_url, api_key="test-key", max_retries=0)
    return Agent(
        name="clerk",
        instructions="Look items up with lookup, then answer.",
        model=OpenAIChatCompletionsModel(model="gpt-4o", openai_client=client),
        tools=[lookup],
    )


def call(id, item):
    return {"tool_calls": [{"id": id, "name": "lookup", "arguments": {"item": item}}]}


def test_the_session_is_an_agents_sdk_session(tmp_path):
    session = ContextureSession("s", db=f"sqlite:{tmp_path / 's.db'}")
    assert isinstance(session, Session)
    assert session.session_id == "s"


def test_a_tool_loop_over_two_runs_is_given_its_history_fitted(tmp_path, fake_upstream):
    upstream = fake_upstream(
        [
            call("call_1", 1),
            call("call_2", 2),
            {"text": "Items 1 and 2 are in stock."},
            call("call_3", 3),
            {"text": "Item 3 is in stock too."},
        ]
    )
    db = f"sqlite:{tmp_path / 'agents.db'}"
    session = ContextureSession(
        "customer-7",
        db=db,
        model="gpt-4o",
        policy={"context": {"clear_tool_results": {"keep": 1, "trigger_tokens": 1}}},
    )
    agent = agent_for(upstream)
    looked_up.clear()

    async def two_runs():
        first = await Runner.run(agent, "Are items 1 and 2 in stock?", session=session)
        second = await Runner.run(agent, "And item 3?", session=session)
        return first, second

    first, second = asyncio.run(two_runs())
    assert first.final_output == "Items 1 and 2 are in stock."
    assert second.final_output == "Item 3 is in stock too."
    assert looked_up == [1, 2, 3]

    requests = upstream.requests()
    assert len(requests) == 5
    # The second run's first call: the first run's history from the session, fitted by
    # the thread's policy: every call still has its result, and only the newest result is
    # whole; the older one was cleared.
    sent = requests[3]["messages"]
    results = {message["tool_call_id"]: message["content"] for message in sent if message["role"] == "tool"}
    assert set(results) == {"call_1", "call_2"}
    assert "catalogue entry 2" in results["call_2"]
    assert "catalogue entry 1" not in results["call_1"]
    assert sent[-1] == {"role": "user", "content": "And item 3?"}
    assert contexture.validate(sent) == []

    # What the session holds: every item, in the CLI's thread format.
    stored = contexture.Thread("customer-7", db=db).messages()
    assert [message["role"] for message in stored].count("tool") == 3
    assert "catalogue entry 1" in next(
        message["content"] for message in stored if message.get("tool_call_id") == "call_1"
    )
    items = asyncio.run(session.get_items())
    kinds = [item.get("type", "message") for item in items]
    assert kinds.count("function_call") == kinds.count("function_call_output") == 3


def test_limit_gives_the_newest_items_as_stored(tmp_path):
    session = ContextureSession("s", db=f"sqlite:{tmp_path / 's.db'}")
    items = [
        {"role": "user", "content": "What is 2 + 2?"},
        {"type": "function_call", "call_id": "c1", "name": "add", "arguments": '{"a": 2, "b": 2}'},
        {"type": "function_call_output", "call_id": "c1", "output": "4"},
        {
            "id": "msg_1",
            "type": "message",
            "role": "assistant",
            "status": "completed",
            "content": [{"type": "output_text", "text": "4", "annotations": []}],
        },
    ]
    asyncio.run(session.add_items(items))
    assert asyncio.run(session.get_items(limit=2)) == items[2:]
    assert asyncio.run(session.get_items(limit=1)) == items[3:]
    assert asyncio.run(session.get_items(limit=0)) == []


def test_pop_item_and_clear_session(tmp_path):
    db = f"sqlite:{tmp_path / 's.db'}"
    session = ContextureSession("s", db=db)
    assert asyncio.run(session.pop_item()) is None
    assert asyncio.run(session.get_items()) == []
    items = [
        {"role": "user", "content": "Look up 1 and 2"},
        {"type": "function_call", "call_id": "a", "name": "lookup", "arguments": "{}"},
        {"type": "function_call", "call_id": "b", "name": "lookup", "arguments": "{}"},
    ]
    asyncio.run(session.add_items(items))
    popped = asyncio.run(session.pop_item())
    assert popped["call_id"] == "b"
    assert asyncio.run(session.get_items(limit=10)) == [
        {"type": "message", "role": "user", "content": "Look up 1 and 2"},
        items[1],
    ]
    asyncio.run(session.clear_session())
    assert asyncio.run(session.get_items()) == []
    # The log keeps every item: the pop and the clear are events of their own.
    events = contexture.Thread("s", db=db).events()
    assert [event["type"] for event in events] == [
        "message_appended",
        "message_appended",
        "context_replaced",
        "context_replaced",
    ]
    asyncio.run(session.clear_session())


def test_bad_items_are_input_errors(tmp_path):
    session = ContextureSession("s", db=f"sqlite:{tmp_path / 's.db'}")
    with pytest.raises(contexture.InputError, match=r"messages\[0\]"):
        asyncio.run(session.add_items([{"type": "teleport", "to": "mars"}]))
    with pytest.raises(contexture.InputError, match="policy.context"):
        ContextureSession("p", db=f"sqlite:{tmp_path / 's.db'}", policy={"context": {"strategy": 7}})


def test_a_session_kept_in_contexture_serve(server, fake_upstream):
    upstream = fake_upstream([call("call_1", 1), {"text": "Item 1 is in stock."}])
    session = ContextureSession(
        "remote-customer",
        url=server["url"],
        api_key=server["keys"]["acme"],
        model="gpt-4o",
        policy={"context": {"clear_tool_results": {"keep": 1, "trigger_tokens": 1}}},
    )
    assert isinstance(session, Session)
    result = asyncio.run(Runner.run(agent_for(upstream), "Is item 1 in stock?", session=session))
    assert result.final_output == "Item 1 is in stock."
    items = asyncio.run(session.get_items())
    kinds = [item.get("type", "message") for item in items]
    assert kinds.count("function_call") == kinds.count("function_call_output") == 1
    assert asyncio.run(session.get_items(limit=1))[-1]["content"][0]["text"] == "Item 1 is in stock."
    popped = asyncio.run(session.pop_item())
    assert popped["role"] == "assistant"
    assert len(asyncio.run(session.get_items())) == len(items) - 1
    # Another tenant's session of the same id is its own, empty.
    other = ContextureSession("remote-customer", url=server["url"], api_key=server["keys"]["globex"])
    assert asyncio.run(other.get_items()) == []
    assert asyncio.run(other.pop_item()) is None
    asyncio.run(session.clear_session())
    assert asyncio.run(session.get_items()) == []
