"""Fitting, validation and repair: what leaves `fit` always passes `validate` (a property
test over generated tool-calling histories), the report accounts for every message, and
bad input is an exception naming its place."""

import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import contexture

WORDS = st.text(alphabet=st.sampled_from("abcdefghij klmnop\nqrstuvwxyzé中🙂"), max_size=60)


@st.composite
def histories(draw):
    """A tool-calling history: user turns, assistant replies, assistant turns with calls
    and their results; sometimes broken (a result without its call, a call without its
    result), as a client's history can be."""
    messages = []
    if draw(st.booleans()):
        messages.append({"role": "system", "content": draw(WORDS)})
    call = 0
    for _ in range(draw(st.integers(0, 30))):
        kind = draw(st.sampled_from(["user", "assistant", "tools", "orphan", "unanswered"]))
        if kind in ("user", "assistant"):
            messages.append({"role": kind, "content": draw(WORDS)})
            continue
        if kind == "orphan":
            messages.append({"role": "tool", "tool_call_id": f"ghost{call}", "content": draw(WORDS)})
            call += 1
            continue
        ids = []
        for _ in range(draw(st.integers(1, 3))):
            ids.append(f"call{call}")
            call += 1
        messages.append(
            {
                "role": "assistant",
                "content": None,
                "tool_calls": [
                    {
                        "id": id,
                        "type": "function",
                        "function": {"name": "lookup", "arguments": json.dumps({"q": id})},
                    }
                    for id in ids
                ],
            }
        )
        answered = ids if kind == "tools" else ids[: draw(st.integers(0, len(ids) - 1))]
        for id in answered:
            messages.append({"role": "tool", "tool_call_id": id, "content": draw(WORDS) * 5})
    return messages


POLICIES = st.one_of(
    st.none(),
    st.just({"clear_tool_results": {"keep": 1, "trigger_tokens": 1}}),
    st.just({"truncate_tool_results": {"max_tokens": 60}}),
)


@settings(max_examples=400, deadline=None, database=None)
@given(
    messages=histories(),
    max_tokens=st.integers(40, 2_000),
    strategy=st.sampled_from([None, "last", "first", "head-tail", "head-tail:2"]),
    rules=st.sampled_from(["openai", "anthropic", "gemini"]),
    policy=POLICIES,
)
def test_what_fit_returns_passes_validate(messages, max_tokens, strategy, rules, policy):
    try:
        fitted, report = contexture.fit(
            messages, "gpt-4o", max_tokens=max_tokens, strategy=strategy, rules=rules, policy=policy
        )
    except contexture.FitError:
        # Only when what must be kept (the system prompt) is over the budget alone.
        assert messages and messages[0]["role"] == "system"
        return
    assert contexture.validate(fitted, rules) == []
    assert report["messages_in"] == len(messages)
    assert report["messages_out"] == len(fitted)
    assert report["tokens_after"] <= report["max_tokens"] or not fitted
    assert report["max_tokens"] <= max_tokens
    assert contexture.count_messages(fitted, "gpt-4o")["total"] == report["tokens_after"]


@settings(max_examples=200, deadline=None, database=None)
@given(messages=histories(), max_tokens=st.integers(40, 2_000))
def test_fit_keeps_every_call_with_its_results(messages, max_tokens):
    messages, _ = contexture.repair(messages)
    fitted, report = contexture.fit(messages, "gpt-4o", max_tokens=max_tokens)
    calls = {
        call["id"]
        for message in fitted
        for call in message.get("tool_calls") or []
    }
    results = {message["tool_call_id"] for message in fitted if message["role"] == "tool"}
    assert calls == results
    # A valid history loses only whole messages, from the front.
    dropped = sum(span["end"] - span["start"] for span in report["dropped"])
    assert dropped == report["dropped_count"] == len(messages) - len(fitted)
    system = messages[:1] if messages and messages[0]["role"] == "system" else []
    history = fitted[len(system) :]
    assert fitted[: len(system)] == system
    assert history == messages[len(messages) - len(history) :] if history else True


def test_a_history_over_the_budget_is_cut_from_the_front_without_orphans():
    messages = [{"role": "system", "content": "You are a weather bot."}]
    for turn in range(50):
        messages += [
            {"role": "user", "content": f"Weather in city {turn}?"},
            {
                "role": "assistant",
                "content": None,
                "tool_calls": [
                    {
                        "id": f"c{turn}",
                        "type": "function",
                        "function": {"name": "weather", "arguments": '{"city": "x"}'},
                    }
                ],
            },
            {"role": "tool", "tool_call_id": f"c{turn}", "content": "sunny " * 40},
            {"role": "assistant", "content": f"It is sunny in city {turn}."},
        ]
    fitted, report = contexture.fit(messages, "gpt-4o", max_tokens=500)
    assert fitted[0] == messages[0]
    assert fitted[1]["role"] != "tool"
    assert report["over_budget"] is True
    assert report["tokens_before_at_least"] > 500 >= report["tokens_after"]
    assert report["dropped"][0]["start"] == 1
    assert contexture.validate(fitted) == []


