"""A client for ``contexture serve``: threads, fitted context and executions, sync
(:class:`Client`) and async (:class:`AsyncClient`), with typed results.

>>> from contexture.client import Client
>>> with Client("http://127.0.0.1:8080", api_key="ctx_...") as client:  # doctest: +SKIP
...     client.append("support-42", [{"role": "user", "content": "My order is late."}])
...     fitted = client.context("support-42", model="gpt-4o", max_tokens=8000)

Needs ``httpx`` (the OpenAI SDK's HTTP client). A request the server refuses raises
:class:`ApiError` with its status, code and message; ids are always sent percent-encoded
in the path, so an id can never change the route.
"""

import json
import time
from dataclasses import dataclass, field
from typing import Any, AsyncIterator, Callable, Dict, Iterator, List, Optional
from urllib.parse import quote

import httpx

from ._errors import Error

__all__ = [
    "ApiError",
    "Appended",
    "AsyncClient",
    "Client",
    "Event",
    "Execution",
    "FittedContext",
    "ThreadSummary",
]

#: The statuses an execution ends in.
FINISHED = frozenset({"completed", "failed", "cancelled", "interrupted"})


class ApiError(Error):
    """The server refused a request: ``status`` (HTTP), ``code``, ``param`` (the field
    at fault, when one is) and the server's ``message``."""

    def __init__(self, status: int, code: str, message: str, param: Optional[str] = None):
        super().__init__(f"{status} {code}: {message}")
        self.status = status
        self.code = code
        self.message = message
        self.param = param


@dataclass(frozen=True)
class ThreadSummary:
    """A thread as ``GET /v1/threads/{id}`` describes it."""

    id: str
    last_seq: int
    context: str = "main"
    messages: int = 0
    metadata: Dict[str, Any] = field(default_factory=dict)
    parent: Optional[str] = None
    fork_seq: Optional[int] = None
    policy: Optional[Dict[str, Any]] = None
    applied_policy: Optional[Dict[str, Any]] = None
    retention: Optional[Dict[str, Any]] = None
    applied_retention: Optional[Dict[str, Any]] = None


@dataclass(frozen=True)
class Appended:
    """Messages appended: each one's seq, and the seq of the switch to the context named,
    when one was recorded with them."""

    seqs: List[int]
    switch_seq: Optional[int] = None


@dataclass(frozen=True)
class FittedContext:
    """A thread fitted for a model: the messages a request would be sent, the budget part
    by part, and what fitting did (``fit``: limit, tokens before and after, what was left
    out)."""

    thread: str
    model: str
    messages: List[Dict[str, Any]]
    budget: Dict[str, Any]
    fit: Dict[str, Any]


@dataclass(frozen=True)
class Execution:
    """An execution's state: ``status`` (``queued`` until a server takes it, ``running``
    until it ends in ``completed``, ``failed``, ``cancelled`` or ``interrupted``), its
    ``output`` or ``error``, steps, usage and cost, and ``queue``: where it stands in the
    servers' queue (``state``, ``attempts``, ``adopted`` when a server took it over from
    one that stopped, ``node``, ``outcome``)."""

    id: str
    status: str
    output: Any = None
    error: Optional[str] = None
    cancel_requested: bool = False
    usage: Dict[str, Any] = field(default_factory=dict)
    cost_usd: Optional[float] = None
    steps: List[Dict[str, Any]] = field(default_factory=list)
    children: List[Any] = field(default_factory=list)
    parent_execution_id: Optional[str] = None
    usage_tree: Optional[Dict[str, Any]] = None
    queue: Optional[Dict[str, Any]] = None

    @property
    def finished(self) -> bool:
        """True once the execution has ended."""
        return self.status in FINISHED


@dataclass(frozen=True)
class Event:
    """One event of an execution's log: its ``seq``, ``type`` and the whole event."""

    seq: int
    type: str
    data: Dict[str, Any]


def _known(cls: Any, body: Dict[str, Any]) -> Any:
    """``cls`` from the fields of ``body`` it has (a newer server's extra fields are
    ignored)."""
    names = cls.__dataclass_fields__
    return cls(**{key: value for key, value in body.items() if key in names})


def _segment(value: str, name: str) -> str:
    if not isinstance(value, str) or not value:
        raise ValueError(f"{name}: expected a non-empty str")
    return quote(value, safe="")


