"""A session for the OpenAI Agents SDK over a Contexture thread.

``ContextureSession`` implements the SDK's ``Session`` protocol (``get_items``,
``add_items``, ``pop_item``, ``clear_session``). Its items live in a Contexture thread, in
an SQLite file (``db="sqlite:PATH"``, the CLI's format) or a PostgreSQL database, or in
``contexture serve`` (``url=..., api_key=...``). What an agent is given back is the history *fitted* for its
model by the thread's policy: tool calls kept with their results, old tool results cleared
when the policy says so, the newest history within the window; not the SDK's plain last N
items.

>>> from agents import Agent, Runner
>>> from contexture.agents import ContextureSession
>>> session = ContextureSession("user-42", db="sqlite:agents.db", model="gpt-4o")
>>> Runner.run_sync(Agent(name="helper"), "Hello", session=session)  # doctest: +SKIP
"""

import asyncio
from typing import Any, Dict, List, Optional

from . import Fitted
from ._errors import StoreError
from ._native import Store, convert

__all__ = ["ContextureSession"]


class ContextureSession:
    """An Agents SDK session kept in a Contexture thread.

    - ``session_id``: the thread's id.
    - ``db``: the store, ``sqlite:PATH`` (default ``sqlite:contexture.db``) or a
      PostgreSQL URL; or ``url`` and ``api_key`` of a ``contexture serve`` (a tenant's
      key: the session is that tenant's thread), which needs ``httpx``.
    - ``model``: the model the history is fitted for (default ``gpt-4o``).
    - ``policy``: the thread's own policy, set when given: ``{"context": {...},
      "compaction": {...}}``, the shape a thread's policy has everywhere (for example
      ``{"context": {"clear_tool_results": {"keep": 3}}}``).
    - ``session_settings``: the SDK's ``SessionSettings`` (its ``limit`` asks for the
      newest items as stored instead of the fitted history).

    Store calls run in a worker thread (``asyncio.to_thread``), so the event loop goes on.
    """

    def __init__(
        self,
        session_id: str,
        db: str = "sqlite:contexture.db",
        *,
        model: str = "gpt-4o",
        policy: Optional[Dict[str, Any]] = None,
        url: Optional[str] = None,
        api_key: Optional[str] = None,
        session_settings: Any = None,
    ) -> None:
        self.session_id = session_id
        self.session_settings = session_settings
        self.model = model
        if url is not None:
            self._thread: Any = _RemoteThread(url, api_key, session_id)
        else:
            self._thread = Store(db).thread(session_id)
        if policy is not None:
            self._thread.set_policy(policy)

    async def get_items(self, limit: Optional[int] = None) -> List[Dict[str, Any]]:
        """The history: fitted for the session's model by the thread's policy; with
        ``limit``, the newest ``limit`` items as they were stored (what the SDK compares
        with what it saved when it rewinds a turn)."""
        return await asyncio.to_thread(self._get_items, limit)

    async def add_items(self, items: List[Dict[str, Any]]) -> None:
        """Appends ``items`` to the thread in one transaction."""
        if items:
            await asyncio.to_thread(self._thread.append, list(items), format="responses")

    async def pop_item(self) -> Optional[Dict[str, Any]]:
        """Removes the newest item and returns it (``None`` when the session is empty).
        The thread's log keeps it: a pop is one more event."""
        return await asyncio.to_thread(self._pop_item)

    async def clear_session(self) -> None:
        """Empties the session; the thread's log keeps every item."""
        await asyncio.to_thread(self._clear)

    def _get_items(self, limit: Optional[int]) -> List[Dict[str, Any]]:
        if limit is None and self.session_settings is not None:
            limit = getattr(self.session_settings, "limit", None)
        try:
            if limit is None:
                return list(self._thread.context(self.model, format="responses").messages)
            if limit <= 0:
                return []
            items = self._thread.messages(limit=limit, format="responses")
            return list(items[-limit:])
        except StoreError:
            if not self._thread.exists():
                return []
            raise

    def _pop_item(self) -> Optional[Dict[str, Any]]:
        try:
            return self._thread.pop_item(format="responses")
        except StoreError:
            if not self._thread.exists():
                return None
            raise

    def _clear(self) -> None:
        try:
            self._thread.clear()
        except StoreError:
            if self._thread.exists():
                raise


class _RemoteThread:
    """A thread of ``contexture serve`` with the methods of a local ``Thread`` the session
    uses; items are converted to and from the server's OpenAI messages here, and a
    missing thread is a ``StoreError`` as locally."""

    def __init__(self, url: str, api_key: Optional[str], thread_id: str) -> None:
        from .client import Client

        self._client = Client(url, api_key=api_key)
        self._id = thread_id

    def _call(self, operation, *arguments, **options):
        from .client import ApiError

        try:
            return operation(self._id, *arguments, **options)
        except ApiError as problem:
            if problem.status == 404:
                raise StoreError(problem.message) from problem
            raise

    def append(self, items: List[Dict[str, Any]], *, format: str) -> None:
        self._call(self._client.append, convert(items, source=format, target="openai"))

    def context(self, model: str, *, format: str) -> Any:
        fitted = self._call(self._client.context, model=model)
        return Fitted(convert(fitted.messages, source="openai", target=format), fitted.fit)

    def messages(self, *, limit: Optional[int], format: str) -> List[Dict[str, Any]]:
        messages = self._call(self._client.messages, limit=limit)
        return convert(messages, source="openai", target=format)

    def pop_item(self, *, format: str) -> Optional[Dict[str, Any]]:
        return self._call(self._client.pop, format=format)

    def clear(self) -> Optional[int]:
        return self._call(self._client.clear)

    def exists(self) -> bool:
        try:
            self._call(self._client.thread)
            return True
        except StoreError:
            return False

    def set_policy(self, policy: Optional[Dict[str, Any]]) -> None:
        try:
            self._call(self._client.set_policy, policy)
        except StoreError:
            # A thread not there yet starts with the policy.
            self._client.create_thread(self._id, policy=policy)
