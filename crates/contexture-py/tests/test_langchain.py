"""`contexture.langchain.trim_messages`: LangChain's arguments and message objects in,
the kept objects out, never a tool message without its call or a call without its
results."""

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from langchain_core.messages import (
    convert_to_messages,
    AIMessage,
    HumanMessage,
    SystemMessage,
    ToolMessage,
)
from langchain_core.messages import trim_messages as langchain_trim_messages
from langchain_core.messages.utils import convert_to_openai_messages, count_tokens_approximately

import contexture
from contexture.langchain import trim_messages


def tool_history(turns, result_words=40):
    messages = [SystemMessage("You look things up.", id="system")]
    for turn in range(turns):
        messages += [
            HumanMessage(f"Look up item {turn}", id=f"h{turn}"),
            AIMessage(
                "",
                id=f"a{turn}",
                tool_calls=[
                    {"id": f"c{turn}a", "name": "lookup", "args": {"item": turn}},
                    {"id": f"c{turn}b", "name": "price", "args": {"item": turn}},
                ],
            ),
            ToolMessage("found " * result_words, tool_call_id=f"c{turn}a", id=f"t{turn}a"),
            ToolMessage("costs " * result_words, tool_call_id=f"c{turn}b", id=f"t{turn}b"),
            AIMessage(f"Item {turn} is found and priced.", id=f"r{turn}"),
        ]
    return messages


def paired(messages):
    """True when every tool message follows the AI message that called it, and every
    call has its result."""
    open_calls = set()
    for message in messages:
        if isinstance(message, ToolMessage):
            if message.tool_call_id not in open_calls:
                return False
            open_calls.discard(message.tool_call_id)
        else:
            if open_calls:
                return False
            if isinstance(message, AIMessage):
                open_calls = {call["id"] for call in message.tool_calls}
    return not open_calls


def test_kept_messages_are_the_objects_given():
    history = tool_history(20)
    kept = trim_messages(history, max_tokens=400, include_system=True)
    assert kept[0] is history[0]
    assert all(any(message is original for original in history) for message in kept)
    assert [type(message) for message in kept] == [type(history[history.index(m)]) for m in kept]
    assert kept[-1] is history[-1]
    assert paired(kept[1:])
    assert contexture.count_messages(convert_to_openai_messages(kept), "gpt-4o")["total"] <= 400


def test_langchain_can_cut_a_tool_pair_where_contexture_does_not():
    history = tool_history(10)
    # A budget that ends inside a turn: LangChain keeps the tail message by message.
    broken = None
    for budget in range(60, 400, 7):
        theirs = langchain_trim_messages(
            history, max_tokens=budget, token_counter=count_tokens_approximately
        )
        if not paired(theirs):
            broken = budget
            break
    assert broken is not None, "LangChain kept every pair at every budget tried"
    ours = trim_messages(history, max_tokens=broken, token_counter=count_tokens_approximately)
    assert paired(ours)
    assert count_tokens_approximately(ours) <= broken


@st.composite
def langchain_histories(draw):
    messages = []
    for turn in range(draw(st.integers(0, 25))):
        kind = draw(st.sampled_from(["human", "ai", "tools"]))
        words = draw(st.integers(0, 60))
        if kind == "human":
            messages.append(HumanMessage("ask " * words))
        elif kind == "ai":
            messages.append(AIMessage("say " * words))
        else:
            ids = [f"c{turn}_{n}" for n in range(draw(st.integers(1, 3)))]
            messages.append(
                AIMessage("", tool_calls=[{"id": id, "name": "f", "args": {}} for id in ids])
            )
            messages += [ToolMessage("result " * words, tool_call_id=id) for id in ids]
    return messages


