"""Contexture in-process: exact token counts, fitting that keeps tool calls with their
results, provider-rule validation and repair, for Python agents.

Messages are OpenAI-format dicts (``{"role": "user", "content": "..."}``); pass
``format="anthropic"`` to give and get Anthropic Messages turns instead (a list of turns,
or a dict with ``system`` and ``messages``).

>>> import contexture
>>> contexture.count_tokens("hello world", encoding="cl100k_base")
2
"""

from typing import Any, Dict, List, NamedTuple, Optional, Sequence

from . import _native
from ._errors import Error, FitError, InputError, StoreError, TemplateError

__version__: str = _native.__version__

count_tokens = _native.count_tokens
count_messages = _native.count_messages
validate = _native.validate
convert = _native.convert
Template = _native.Template
parse_output = _native.parse_output
eval_condition = _native.eval_condition
Store = _native.Store
Thread = _native.Thread


class Fitted(NamedTuple):
    """What :func:`fit` returns: the fitted messages and the report of the fit."""

    messages: Any
    """The fitted messages, in the format they were given in."""
    report: Dict[str, Any]
    """What the fit did: ``dropped`` (ranges of input indices), ``dropped_count``,
    ``cleared``, ``truncated``, ``repairs``, ``tokens_before``, ``tokens_after``,
    ``max_tokens``, ``over_budget`` and more."""


class Repaired(NamedTuple):
    """What :func:`repair` returns: the mended messages and the changes made."""

    messages: Any
    """The mended messages, in the format they were given in."""
    changes: List[Dict[str, Any]]
    """Each change, with its ``kind`` and the indexes it concerns."""


def fit(
    messages: Any,
    model: str,
    max_tokens: Optional[int] = None,
    strategy: Optional[str] = None,
    rules: Optional[str] = None,
    policy: Optional[Dict[str, Any]] = None,
    tools: Optional[List[Dict[str, Any]]] = None,
    *,
    pin: Sequence[int] = (),
    start_on: Sequence[str] = (),
    end_on: Sequence[str] = (),
    include_system: bool = True,
    allow_partial: bool = False,
    counts: Optional[Sequence[int]] = None,
    format: str = "openai",
) -> Fitted:
    """Fit ``messages`` into ``model``'s window, exactly as Contexture fits a request.

    The budget is the model's context window minus the reply reserve (the policy's, else
    the model's output limit, at most a quarter of the window), lowered to ``max_tokens``
    when given; it bounds the whole request: messages, reply priming and ``tools``.
    Oversized tool results are cut and old ones cleared when the ``policy`` says so; then
    the history is trimmed by ``strategy`` (``"last"``, ``"first"``, ``"head-tail"`` or
    ``"head-tail:N"``; default the policy's, else ``"last"``), never separating a tool
    call from its results, and mended for ``rules`` (``"openai"``, ``"anthropic"`` or
    ``"gemini"``; default the model's provider's). A leading system message is kept
    unless ``include_system`` is false; ``pin`` lists indexes always kept. ``counts``
    gives each message's tokens (its overhead included) in place of counting them.

    Kept messages are the objects given (``report["sources"][i]`` is the index of output
    message ``i`` among those given, ``None`` for one the fit changed or made).

    ``policy`` is a fit policy dict, the shape of a workflow assistant's ``context:``
    (``window``, ``reserve``, ``budget_ratio``, ``strategy``, ``truncate_tool_results``,
    ``clear_tool_results``, ``hysteresis``).

    Raises :class:`InputError` for bad input (naming the message and field) and
    :class:`FitError` when what must be kept does not fit.
    """
    fitted, report = _native.fit(
        messages,
        model,
        max_tokens,
        strategy,
        rules,
        policy,
        tools,
        pin=list(pin),
        start_on=list(start_on),
        end_on=list(end_on),
        include_system=include_system,
        allow_partial=allow_partial,
        counts=None if counts is None else list(counts),
        format=format,
    )
    return Fitted(fitted, report)


def repair(messages: Any, rules: str = "openai", *, format: str = "openai") -> Repaired:
    """Mend ``messages`` for the provider's ``rules``: orphan tool results dropped,
    unanswered calls given a cancelled result, system messages lifted to the front, turns
    of one role merged where the rules need alternation. Returns the mended list and the
    changes made."""
    repaired, changes = _native.repair(messages, rules, format=format)
    return Repaired(repaired, changes)


__all__ = [
    "Error",
    "FitError",
    "Fitted",
    "InputError",
    "Repaired",
    "Store",
    "StoreError",
    "Template",
    "TemplateError",
    "Thread",
    "convert",
    "count_messages",
    "count_tokens",
    "eval_condition",
    "fit",
    "parse_output",
    "repair",
    "validate",
]
