"""A drop-in for LangChain's ``trim_messages`` that never breaks a tool call from its
results.

``contexture.langchain.trim_messages`` takes LangChain messages and the same arguments as
``langchain_core.messages.trim_messages``; it trims with Contexture's fit (exact counts for
``model`` by default, the history kept by whole units: an assistant turn with all its tool
results, never a result without its call or a call without its results) and returns the
kept message objects themselves. Called without messages it returns a ``Runnable``, as
LangChain's does.

Needs ``langchain-core``.
"""

from functools import partial
from typing import Any, Callable, List, Optional, Sequence, Union

from langchain_core.messages import BaseMessage, convert_to_messages
from langchain_core.messages.utils import convert_to_openai_messages

from . import _native

__all__ = ["trim_messages"]

# LangChain's message types as Contexture's roles.
_ROLES = {"system": "system", "human": "user", "ai": "assistant", "tool": "tool"}

TypeOrTypes = Union[str, type, Sequence[Union[str, type]], None]


def trim_messages(
    messages: Optional[Sequence[Any]] = None,
    *,
    max_tokens: int,
    token_counter: Union[Callable[..., int], Any, str, None] = None,
    strategy: str = "last",
    allow_partial: bool = False,
    end_on: TypeOrTypes = None,
    start_on: TypeOrTypes = None,
    include_system: bool = False,
    text_splitter: Optional[Callable[[str], List[str]]] = None,
    model: str = "gpt-4o",
) -> Any:
    """Trim ``messages`` to at most ``max_tokens`` tokens, keeping tool calls with their
    results.

    Arguments are LangChain's:

    - ``token_counter``: ``None`` (default) counts exactly as ``model`` does (its
      tokenizer and OpenAI's chat recipe: per-message overhead and reply priming). A
      function of a message list or of one message, a chat model (its
      ``get_num_tokens_from_messages``) or ``"approximate"`` counts as LangChain would:
      each message is counted once, as ``counter([message]) - counter([])``, and the
      list's own cost ``counter([])`` once.
    - ``strategy``: ``"last"`` keeps the newest messages, ``"first"`` the oldest.
    - ``include_system``: keep a leading system message whatever the budget (``"last"``
      only).
    - ``start_on`` / ``end_on``: the message types (``"human"``, ``"ai"``, ``"system"``,
      ``"tool"``, or classes) the kept history may start / end with.
    - ``allow_partial``: use leftover budget for part of one more message, cut at line
      breaks (a custom ``text_splitter`` is refused: Contexture cuts at line breaks).

    Returns the kept messages: the objects given, but for one cut in part (a new message).
    """
    if messages is None:
        from langchain_core.runnables import RunnableLambda

        return RunnableLambda(
            partial(
                trim_messages,
                max_tokens=max_tokens,
                token_counter=token_counter,
                strategy=strategy,
                allow_partial=allow_partial,
                end_on=end_on,
                start_on=start_on,
                include_system=include_system,
                text_splitter=text_splitter,
                model=model,
            ),
            name="trim_messages",
        )
    if strategy not in ("first", "last"):
        raise ValueError(
            f"Unrecognized strategy={strategy!r}. Supported strategies are 'last' and 'first'."
        )
    if start_on and strategy == "first":
        raise ValueError("start_on parameter is only valid with strategy='last'")
    if include_system and strategy == "first":
        raise ValueError("include_system parameter is only valid with strategy='last'")
    if allow_partial and text_splitter is not None:
        raise ValueError(
            "text_splitter: Contexture cuts a partial message at line breaks; a custom "
            "splitter is not supported"
        )
    given: List[BaseMessage] = convert_to_messages(messages)
    if not given:
        return []
    counts = None
    budget = max_tokens
    if token_counter is not None:
        count = _list_counter(token_counter)
        base = count([])
        counts = [max(0, count([message]) - base) for message in given]
        # Contexture adds the reply priming (3 tokens) to every request; the counter's
        # own cost of a list takes its place.
        budget = max_tokens - base + 3
    if budget < 3:
        # Not even an empty request fits.
        return []
    # Each message is turned into an OpenAI dict only when the fit reads it: from the
    # newest, as far back as the budget can reach.
    fitted, report = _native.fit(
        given,
        model,
        max_tokens=budget,
        strategy=strategy,
        policy={"reserve": 0},
        start_on=_roles(start_on),
        end_on=_roles(end_on),
        include_system=include_system,
        allow_partial=allow_partial,
        counts=counts,
        convert=convert_to_openai_messages,
    )
    return [
        given[source] if source is not None else convert_to_messages([message])[0]
        for message, source in zip(fitted, report["sources"])
    ]


def _list_counter(token_counter: Any) -> Callable[[List[BaseMessage]], int]:
    """LangChain's token counter argument as a function of a message list."""
    if isinstance(token_counter, str):
        from langchain_core.messages.utils import _TOKEN_COUNTER_SHORTCUTS

        if token_counter not in _TOKEN_COUNTER_SHORTCUTS:
            shortcuts = ", ".join(f"'{key}'" for key in _TOKEN_COUNTER_SHORTCUTS)
            raise ValueError(
                f"Invalid token_counter shortcut '{token_counter}'. Available shortcuts: {shortcuts}."
            )
        token_counter = _TOKEN_COUNTER_SHORTCUTS[token_counter]
    if hasattr(token_counter, "get_num_tokens_from_messages"):
        return token_counter.get_num_tokens_from_messages
    if not callable(token_counter):
        raise ValueError(
            "'token_counter' expected to be a model that implements "
            "'get_num_tokens_from_messages()' or a function. Received object of type "
            f"{type(token_counter)}."
        )
    import inspect

    parameters = list(inspect.signature(token_counter).parameters.values())
    if parameters and parameters[0].annotation is BaseMessage:
        return lambda messages: sum(token_counter(message) for message in messages)
    return token_counter


def _roles(types: TypeOrTypes) -> List[str]:
    """LangChain's ``start_on``/``end_on`` as Contexture's roles."""
    if types is None:
        return []
    listed = [types] if isinstance(types, (str, type)) else list(types)
    roles = []
    for kind in listed:
        if isinstance(kind, type):
            field = getattr(kind, "model_fields", {}).get("type")
            kind = getattr(field, "default", None)
        if kind not in _ROLES:
            raise ValueError(
                f"unknown message type {kind!r} (expected 'human', 'ai', 'system', 'tool' "
                "or their classes)"
            )
        roles.append(_ROLES[kind])
    return roles
