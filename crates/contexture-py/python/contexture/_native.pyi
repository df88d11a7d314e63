"""Type hints of the native module (see the ``contexture`` package for the documented API)."""

from typing import Any, Callable, Dict, List, Optional, Tuple

__version__: str

def count_tokens(
    text: str, encoding: Optional[str] = None, model: Optional[str] = None
) -> int:
    """The exact tokens of ``text`` in ``encoding`` (``cl100k_base`` or ``o200k_base``),
    or as ``model`` counts; ``o200k_base`` when neither is given."""

def count_messages(
    messages: Any,
    model: str,
    tools: Optional[List[Dict[str, Any]]] = None,
    reserve: Optional[int] = None,
    format: str = "openai",
) -> Dict[str, Any]:
    """A chat request counted as ``model`` does: ``messages`` (each ``index``, ``role``,
    ``tokens``), ``reply_priming``, ``tools``, ``total``, ``encoding``, ``exact`` and the
    model's ``budget`` part by part."""

def fit(
    messages: Any,
    model: str,
    max_tokens: Optional[int] = None,
    strategy: Optional[str] = None,
    rules: Optional[str] = None,
    policy: Optional[Dict[str, Any]] = None,
    tools: Optional[List[Dict[str, Any]]] = None,
    *,
    pin: List[int] = ...,
    start_on: List[str] = ...,
    end_on: List[str] = ...,
    include_system: bool = True,
    allow_partial: bool = False,
    counts: Optional[List[int]] = None,
    format: str = "openai",
    convert: Optional[Callable[[Any], Dict[str, Any]]] = None,
) -> Tuple[Any, Dict[str, Any]]:
    """``contexture.fit``; ``convert`` turns each object of the list into an OpenAI
    message dict when the fit reads it (kept objects come back as they were given)."""
def convert(messages: Any, *, source: str = "openai", target: str = "openai") -> Any:
    """``messages`` read in the ``source`` format and written in the ``target`` one
    (``openai``, ``anthropic`` or ``responses``)."""

def validate(
    messages: Any, rules: str = "openai", *, format: str = "openai"
) -> List[Dict[str, Any]]:
    """Every place ``messages`` breaks the provider's rules: dicts with ``index``,
    ``kind``, the kind's fields and ``message``."""

def repair(
    messages: Any, rules: str = "openai", *, format: str = "openai"
) -> Tuple[Any, List[Dict[str, Any]]]: ...

class Template:
    """A prompt template: its text in Jinja (``{{ name }}``) or the simple syntax
    (``{name}``), with partial variables filled in ahead of time. ``a + b`` joins two
    templates, keeping both sides' partials (a conflict raises ``TemplateError``)."""

    def __init__(
        self, source: str, format: str = "jinja", partials: Optional[Dict[str, Any]] = None
    ) -> None: ...
    def render(
        self, context: Optional[Dict[str, Any]] = None, *, missing: str = "keep", **variables: Any
    ) -> str:
        """Renders against ``context`` and the keyword arguments (which win over the
        context's keys; both win over partials). ``missing``: ``"keep"``, ``"empty"`` or
        ``"error"``."""
    def __add__(self, other: "Template") -> "Template": ...
    @property
    def source(self) -> str: ...
    @property
    def format(self) -> str: ...
    @property
    def partials(self) -> Dict[str, Any]: ...
    @property
    def input_variables(self) -> List[str]: ...

def parse_output(text: str) -> Dict[str, Any]:
    """A step's output parsed as a workflow parses it: ``value``, ``format``, ``notes``."""

def eval_condition(
    expression: str, context: Optional[Dict[str, Any]] = None, output: Any = None
) -> Any:
    """The value of a workflow condition or expression against ``context`` and ``output``."""

class Store:
    """A thread store: ``sqlite:PATH`` (made when missing; the CLI's file format) or a
    PostgreSQL URL."""

    def __init__(self, url: str = "sqlite:contexture.db") -> None: ...
    def thread(self, id: str) -> "Thread":
        """The thread ``id`` (the first append makes it)."""
    def threads(self) -> List[Dict[str, Any]]:
        """Every thread: ``id``, ``last_seq``, ``parent``, ``fork_seq``, sizes."""
    @property
    def url(self) -> str: ...

class Thread:
    """A durable, append-only thread on a store."""

    def __init__(self, id: str, db: str = "sqlite:contexture.db") -> None: ...
    @property
    def id(self) -> str: ...
    def append(
        self,
        messages: Any,
        *,
        key: Optional[str] = None,
        context: Optional[str] = None,
        format: str = "openai",
    ) -> List[int]:
        """Appends a message or a list in one transaction; returns their seqs."""
    def messages(
        self, *, limit: Optional[int] = None, context: Optional[str] = None, format: str = "openai"
    ) -> Any:
        """The projection (system prompt, then the conversation), or its last ``limit``
        units."""
    def context(
        self,
        model: str,
        *,
        max_tokens: Optional[int] = None,
        strategy: Optional[str] = None,
        format: str = "openai",
    ) -> Any:
        """``Fitted(messages, report)``: what a request to ``model`` would be sent."""
    def events(self) -> List[Dict[str, Any]]: ...
    def exists(self) -> bool: ...
    def pop_item(self, *, format: str = "responses") -> Optional[Dict[str, Any]]:
        """Removes the newest item (the last item of the last turn in the ``responses``
        format, the last message in ``openai``) and returns it; one replace event."""
    def clear(self) -> Optional[int]:
        """Empties the conversation (system prompt and pinned messages stay); one event."""
    def set_policy(self, policy: Optional[Dict[str, Any]]) -> int:
        """Sets the thread's own policy (``{"context": ..., "compaction": ...}``)."""
    def fork(self, new_id: str, at: Optional[int] = None) -> "Thread": ...
    def merge(
        self,
        source: Any,
        *,
        policy: str = "append-messages",
        conflict: str = "child-wins",
        keys: List[str] = ...,
        all_keys: bool = False,
    ) -> int: ...
    def compact(
        self,
        *,
        keep_tokens: Optional[int] = None,
        keep_messages: Optional[int] = None,
        summary_tokens: Optional[int] = None,
        notes: Optional[str] = None,
    ) -> Dict[str, Any]:
        """Summarizes the older part offline into one recorded replace; the report."""