def test_clearing_old_tool_results_is_reported():
    messages = [{"role": "user", "content": "go"}]
    for turn in range(4):
        messages += [
            {
                "role": "assistant",
                "content": None,
                "tool_calls": [
                    {"id": f"c{turn}", "type": "function", "function": {"name": "read", "arguments": "{}"}}
                ],
            },
            {"role": "tool", "tool_call_id": f"c{turn}", "content": "data " * 100},
        ]
    fitted, report = contexture.fit(
        messages, "gpt-4o", policy={"clear_tool_results": {"keep": 1, "trigger_tokens": 1}}
    )
    assert [result["tool_call_id"] for result in report["cleared"]] == ["c0", "c1", "c2"]
    assert report["tokens_cleared"] > 0
    assert fitted[-1]["content"] == "data " * 100
    assert fitted[2]["content"] != "data " * 100


def test_anthropic_turns_in_anthropic_turns_out():
    body = {
        "system": "Be brief.",
        "messages": [
            {"role": "user", "content": "Weather?"},
            {
                "role": "assistant",
                "content": [{"type": "tool_use", "id": "t1", "name": "weather", "input": {}}],
            },
            {
                "role": "user",
                "content": [{"type": "tool_result", "tool_use_id": "t1", "content": "sunny"}],
            },
        ],
    }
    fitted, report = contexture.fit(body, "claude-sonnet-4-5", format="anthropic")
    assert fitted == body
    assert report["rules"] == "anthropic"
    turns, _ = contexture.fit(body["messages"], "claude-sonnet-4-5", format="anthropic")
    assert turns == body["messages"]
    assert contexture.validate(body, "anthropic", format="anthropic") == []


def test_validate_names_each_problem():
    problems = contexture.validate(
        [
            {"role": "user", "content": "hi"},
            {"role": "tool", "tool_call_id": "nope", "content": "x"},
            {"role": "system", "content": "late"},
        ]
    )
    assert [(problem["index"], problem["kind"]) for problem in problems] == [
        (1, "orphan_tool_result"),
        (2, "system_not_first"),
    ]
    assert problems[0]["tool_call_id"] == "nope"
    assert "message 1" in problems[0]["message"]


def test_repair_mends_and_reports():
    messages = [
        {"role": "user", "content": "hi"},
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [{"id": "a", "type": "function", "function": {"name": "f", "arguments": "{}"}}],
        },
        {"role": "user", "content": "never mind"},
    ]
    repaired, changes = contexture.repair(messages)
    assert contexture.validate(repaired) == []
    assert repaired[2]["role"] == "tool" and repaired[2]["tool_call_id"] == "a"
    assert changes and all("change" in change for change in changes)


@pytest.mark.parametrize(
    "messages, error, place",
    [
        ("not a list", contexture.InputError, "messages: expected an array"),
        ([{"content": "x"}], contexture.InputError, r"messages\[0\]\.role: missing"),
        ([{"role": "wizard", "content": "x"}], contexture.InputError, r"messages\[0\]\.role: unknown role"),
        (
            [{"role": "assistant", "tool_calls": [{"id": 1}]}],
            contexture.InputError,
            r"messages\[0\]\.tool_calls\[0\]\.id",
        ),
        ([{"role": "user", "content": b"bytes"}], TypeError, r"messages\[0\]\.content: a `bytes`"),
        ([{"role": "user", "content": float("nan")}], ValueError, r"messages\[0\]\.content: NaN"),
        ([{"role": "user", 1: "x"}], TypeError, r"messages\[0\]: a dict key must be a str"),
        ([{"role": "user", "content": object()}], TypeError, "`object` is not JSON"),
        ([{"role": "user", "content": 2**70}], ValueError, "64 bits"),
    ],
)
def test_bad_messages_raise_naming_the_place(messages, error, place):
    with pytest.raises(error, match=place):
        contexture.fit(messages, "gpt-4o")
    with pytest.raises(error, match=place):
        contexture.validate(messages)


def test_nesting_past_the_limit_is_refused_not_a_crash():
    deep = []
    inner = deep
    for _ in range(200_000):
        inner.append([])
        inner = inner[0]
    with pytest.raises(ValueError, match="nested more than 128 levels"):
        contexture.fit([{"role": "user", "content": deep}], "gpt-4o")


