"""The client side of WebSocket sessions: :class:`Session`, :class:`Watch` and
:class:`AsyncTransaction`.

This module owns one ``GET /v1/session`` connection as the client sees it
(:mod:`ledgerd.daemon.session` is the daemon's side): requests sent in order and their
replies matched by id, watch events routed to their :class:`Watch` iterators (with a
backlog for events that beat their watch's reply), conflicts put to a registered
resolver and its answers, and transactions held by the session. It does not open the
connection: :meth:`AsyncClient.open_session <ledgerd.daemon.client_async.AsyncClient.open_session>`
does, and :mod:`ledgerd.daemon.client_blocking` bridges these classes to blocking code.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import json
from collections.abc import AsyncGenerator
from typing import Any

import aiohttp

from ledgerd.daemon.client_types import (
    DISCONNECTED,
    Change,
    ConflictItem,
    DaemonUnavailableError,
    Item,
    LedgerError,
    Name,
    ResolverCallback,
    ResolveRequest,
    Side,
    b64,
    item_of,
    raw,
    unb64,
)


def _side(d: dict[str, Any] | None) -> Side | None:
    if d is None:
        return None
    v = d.get("value")
    return Side(None if v is None else unb64(v), int(d["size"]), d["priority"])


class Session:
    """One WebSocket session: requests in order, watch events routed to their iterators."""

    def __init__(self, ws: aiohttp.ClientWebSocketResponse) -> None:
        self.ws = ws
        self._ids = itertools.count(1)
        self._waiting: dict[int, asyncio.Future[dict[str, Any]]] = {}
        self._events: dict[str, asyncio.Queue[dict[str, Any] | None]] = {}
        self._early: dict[str, list[dict[str, Any]]] = {}
        self._reader: asyncio.Task[None] | None = None
        self._resolver: ResolverCallback | None = None
        self._answering: set[asyncio.Task[None]] = set()
        self._closing = False

    def _start(self) -> None:
        self._reader = asyncio.create_task(self._read())

    async def _read(self) -> None:
        try:
            async for msg in self.ws:
                if msg.type != aiohttp.WSMsgType.TEXT:
                    continue
                doc = json.loads(msg.data)
                if doc.get("event") == "resolve" and self._resolver is not None:
                    task = asyncio.create_task(self._answer(doc, self._resolver))
                    self._answering.add(task)
                    task.add_done_callback(self._answering.discard)
                    continue
                if "event" in doc:
                    if "watch" not in doc:
                        # Not a watcher's (a transaction rolled back as idle: its next
                        # request is answered with the reason).
                        continue
                    q = self._events.get(doc.get("watch", ""))
                    if q is not None:
                        q.put_nowait(doc)
                    else:
                        self._early.setdefault(doc.get("watch", ""), []).append(doc)
                    continue
                fut = self._waiting.pop(doc.get("id"), None)
                if fut is not None and not fut.done():
                    fut.set_result(doc)
        finally:
            for fut in self._waiting.values():
                if fut.done():
                    continue
                if self._closing:
                    fut.set_exception(LedgerError("closed", "the session was closed"))
                else:  # the daemon went away with the request unanswered
                    fut.set_exception(
                        DaemonUnavailableError(
                            "unavailable", "the session's connection to ledgerd was lost"
                        )
                    )
            for q in self._events.values():
                q.put_nowait(None)

    async def call(self, /, op: str, **args: Any) -> dict[str, Any]:
        """Send ``op`` with ``args`` and wait for its reply (LedgerError if it failed)."""
        # (``self, /``: a ParamSpec can then carry **args to BlockingSession.call.)
        rid = next(self._ids)
        fut: asyncio.Future[dict[str, Any]] = asyncio.get_running_loop().create_future()
        self._waiting[rid] = fut
        try:
            await self.ws.send_str(json.dumps({"id": rid, "op": op, **args}))
        except DISCONNECTED as e:
            self._waiting.pop(rid, None)
            raise DaemonUnavailableError(
                "unavailable", f"the session's connection to ledgerd was lost: {e}"
            ) from None
        doc = await fut
        if not doc.get("ok"):
            err = doc.get("error", {})
            raise LedgerError(err.get("code", "error"), err.get("message", "request failed"))
        return doc

    async def close(self) -> None:
        self._closing = True
        await self.ws.close()
        if self._reader is not None:
            await asyncio.gather(self._reader, return_exceptions=True)

    async def begin(self, ledger: Name, page: Name) -> AsyncTransaction:
        doc = await self.call("begin", ledger=b64(raw(ledger)), page=b64(raw(page)))
        return AsyncTransaction(self, doc["txn"], doc["base"])

    async def subscribe(self, ledger: Name, page: Name, prefix: bytes = b"") -> Watch:
        """Start watching; every commit after this returns is delivered by the Watch."""
        q: asyncio.Queue[dict[str, Any] | None] = asyncio.Queue()
        doc = await self.call(
            "watch", ledger=b64(raw(ledger)), page=b64(raw(page)), prefix=b64(prefix)
        )
        self._events[doc["watch"]] = q
        # Events that arrived before the reply was routed wait in the reader's backlog.
        for ev in self._early.pop(doc["watch"], []):
            q.put_nowait(ev)
        return Watch(self, doc["watch"], q)

    async def watch(
        self, ledger: Name, page: Name, prefix: bytes = b""
    ) -> AsyncGenerator[Change, None]:
        """Changes of every later commit under ``prefix``, in order, until the caller stops
        (closing the generator unwatches, so the session's watcher is released)."""
        w = await self.subscribe(ledger, page, prefix)
        try:
            async for change in w:
                yield change
        finally:
            await w.close()

    async def register_resolver(self, ledger: Name, callback: ResolverCallback) -> None:
        """Answer the ledger's conflicts with ``callback`` while this session is open."""
        self._resolver = callback
        await self.call("register_resolver", ledger=b64(raw(ledger)))

    async def _answer(self, doc: dict[str, Any], callback: ResolverCallback) -> None:
        req = ResolveRequest(
            unb64(doc["ledger"]),
            unb64(doc["page"]),
            doc["policy"],
            doc["left"],
            doc["right"],
            [
                ConflictItem(unb64(c["key"]), _side(c["base"]), _side(c["left"]), _side(c["right"]))
                for c in doc["conflicts"]
            ],
        )
        try:
            answer = await callback(req)
        except Exception as e:  # tell the daemon at once: the round changes nothing
            with contextlib.suppress(LedgerError):
                await self.call(
                    "resolved", request=doc["request"], error=f"{type(e).__name__}: {e}"
                )
            return
        choices: list[dict[str, str]] = []
        for key, choice in answer.items():
            if choice in ("left", "right"):
                choices.append({"key": b64(key), "take": str(choice)})
            elif choice is None:
                choices.append({"key": b64(key), "take": "delete"})
            elif isinstance(choice, bytes):
                choices.append({"key": b64(key), "take": "value", "value": b64(choice)})
        with contextlib.suppress(LedgerError):  # the round gave up waiting
            await self.call("resolved", request=doc["request"], choices=choices)


class Watch:
    """An async iterator of :class:`Change`, one per commit, in commit order."""

    def __init__(self, session: Session, wid: str, queue: asyncio.Queue[dict[str, Any] | None]):
        self.session = session
        self.id = wid
        self.queue = queue
        self.owns_session = False
        self.ended = False
        """The daemon ended this watch (or the session closed): nothing more will come."""

    def __aiter__(self) -> Watch:
        return self

    async def __anext__(self) -> Change:
        ev = await self.queue.get()
        if ev is None or ev.get("event") == "ended":
            self.ended = True
            self.queue.put_nowait(ev)  # every later call ends the same way
            err = ev.get("error") if ev is not None else None
            if err:
                raise LedgerError(err.get("code", "error"), err.get("message", "watch failed"))
            raise StopAsyncIteration
        return Change(
            ev["commit"], [item_of(c) for c in ev["changed"]], [unb64(k) for k in ev["deleted"]]
        )

    async def close(self) -> None:
        if self.owns_session:
            await self.session.close()
        elif not self.ended:
            try:
                await self.session.call("unwatch", watch=self.id)
            except LedgerError as e:
                if e.code != "conflict":  # it ended as we asked: nothing to undo
                    raise


class AsyncTransaction:
    """A transaction held by a session; the daemon rolls it back if the connection drops."""

    def __init__(self, session: Session, tid: str, base: str) -> None:
        self.session = session
        self.id = tid
        self.base = base
        self.commit_id: str | None = None
        """The commit this transaction made (None before, or if it changed nothing)."""
        self.versionstamp: bytes | None = None
        """The ten bytes that completed its versionstamped keys and values (set by the
        commit; None before, or if it stamped nothing)."""
        self.versionstamped_keys: list[bytes] = []
        """The keys given to :meth:`set_versionstamped_key`, completed, in that order
        (set by the commit)."""

    async def get(self, key: bytes) -> bytes | None:
        """The value as this transaction sees it, or None when the key is not set (unlike
        :meth:`AsyncClient.get` and the embedded ``Transaction.get``, which raise a
        not-found error: test ``is None`` here where embedded code calls ``contains``)."""
        doc = await self.session.call("get", txn=self.id, key=b64(key))
        return unb64(doc["value"]) if doc["found"] else None

    async def put(self, key: bytes, value: bytes, *, lazy: bool = False) -> None:
        await self.session.call(
            "put", txn=self.id, key=b64(key), value=b64(value), priority="lazy" if lazy else "eager"
        )

    async def set_versionstamped_key(
        self, template: bytes, value: bytes, *, lazy: bool = False
    ) -> None:
        """Set the key ``template`` becomes when the commit fills in its incomplete
        versionstamp: it is in :attr:`versionstamped_keys` after the commit. The
        transaction cannot read it before."""
        await self.session.call(
            "set_versionstamped_key",
            txn=self.id,
            key=b64(template),
            value=b64(value),
            priority="lazy" if lazy else "eager",
        )

    async def set_versionstamped_value(
        self, key: bytes, template: bytes, *, lazy: bool = False
    ) -> None:
        """Set ``key`` to ``template`` with its incomplete versionstamp filled in at
        commit; reading ``key`` in this transaction is then an error."""
        await self.session.call(
            "set_versionstamped_value",
            txn=self.id,
            key=b64(key),
            value=b64(template),
            priority="lazy" if lazy else "eager",
        )

    async def delete(self, key: bytes) -> None:
        await self.session.call("delete", txn=self.id, key=b64(key))

    async def clear(self) -> None:
        await self.session.call("clear", txn=self.id)

    async def entries(self, prefix: bytes | None = None, limit: int = 1000) -> list[Item]:
        args: dict[str, Any] = {"txn": self.id, "limit": limit}
        if prefix is not None:
            args["prefix"] = b64(prefix)
        doc = await self.session.call("entries", **args)
        return [item_of(d) for d in doc["entries"]]

    async def commit(self) -> str | None:
        doc = await self.session.call("commit", txn=self.id)
        self.commit_id = doc["commit"]
        stamp = doc.get("versionstamp")
        self.versionstamp = bytes.fromhex(stamp) if stamp is not None else None
        self.versionstamped_keys = [unb64(k) for k in doc.get("versionstamped_keys", [])]
        return self.commit_id

    async def rollback(self) -> None:
        await self.session.call("rollback", txn=self.id)


Transaction = AsyncTransaction
"""The name this class had first."""