def _drop_none(values: Dict[str, Any]) -> Dict[str, Any]:
    return {key: value for key, value in values.items() if value is not None}


@dataclass(frozen=True)
class _Call:
    """One request, and how its answer is read."""

    method: str
    path: str
    read: Callable[[Any], Any]
    params: Optional[Dict[str, Any]] = None
    body: Optional[Dict[str, Any]] = None
    headers: Optional[Dict[str, str]] = None


class _Calls:
    """The requests of every operation, shared by both clients."""

    @staticmethod
    def create_thread(id, system, messages, metadata, policy) -> _Call:
        body = _drop_none(
            {"id": id, "system": system, "messages": messages, "metadata": metadata, "policy": policy}
        )
        return _Call("POST", "/v1/threads", lambda answer: answer, body=body)

    @staticmethod
    def thread(thread_id) -> _Call:
        return _Call(
            "GET", f"/v1/threads/{_segment(thread_id, 'thread_id')}", lambda a: _known(ThreadSummary, a)
        )

    @staticmethod
    def threads(after, limit) -> _Call:
        return _Call("GET", "/v1/threads", lambda a: a, params=_drop_none({"after": after, "limit": limit}))

    @staticmethod
    def append(thread_id, messages, idempotency_key, context) -> _Call:
        if isinstance(messages, dict):
            messages = [messages]
        return _Call(
            "POST",
            f"/v1/threads/{_segment(thread_id, 'thread_id')}/messages",
            lambda a: _known(Appended, a),
            params=_drop_none({"context": context}),
            body={"messages": list(messages)},
            headers=_drop_none({"Idempotency-Key": idempotency_key}) or None,
        )

    @staticmethod
    def messages(thread_id, limit, context) -> _Call:
        return _Call(
            "GET",
            f"/v1/threads/{_segment(thread_id, 'thread_id')}/messages",
            lambda a: a["messages"],
            params=_drop_none({"limit": limit, "context": context}),
        )

    @staticmethod
    def context(thread_id, model, max_tokens, strategy) -> _Call:
        return _Call(
            "GET",
            f"/v1/threads/{_segment(thread_id, 'thread_id')}/context",
            lambda a: _known(FittedContext, a),
            params=_drop_none({"model": model, "max_tokens": max_tokens, "strategy": strategy}),
        )

    @staticmethod
    def set_policy(thread_id, policy) -> _Call:
        path = f"/v1/threads/{_segment(thread_id, 'thread_id')}/policy"
        if policy is None:
            return _Call("DELETE", path, lambda a: a)
        return _Call("PUT", path, lambda a: a, body=policy)

    @staticmethod
    def pop(thread_id, format) -> _Call:
        return _Call(
            "POST",
            f"/v1/threads/{_segment(thread_id, 'thread_id')}/pop",
            lambda a: a["item"],
            body={"format": format},
        )

    @staticmethod
    def clear(thread_id) -> _Call:
        return _Call(
            "POST",
            f"/v1/threads/{_segment(thread_id, 'thread_id')}/clear",
            lambda a: a["seq"],
            body={},
        )

    @staticmethod
    def fork(thread_id, new_id, at_seq) -> _Call:
        return _Call(
            "POST",
            f"/v1/threads/{_segment(thread_id, 'thread_id')}/fork",
            lambda a: a,
            body=_drop_none({"id": new_id, "at_seq": at_seq}),
        )

    @staticmethod
    def compact(thread_id, options) -> _Call:
        return _Call(
            "POST",
            f"/v1/threads/{_segment(thread_id, 'thread_id')}/compact",
            lambda a: a,
            body=_drop_none(options),
        )

    @staticmethod
    def delete_thread(thread_id) -> _Call:
        return _Call("DELETE", f"/v1/threads/{_segment(thread_id, 'thread_id')}", lambda a: None)

    @staticmethod
    def start(workflow, workflow_yaml, input, id, user_context, conversation) -> _Call:
        if (workflow is None) == (workflow_yaml is None):
            raise ValueError("give either workflow (a file of the server's) or workflow_yaml")
        body = _drop_none(
            {
                "workflow": workflow,
                "workflow_yaml": workflow_yaml,
                "input": input,
                "id": id,
                "user_context": user_context,
                "conversation": conversation,
            }
        )
        return _Call("POST", "/v1/executions", lambda a: a["id"], body=body)

    @staticmethod
    def execution(execution_id) -> _Call:
        return _Call(
            "GET",
            f"/v1/executions/{_segment(execution_id, 'execution_id')}",
            lambda a: _known(Execution, a),
        )

    @staticmethod
    def cancel(execution_id, reason) -> _Call:
        return _Call(
            "POST",
            f"/v1/executions/{_segment(execution_id, 'execution_id')}/cancel",
            lambda a: a,
            body=_drop_none({"reason": reason}),
        )

    @staticmethod
    def events(execution_id, after) -> _Call:
        return _Call(
            "GET",
            f"/v1/executions/{_segment(execution_id, 'execution_id')}/events",
            lambda a: a,
            params=_drop_none({"after": after}),
        )