@pytest.mark.parametrize(
    "arguments, error, problem",
    [
        ({"model": "nope"}, contexture.InputError, "unknown model `nope`"),
        ({"strategy": "middle"}, contexture.InputError, "strategy: unknown strategy `middle`"),
        ({"rules": "cohere"}, contexture.InputError, "rules: "),
        ({"policy": {"strategy": "x"}}, contexture.InputError, "policy.strategy: unknown strategy"),
        (
            {"policy": {"clear_tool_results": {"keep": "all"}}},
            contexture.InputError,
            "policy.clear_tool_results.keep",
        ),
        ({"policy": {"reserve": 10_000_000}}, contexture.FitError, "into 0 tokens"),
        ({"pin": [7]}, contexture.InputError, "pin: there is no message 7"),
        ({"start_on": ["robot"]}, contexture.InputError, "start_on: unknown role `robot`"),
        ({"format": "xml"}, contexture.InputError, "format: unknown message format `xml`"),
        ({"tools": {"not": "a list"}}, contexture.InputError, "tools: expected a list"),
    ],
)
def test_bad_arguments_raise(arguments, error, problem):
    call = {"messages": [{"role": "user", "content": "hi"}], "model": "gpt-4o", **arguments}
    with pytest.raises(error, match=problem):
        contexture.fit(**call)


def test_a_system_prompt_over_the_budget_is_a_fit_error():
    with pytest.raises(contexture.FitError, match="cannot fit the messages into 50 tokens"):
        contexture.fit(
            [{"role": "system", "content": "rule " * 500}, {"role": "user", "content": "hi"}],
            "gpt-4o",
            max_tokens=50,
        )


def test_kept_messages_are_the_objects_given_and_the_report_says_which():
    messages = [{"role": "system", "content": "s", "extra": "kept as given"}]
    for turn in range(30):
        messages.append({"role": "user", "content": f"question {turn} " * 20})
        messages.append({"role": "assistant", "content": f"answer {turn} " * 20})
    fitted, report = contexture.fit(messages, "gpt-4o", max_tokens=400, pin=[5])
    assert fitted[0] is messages[0]
    for message, source in zip(fitted, report["sources"]):
        assert source is not None and message is messages[source]
    assert 5 in report["sources"]
    # A changed message is a new dict, and its source is None.
    tools = [
        {"role": "user", "content": "go"},
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [{"id": "a", "type": "function", "function": {"name": "f", "arguments": "{}"}}],
        },
        {"role": "tool", "tool_call_id": "a", "content": "big " * 500},
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [{"id": "b", "type": "function", "function": {"name": "f", "arguments": "{}"}}],
        },
        {"role": "tool", "tool_call_id": "b", "content": "new"},
    ]
    cleared, report = contexture.fit(
        tools, "gpt-4o", policy={"clear_tool_results": {"keep": 1, "trigger_tokens": 1}}
    )
    assert report["sources"] == [0, 1, None, 3, 4]
    assert cleared[2] is not tools[2] and cleared[2]["tool_call_id"] == "a"
    assert tools[2]["content"] == "big " * 500


def test_a_long_history_is_read_only_as_far_back_as_the_fit_needs():
    history = []
    for turn in range(2_000):
        history.append({"role": "user", "content": f"question {turn} " * 10})
        history.append({"role": "assistant", "content": f"answer {turn} " * 10})
    # A message the fit never reaches is never read: this one would be an error.
    history[10] = {"role": "wizard", "content": b"not even text"}
    fitted, report = contexture.fit(history, "gpt-4o", max_tokens=500)
    assert fitted == history[-len(fitted) :]
    assert report["tokens_before"] is None and report["tokens_before_at_least"] > 500
    assert report["dropped"] == [{"start": 0, "end": len(history) - len(fitted)}]
    # What reads every message finds it.
    with pytest.raises(TypeError, match=r"messages\[10\]\.content"):
        contexture.validate(history)
    # So does a fit that needs every message: the oldest first, or pins anywhere.
    with pytest.raises(TypeError, match=r"messages\[10\]\.content"):
        contexture.fit(history, "gpt-4o", max_tokens=500, strategy="first")
    with pytest.raises((TypeError, contexture.InputError), match=r"messages\[10\]"):
        contexture.fit(history, "gpt-4o", max_tokens=500, pin=[0])


def test_convert_between_formats_round_trips():
    messages = [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "Weather in Paris?"},
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [
                {"id": "c1", "type": "function", "function": {"name": "weather", "arguments": '{"city": "Paris"}'}}
            ],
        },
        {"role": "tool", "tool_call_id": "c1", "content": "sunny"},
        {"role": "assistant", "content": "Sunny."},
    ]
    items = contexture.convert(messages, target="responses")
    assert [item.get("type") for item in items] == [
        "message",
        "message",
        "function_call",
        "function_call_output",
        "message",
    ]
    assert contexture.convert(items, source="responses") == messages
    body = contexture.convert(messages, target="anthropic")
    assert body["system"] == "Be brief."
    back = contexture.convert(body, source="anthropic")
    # Anthropic holds a call's arguments as an object: they come back as equal JSON.
    assert [message["role"] for message in back] == [message["role"] for message in messages]
    call = back[2]["tool_calls"][0]
    assert call["id"] == "c1" and json.loads(call["function"]["arguments"]) == {"city": "Paris"}
    assert back[3] == messages[3] and back[4] == messages[4]
    with pytest.raises(contexture.InputError, match=r"messages\[0\]"):
        contexture.convert([{"type": "teleport"}], source="responses")
