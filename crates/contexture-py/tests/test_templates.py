"""Templates, output parsing and conditions, as a workflow step uses them."""

import pytest

import contexture
from contexture import Template


def test_a_jinja_template_renders_with_context_and_keywords():
    template = Template("Hello {{ user.name }}, you have {{ count }} messages.")
    assert template.input_variables == ["count", "user"]
    assert template.render({"user": {"name": "Ada"}}, count=3) == "Hello Ada, you have 3 messages."
    # Keywords win over the context's keys.
    assert template.render({"count": 1, "user": {"name": "Ada"}}, count=2).endswith("2 messages.")


def test_the_simple_syntax_and_literal_braces():
    template = Template("{greeting}, {{literal}} {name}", format="fstring")
    assert template.format == "fstring"
    assert template.render(greeting="Hi", name="Bo") == "Hi, {literal} Bo"


def test_partials_fill_what_the_caller_does_not_give():
    template = Template("{{ role }}: {{ task }}", partials={"role": "Reviewer"})
    assert template.input_variables == ["task"]
    assert template.partials == {"role": "Reviewer"}
    assert template.render(task="read") == "Reviewer: read"
    assert template.render(task="read", role="Author") == "Author: read"


def test_templates_join_with_plus_across_syntaxes():
    joined = Template("{a} and ", format="fstring", partials={"a": "x"}) + Template("{{ b }}")
    assert joined.format == "jinja"
    assert joined.render(b="y") == "x and y"
    with pytest.raises(contexture.TemplateError, match="partial variable `a`"):
        Template("{{ a }}", partials={"a": 1}) + Template("{{ a }}", partials={"a": 2})


def test_missing_variables_follow_the_policy():
    template = Template("[{{ absent }}]")
    assert template.render() == "[{{ absent }}]"
    assert template.render(missing="empty") == "[]"
    with pytest.raises(contexture.TemplateError, match="absent"):
        template.render(missing="error")
    with pytest.raises(contexture.InputError, match="missing"):
        template.render(missing="sometimes")


def test_a_syntax_error_names_its_line():
    with pytest.raises(contexture.TemplateError, match="line 2"):
        Template("fine\n{{ broken ")
    with pytest.raises(contexture.InputError, match="format"):
        Template("x", format="mustache")


def test_hostile_templates_are_bounded_errors():
    # A runaway loop runs out of fuel rather than hanging the interpreter.
    with pytest.raises(contexture.TemplateError):
        Template("{% for i in range(100000) %}{% for j in range(100000) %}x{% endfor %}{% endfor %}").render()
    # Templates cannot reach the host.
    with pytest.raises(contexture.TemplateError):
        Template("{{ ''.__class__.__mro__ }}").render(missing="error")


def test_parse_output_tries_json_then_fences_then_literals():
    assert contexture.parse_output('{"a": 1}') == {"value": {"a": 1}, "format": "json", "notes": []}
    fenced = contexture.parse_output('Here:\n```json\n[1, 2]\n```\nDone.')
    assert fenced["value"] == [1, 2]
    assert contexture.parse_output("{'a': True}")["value"] == {"a": True}
    assert contexture.parse_output("just text") ["value"] == "just text"


def test_eval_condition_reads_the_context_and_the_output():
    context = {"score": 4, "tags": ["a", "b"]}
    assert contexture.eval_condition("score > 3 and tags | length == 2", context) is True
    assert contexture.eval_condition("output.ok", context, output={"ok": False}) is False
    assert contexture.eval_condition("score * 2", context) == 8
    with pytest.raises(contexture.InputError):
        contexture.eval_condition("score >", context)
    with pytest.raises(contexture.InputError, match="context: expected a dict"):
        contexture.eval_condition("1", ["not", "a", "dict"])