@settings(max_examples=300, deadline=None, database=None)
@given(
    messages=langchain_histories(),
    max_tokens=st.integers(1, 1500),
    strategy=st.sampled_from(["first", "last"]),
    counter=st.sampled_from([None, "approximate", count_tokens_approximately]),
)
def test_never_a_result_without_its_call_nor_a_call_without_its_results(
    messages, max_tokens, strategy, counter
):
    kept = trim_messages(messages, max_tokens=max_tokens, strategy=strategy, token_counter=counter)
    assert paired(kept)
    if counter is not None:
        assert count_tokens_approximately(kept) <= max_tokens
    elif kept:
        assert contexture.count_messages(convert_to_openai_messages(kept), "gpt-4o")["total"] <= max_tokens
    for message in kept:
        assert any(message is original for original in messages)


def test_the_arguments_mean_what_they_mean_in_langchain():
    history = tool_history(6)
    kept = trim_messages(
        history, max_tokens=300, include_system=True, start_on="human", end_on=("ai", ToolMessage)
    )
    assert isinstance(kept[0], SystemMessage)
    assert isinstance(kept[1], HumanMessage)
    assert isinstance(kept[-1], (AIMessage, ToolMessage))
    first = trim_messages(history, max_tokens=200, strategy="first")
    assert first[0] is history[0] and first[1] is history[1]
    assert paired(first[1:])
    # include_system=False (LangChain's default) lets the system message go.
    assert not isinstance(trim_messages(history, max_tokens=150)[0], SystemMessage)


def test_a_runnable_without_messages():
    runnable = trim_messages(max_tokens=200, include_system=True)
    history = tool_history(6)
    assert runnable.invoke(history) == trim_messages(history, max_tokens=200, include_system=True)


def test_message_likes_are_accepted_as_langchain_accepts_them():
    kept = trim_messages([("system", "be brief"), ("human", "hi"), ("ai", "hello")], max_tokens=1000)
    assert [message.type for message in kept] == ["system", "human", "ai"]


@pytest.mark.parametrize(
    "arguments, problem",
    [
        ({"strategy": "middle"}, "Unrecognized strategy"),
        ({"strategy": "first", "start_on": "human"}, "start_on parameter is only valid"),
        ({"strategy": "first", "include_system": True}, "include_system parameter is only valid"),
        ({"token_counter": "exact"}, "Invalid token_counter shortcut"),
        ({"token_counter": 42}, "expected to be a model"),
        ({"start_on": "robot"}, "unknown message type 'robot'"),
        ({"allow_partial": True, "text_splitter": str.split}, "text_splitter"),
    ],
)
def test_bad_arguments_are_value_errors(arguments, problem):
    with pytest.raises(ValueError, match=problem):
        trim_messages(tool_history(2), max_tokens=100, **arguments)


def test_langchain_messages_round_trip_through_a_thread(tmp_path):
    history = tool_history(3) + [
        HumanMessage(
            content=[
                {"type": "text", "text": "What is in this picture?"},
                {"type": "image_url", "image_url": {"url": "data:image/png;base64,iVBORw0KGgo="}},
            ],
            name="ada",
        ),
        AIMessage("A cat."),
    ]
    thread = contexture.Thread("lc", db=f"sqlite:{tmp_path / 'lc.db'}")
    thread.append(convert_to_openai_messages(history))
    back = convert_to_messages(thread.messages())
    assert [type(message) for message in back] == [type(message) for message in history]
    for theirs, ours in zip(history, back):
        assert ours.content == theirs.content
        assert getattr(ours, "tool_calls", None) == getattr(theirs, "tool_calls", None)
        assert getattr(ours, "tool_call_id", None) == getattr(theirs, "tool_call_id", None)
    assert back[-2].name == "ada"
    # A message the fit changed (a cleared tool result) comes back as a LangChain message
    # of its type.
    fitted, report = contexture.fit(
        convert_to_openai_messages(history),
        "gpt-4o",
        policy={"clear_tool_results": {"keep": 1, "trigger_tokens": 1}},
    )
    changed = [message for message, source in zip(fitted, report["sources"]) if source is None]
    assert changed and all(isinstance(message, ToolMessage) for message in convert_to_messages(changed))