def _answer(response: httpx.Response, call: _Call) -> Any:
    if response.status_code >= 400:
        try:
            problem = response.json()["error"]
            raise ApiError(
                response.status_code,
                problem.get("code") or problem.get("type") or "error",
                problem.get("message", ""),
                problem.get("param"),
            )
        except (ValueError, KeyError, TypeError):
            raise ApiError(response.status_code, "error", response.text[:500]) from None
    if not response.content:
        return call.read(None)
    return call.read(response.json())


class _SseReader:
    """Server-sent events, line by line, into :class:`Event`s."""

    def __init__(self) -> None:
        self._data: List[str] = []

    def feed(self, line: str) -> Optional[Event]:
        if line == "":
            if not self._data:
                return None
            data = json.loads("\n".join(self._data))
            self._data = []
            return Event(seq=int(data.get("seq", 0)), type=str(data.get("type", "")), data=data)
        if line.startswith("data:"):
            self._data.append(line[5:].lstrip(" "))
        return None


class Client:
    """A synchronous client of ``contexture serve`` at ``base_url`` (with or without
    ``/v1``), authenticated by ``api_key`` (a ``ctx_...`` key of a tenant)."""

    def __init__(
        self, base_url: str, api_key: Optional[str] = None, *, timeout: float = 30.0
    ) -> None:
        base = base_url.rstrip("/")
        if base.endswith("/v1"):
            base = base[: -len("/v1")]
        headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        self._http = httpx.Client(base_url=base, headers=headers, timeout=timeout)

    def __enter__(self) -> "Client":
        return self

    def __exit__(self, *_: Any) -> None:
        self.close()

    def close(self) -> None:
        """Closes the connections."""
        self._http.close()

    def _run(self, call: _Call) -> Any:
        response = self._http.request(
            call.method, call.path, params=call.params, json=call.body, headers=call.headers
        )
        return _answer(response, call)

    def create_thread(
        self,
        id: Optional[str] = None,
        *,
        system: Optional[str] = None,
        messages: Optional[List[Dict[str, Any]]] = None,
        metadata: Optional[Dict[str, Any]] = None,
        policy: Optional[Dict[str, Any]] = None,
    ) -> Dict[str, Any]:
        """Creates a thread (``id`` and ``last_seq``); 409 when the id exists."""
        return self._run(_Calls.create_thread(id, system, messages, metadata, policy))

    def thread(self, thread_id: str) -> ThreadSummary:
        """A thread's summary."""
        return self._run(_Calls.thread(thread_id))

    def threads(self, *, after: Optional[str] = None, limit: Optional[int] = None) -> Dict[str, Any]:
        """A page of the tenant's threads (``threads``, ``next_after``)."""
        return self._run(_Calls.threads(after, limit))

    def append(
        self,
        thread_id: str,
        messages: Any,
        *,
        idempotency_key: Optional[str] = None,
        context: Optional[str] = None,
    ) -> Appended:
        """Appends OpenAI messages in one transaction (the thread is made when missing)."""
        return self._run(_Calls.append(thread_id, messages, idempotency_key, context))

    def messages(
        self, thread_id: str, *, limit: Optional[int] = None, context: Optional[str] = None
    ) -> List[Dict[str, Any]]:
        """The thread's projection as OpenAI messages (or its last ``limit`` units)."""
        return self._run(_Calls.messages(thread_id, limit, context))

    def context(
        self,
        thread_id: str,
        *,
        model: str,
        max_tokens: Optional[int] = None,
        strategy: Optional[str] = None,
    ) -> FittedContext:
        """The thread fitted for ``model`` as a request to it would be sent."""
        return self._run(_Calls.context(thread_id, model, max_tokens, strategy))

    def set_policy(self, thread_id: str, policy: Optional[Dict[str, Any]]) -> Any:
        """Sets the thread's own policy (``None`` removes it)."""
        return self._run(_Calls.set_policy(thread_id, policy))

    def pop(self, thread_id: str, *, format: str = "openai") -> Optional[Dict[str, Any]]:
        """Takes the newest item off the conversation and returns it (``None`` when it is
        empty): the last message (``openai``) or the last item of the last turn
        (``responses``). One event; the log keeps it."""
        return self._run(_Calls.pop(thread_id, format))

    def clear(self, thread_id: str) -> Optional[int]:
        """Empties the conversation (system prompt and pinned messages stay) as one event;
        its seq, ``None`` when there was nothing to clear."""
        return self._run(_Calls.clear(thread_id))

    def fork(self, thread_id: str, new_id: str, *, at_seq: Optional[int] = None) -> Any:
        """Forks the thread as ``new_id`` after event ``at_seq`` (default its last)."""
        return self._run(_Calls.fork(thread_id, new_id, at_seq))

    def compact(self, thread_id: str, **options: Any) -> Dict[str, Any]:
        """Compacts the thread (``model``, ``keep_tokens``, ``keep_messages``, ``notes``);
        the report."""
        return self._run(_Calls.compact(thread_id, options))

    def delete_thread(self, thread_id: str) -> None:
        """Deletes the thread."""
        self._run(_Calls.delete_thread(thread_id))

    def start(
        self,
        *,
        workflow: Optional[str] = None,
        workflow_yaml: Optional[str] = None,
        input: Any = None,
        id: Optional[str] = None,
        user_context: Optional[Dict[str, Any]] = None,
        conversation: Optional[Dict[str, str]] = None,
    ) -> str:
        """Starts an execution of ``workflow`` (a file of the server's) or
        ``workflow_yaml``; returns its id."""
        return self._run(_Calls.start(workflow, workflow_yaml, input, id, user_context, conversation))

    def execution(self, execution_id: str) -> Execution:
        """The execution's state now."""
        return self._run(_Calls.execution(execution_id))

    def cancel(self, execution_id: str, *, reason: Optional[str] = None) -> Any:
        """Cancels the execution and its sub-executions."""
        return self._run(_Calls.cancel(execution_id, reason))

    def events(self, execution_id: str, *, after: Optional[int] = None) -> Iterator[Event]:
        """The execution's events as they happen, until it ends (``after``: resume after
        that seq)."""
        return self._stream_events(execution_id, after, None)

    def wait(self, execution_id: str, *, timeout: Optional[float] = None) -> Execution:
        """Follows the execution's events until it ends and returns its final state;
        ``TimeoutError`` after ``timeout`` seconds."""
        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            execution = self.execution(execution_id)
            if execution.finished:
                return execution
            remaining = None if deadline is None else deadline - time.monotonic()
            if remaining is not None and remaining <= 0:
                raise TimeoutError(f"execution {execution_id} is still {execution.status}")
            try:
                for event in self._stream_events(execution_id, None, remaining):
                    if event.type == "run_ended":
                        break
            except httpx.TimeoutException:
                pass

    def _stream_events(
        self, execution_id: str, after: Optional[int], read_timeout: Optional[float]
    ) -> Iterator[Event]:
        call = _Calls.events(execution_id, after)
        with self._http.stream(
            "GET", call.path, params=call.params, timeout=httpx.Timeout(read_timeout, connect=30.0)
        ) as response:
            if response.status_code >= 400:
                response.read()
                _answer(response, call)
            reader = _SseReader()
            for line in response.iter_lines():
                event = reader.feed(line)
                if event is not None:
                    yield event


