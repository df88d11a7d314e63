"""Token counts equal tiktoken's, on generated texts of every Unicode category and on
the repository's own text."""

import pathlib

import pytest
import tiktoken
from hypothesis import given, settings
from hypothesis import strategies as st

import contexture

ENCODINGS = ["cl100k_base", "o200k_base"]

# Every general category Hypothesis can draw from (`Cs`, lone surrogates, is not text a
# Python str can encode as UTF-8, so it is checked apart as an error).
CATEGORIES = [
    "Lu", "Ll", "Lt", "Lm", "Lo", "Mn", "Mc", "Me", "Nd", "Nl", "No", "Pc", "Pd", "Ps",
    "Pe", "Pi", "Pf", "Po", "Sm", "Sc", "Sk", "So", "Zs", "Zl", "Zp", "Cc", "Cf", "Co", "Cn",
]


@pytest.fixture(scope="module", params=ENCODINGS)
def encoding(request):
    return request.param, tiktoken.get_encoding(request.param)


@pytest.mark.parametrize("category", CATEGORIES)
@pytest.mark.parametrize("name", ENCODINGS)
def test_counts_equal_tiktoken_in_every_unicode_category(name, category):
    reference = tiktoken.get_encoding(name)

    @settings(max_examples=60, deadline=None, database=None)
    @given(
        st.text(
            alphabet=st.characters(categories=[category]) | st.sampled_from(" \n\ta1.'"),
            max_size=80,
        )
    )
    def check(text):
        assert contexture.count_tokens(text, encoding=name) == len(
            reference.encode_ordinary(text)
        ), repr(text)

    check()


@settings(max_examples=300, deadline=None, database=None)
@given(text=st.text(alphabet=st.characters(exclude_categories=["Cs"]), max_size=400))
def test_counts_equal_tiktoken_on_mixed_text(encoding, text):
    name, reference = encoding
    assert contexture.count_tokens(text, encoding=name) == len(reference.encode_ordinary(text))


def test_counts_equal_tiktoken_on_the_repository_s_own_files(encoding, workspace):
    name, reference = encoding
    files = sorted(
        [*workspace.glob("crates/*/src/**/*.rs"), *workspace.glob("docs/*.md")]
    )[:40]
    assert files
    for path in files:
        text = path.read_text(encoding="utf-8")
        assert contexture.count_tokens(text, encoding=name) == len(
            reference.encode_ordinary(text)
        ), path


def test_a_model_counts_in_its_encoding():
    text = "Die Zählung folgt dem Modell: 12345 tokens."
    assert contexture.count_tokens(text, model="gpt-4") == contexture.count_tokens(
        text, encoding="cl100k_base"
    )
    assert contexture.count_tokens(text, model="gpt-4o") == contexture.count_tokens(
        text, encoding="o200k_base"
    )
    assert contexture.count_tokens(text) == contexture.count_tokens(text, encoding="o200k_base")


def test_a_long_text_is_counted_with_the_interpreter_released():
    text = "The quick brown fox jumps over the lazy dog. " * 20_000
    reference = tiktoken.get_encoding("cl100k_base")
    assert contexture.count_tokens(text, encoding="cl100k_base") == len(
        reference.encode_ordinary(text)
    )


@pytest.mark.parametrize(
    "arguments, problem",
    [
        ({"encoding": "p50k_base"}, "unknown encoding `p50k_base`"),
        ({"model": "no-such-model"}, "unknown model `no-such-model`"),
        ({"encoding": "cl100k_base", "model": "gpt-4o"}, "either encoding or model"),
    ],
)
def test_bad_arguments_are_input_errors(arguments, problem):
    with pytest.raises(contexture.InputError, match=problem) as raised:
        contexture.count_tokens("text", **arguments)
    assert isinstance(raised.value, ValueError)


def test_text_that_is_not_a_str_is_a_type_error():
    with pytest.raises(TypeError):
        contexture.count_tokens(b"bytes")  # type: ignore[arg-type]


def test_lone_surrogates_are_refused_not_crashed_on():
    with pytest.raises(UnicodeEncodeError):
        contexture.count_tokens("a\ud800b")


def test_count_messages_gives_the_parts_and_the_budget():
    messages = [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "What is the weather in Paris?"},
    ]
    tools = [
        {
            "type": "function",
            "function": {
                "name": "weather",
                "description": "The weather in a city",
                "parameters": {"type": "object", "properties": {"city": {"type": "string"}}},
            },
        }
    ]
    report = contexture.count_messages(messages, "gpt-4o", tools=tools)
    assert [part["role"] for part in report["messages"]] == ["system", "user"]
    assert report["encoding"] == "o200k_base" and report["exact"] is True
    assert report["total"] == (
        sum(part["tokens"] for part in report["messages"])
        + report["reply_priming"]
        + report["tools"]
    )
    assert report["tools"] > 0
    assert report["budget"]["used"] == report["total"]
    assert report["budget"]["context_window"] == 128_000
    without_tools = contexture.count_messages(messages, "gpt-4o")
    assert without_tools["total"] == report["total"] - report["tools"]