class AsyncClient:
    """The asynchronous twin of :class:`Client`: the same methods, awaited (``events``
    is an async iterator)."""

    def __init__(
        self, base_url: str, api_key: Optional[str] = None, *, timeout: float = 30.0
    ) -> None:
        base = base_url.rstrip("/")
        if base.endswith("/v1"):
            base = base[: -len("/v1")]
        headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        self._http = httpx.AsyncClient(base_url=base, headers=headers, timeout=timeout)

    async def __aenter__(self) -> "AsyncClient":
        return self

    async def __aexit__(self, *_: Any) -> None:
        await self.aclose()

    async def aclose(self) -> None:
        """Closes the connections."""
        await self._http.aclose()

    async def _run(self, call: _Call) -> Any:
        response = await self._http.request(
            call.method, call.path, params=call.params, json=call.body, headers=call.headers
        )
        return _answer(response, call)

    async def create_thread(
        self,
        id: Optional[str] = None,
        *,
        system: Optional[str] = None,
        messages: Optional[List[Dict[str, Any]]] = None,
        metadata: Optional[Dict[str, Any]] = None,
        policy: Optional[Dict[str, Any]] = None,
    ) -> Dict[str, Any]:
        return await self._run(_Calls.create_thread(id, system, messages, metadata, policy))

    async def thread(self, thread_id: str) -> ThreadSummary:
        return await self._run(_Calls.thread(thread_id))

    async def threads(
        self, *, after: Optional[str] = None, limit: Optional[int] = None
    ) -> Dict[str, Any]:
        return await self._run(_Calls.threads(after, limit))

    async def append(
        self,
        thread_id: str,
        messages: Any,
        *,
        idempotency_key: Optional[str] = None,
        context: Optional[str] = None,
    ) -> Appended:
        return await self._run(_Calls.append(thread_id, messages, idempotency_key, context))

    async def messages(
        self, thread_id: str, *, limit: Optional[int] = None, context: Optional[str] = None
    ) -> List[Dict[str, Any]]:
        return await self._run(_Calls.messages(thread_id, limit, context))

    async def context(
        self,
        thread_id: str,
        *,
        model: str,
        max_tokens: Optional[int] = None,
        strategy: Optional[str] = None,
    ) -> FittedContext:
        return await self._run(_Calls.context(thread_id, model, max_tokens, strategy))

    async def set_policy(self, thread_id: str, policy: Optional[Dict[str, Any]]) -> Any:
        return await self._run(_Calls.set_policy(thread_id, policy))

    async def pop(self, thread_id: str, *, format: str = "openai") -> Optional[Dict[str, Any]]:
        return await self._run(_Calls.pop(thread_id, format))

    async def clear(self, thread_id: str) -> Optional[int]:
        return await self._run(_Calls.clear(thread_id))

    async def fork(self, thread_id: str, new_id: str, *, at_seq: Optional[int] = None) -> Any:
        return await self._run(_Calls.fork(thread_id, new_id, at_seq))

    async def compact(self, thread_id: str, **options: Any) -> Dict[str, Any]:
        return await self._run(_Calls.compact(thread_id, options))

    async def delete_thread(self, thread_id: str) -> None:
        await self._run(_Calls.delete_thread(thread_id))

    async def start(
        self,
        *,
        workflow: Optional[str] = None,
        workflow_yaml: Optional[str] = None,
        input: Any = None,
        id: Optional[str] = None,
        user_context: Optional[Dict[str, Any]] = None,
        conversation: Optional[Dict[str, str]] = None,
    ) -> str:
        return await self._run(
            _Calls.start(workflow, workflow_yaml, input, id, user_context, conversation)
        )

    async def execution(self, execution_id: str) -> Execution:
        return await self._run(_Calls.execution(execution_id))

    async def cancel(self, execution_id: str, *, reason: Optional[str] = None) -> Any:
        return await self._run(_Calls.cancel(execution_id, reason))

    async def events(
        self, execution_id: str, *, after: Optional[int] = None
    ) -> AsyncIterator[Event]:
        call = _Calls.events(execution_id, after)
        async with self._http.stream(
            "GET", call.path, params=call.params, timeout=httpx.Timeout(None, connect=30.0)
        ) as response:
            if response.status_code >= 400:
                await response.aread()
                _answer(response, call)
            reader = _SseReader()
            async for line in response.aiter_lines():
                event = reader.feed(line)
                if event is not None:
                    yield event

    async def wait(self, execution_id: str, *, timeout: Optional[float] = None) -> Execution:
        import asyncio

        async def follow() -> Execution:
            while True:
                execution = await self.execution(execution_id)
                if execution.finished:
                    return execution
                async for event in self.events(execution_id):
                    if event.type == "run_ended":
                        break

        try:
            return await asyncio.wait_for(follow(), timeout)
        except asyncio.TimeoutError:
            raise TimeoutError(f"execution {execution_id} did not end within {timeout} s") from None
