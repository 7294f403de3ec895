"""Python clients of the daemon: :class:`AsyncClient` (asyncio) and :class:`Client` (blocking).

This module owns talking to ledgerd over its Unix socket: URLs and encodings,
streaming of values, paging of ranges, error mapping, and WebSocket sessions
(transactions as context managers, watchers as iterators). ``ledgerctl`` is
built on it.

    async with AsyncClient() as c:
        await c.put("notes", "inbox", b"k", b"v")
        async with c.transaction("notes", "inbox") as txn:
            await txn.put(b"a", b"1")

    with Client() as c:
        c.put("notes", "inbox", b"k", b"v")

Structured keys need nothing else: this module re-exports ``tuple`` (FoundationDB's
tuple layer), :class:`Subspace`, :class:`Versionstamp` and ``stamp_time`` from
:mod:`ledgerd.store`, for ``set_versionstamped_key`` and friends.
"""

from __future__ import annotations

import asyncio
import builtins
import contextlib
import io
import itertools
import json
import os
import threading
from collections.abc import (
    AsyncIterable,
    AsyncIterator,
    Callable,
    Coroutine,
    Iterable,
    Iterator,
)
from pathlib import Path
from types import TracebackType
from typing import TYPE_CHECKING, Any, TypeVar

import aiofiles
import aiohttp
from yarl import URL

# The clients' types and errors, for client programs.
from ledgerd.daemon.client_types import CHUNK as CHUNK
from ledgerd.daemon.client_types import DISCONNECTED, item_of, raw, reaching
from ledgerd.daemon.client_types import Answer as Answer
from ledgerd.daemon.client_types import Change as Change
from ledgerd.daemon.client_types import ConflictItem as ConflictItem
from ledgerd.daemon.client_types import DaemonUnavailableError as DaemonUnavailableError
from ledgerd.daemon.client_types import Item as Item
from ledgerd.daemon.client_types import LedgerError as LedgerError
from ledgerd.daemon.client_types import Name as Name
from ledgerd.daemon.client_types import NotFoundError as NotFoundError
from ledgerd.daemon.client_types import Progress as Progress
from ledgerd.daemon.client_types import ResolverCallback as ResolverCallback
from ledgerd.daemon.client_types import ResolveRequest as ResolveRequest
from ledgerd.daemon.client_types import Side as Side
from ledgerd.daemon.client_types import UnsafeSocketError as UnsafeSocketError
from ledgerd.daemon.client_types import quote as quote
from ledgerd.daemon.client_types import socket_path as socket_path
from ledgerd.daemon.client_types import unb64 as unb64
from ledgerd.daemon.codec import b64
from ledgerd.daemon.socketdir import socket_dir_problem

# Re-exported for client programs. ``tuple`` is the tuple layer in this module: write
# ``builtins.tuple`` for the type.
from ledgerd.store import SingleFloat as SingleFloat
from ledgerd.store import Subspace as Subspace
from ledgerd.store import TupleError as TupleError
from ledgerd.store import Versionstamp as Versionstamp
from ledgerd.store import stamp_time as stamp_time
from ledgerd.store import tuple as tuple

if TYPE_CHECKING:
    from ledgerd.daemon.client_docs import AsyncDocuments, Documents

T = TypeVar("T")


def _error(status: int, body: bytes) -> LedgerError:
    try:
        err = json.loads(body)["error"]
        code, message = str(err["code"]), str(err["message"])
    except (ValueError, KeyError, TypeError):
        code, message = f"http_{status}", body.decode(errors="replace")[:500]
    cls = NotFoundError if status == 404 else LedgerError
    return cls(code, message, status)


def _side(d: dict[str, Any] | None) -> Side | None:
    if d is None:
        return None
    v = d.get("value")
    return Side(None if v is None else unb64(v), int(d["size"]), d["priority"])


class AsyncClient:
    def __init__(self, socket: str | Path | None = None, timeout: float | None = None) -> None:
        self.socket = socket_path(socket)
        self._timeout = aiohttp.ClientTimeout(total=timeout, sock_connect=10)
        self._session: aiohttp.ClientSession | None = None

    @property
    def session(self) -> aiohttp.ClientSession:
        if self._session is None:
            if problem := socket_dir_problem(self.socket):
                raise UnsafeSocketError("unsafe_socket", f"refusing to connect: {problem}")
            self._session = aiohttp.ClientSession(
                connector=aiohttp.UnixConnector(path=str(self.socket)), timeout=self._timeout
            )
        return self._session

    async def close(self) -> None:
        if self._session is not None:
            await self._session.close()
            self._session = None

    async def __aenter__(self) -> AsyncClient:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    @staticmethod
    def url(path: str, query: dict[str, str | bytes | int | None] | None = None) -> URL:
        q = ""
        if query:
            parts = []
            for k, v in query.items():
                if v is None:
                    continue
                parts.append(f"{k}={quote(v if isinstance(v, bytes) else str(v))}")
            q = "?" + "&".join(parts) if parts else ""
        return URL("http://ledgerd" + path + q, encoded=True)

    @staticmethod
    def page_path(ledger: Name, page: Name) -> str:
        return f"/v1/ledgers/{quote(ledger)}/pages/{quote(page)}"

    async def request(
        self,
        method: str,
        url: URL,
        *,
        data: Any = None,
        json_body: Any = None,
        headers: dict[str, str] | None = None,
    ) -> aiohttp.ClientResponse:
        session = self.session
        with reaching(self.socket):
            resp = await session.request(method, url, data=data, json=json_body, headers=headers)
            if resp.status >= 400:
                body = await resp.read()
                resp.release()
                raise _error(resp.status, body)
        return resp

    async def _json(self, method: str, url: URL, body: Any = None) -> Any:
        resp = await self.request(method, url, json_body=body)
        with reaching(self.socket):
            async with resp:
                return await resp.json()

    # -- repository ----------------------------------------------------------------

    async def status(self) -> dict[str, Any]:
        return dict(await self._json("GET", self.url("/v1/status")))

    async def ledgers(self) -> list[bytes]:
        doc = await self._json("GET", self.url("/v1/ledgers"))
        return [unb64(x["name"]) for x in doc["ledgers"]]

    async def pages(self, ledger: Name) -> list[bytes]:
        doc = await self._json("GET", self.url(f"/v1/ledgers/{quote(ledger)}/pages"))
        return [unb64(x["id"]) for x in doc["pages"]]

    # -- values --------------------------------------------------------------------

    async def get_stream(
        self,
        ledger: Name,
        page: Name,
        key: bytes,
        *,
        at: str | None = None,
        offset: int | None = None,
        length: int | None = None,
        progress: Progress | None = None,
    ) -> AsyncIterator[bytes]:
        url = self.url(
            self.page_path(ledger, page) + "/keys/" + quote(key),
            {"at": at, "offset": offset, "length": length},
        )
        resp = await self.request("GET", url)
        async with resp:
            done = 0
            chunks = resp.content.iter_chunked(CHUNK)
            while True:
                with reaching(self.socket):
                    try:
                        chunk = await chunks.__anext__()
                    except StopAsyncIteration:
                        break
                done += len(chunk)
                if progress:
                    progress(done, resp.content_length)
                yield chunk

    async def get(self, ledger: Name, page: Name, key: bytes, **kw: Any) -> bytes:
        return b"".join([c async for c in self.get_stream(ledger, page, key, **kw)])

    async def get_to_file(
        self,
        ledger: Name,
        page: Name,
        key: bytes,
        path: Path,
        progress: Progress | None = None,
        at: str | None = None,
    ) -> int:
        n = 0
        tmp = path.with_name(f".{path.name}.part")
        try:
            async with aiofiles.open(tmp, "wb") as f:
                async for chunk in self.get_stream(ledger, page, key, progress=progress, at=at):
                    await f.write(chunk)
                    n += len(chunk)
            os.replace(tmp, path)
        finally:
            tmp.unlink(missing_ok=True)
        return n

    async def put(
        self,
        ledger: Name,
        page: Name,
        key: bytes,
        value: bytes | AsyncIterable[bytes] | Path,
        *,
        lazy: bool = False,
        progress: Progress | None = None,
    ) -> None:
        url = self.url(
            self.page_path(ledger, page) + "/keys/" + quote(key),
            {"priority": "lazy" if lazy else None},
        )
        data: Any = io.BytesIO(value) if isinstance(value, bytes) and len(value) > CHUNK else value
        headers = {"Content-Type": "application/octet-stream"}
        if isinstance(value, Path):
            total = value.stat().st_size
            data = _file_chunks(value, total, progress)
            headers["Content-Length"] = str(total)
        try:
            resp = await self.request("PUT", url, data=data, headers=headers)
        finally:
            if isinstance(value, Path):  # its file closed now, not when collected
                await data.aclose()
        resp.release()

    async def delete(self, ledger: Name, page: Name, key: bytes) -> None:
        (
            await self.request(
                "DELETE", self.url(self.page_path(ledger, page) + "/keys/" + quote(key))
            )
        ).release()

    async def clear(self, ledger: Name, page: Name) -> None:
        (await self.request("POST", self.url(self.page_path(ledger, page) + "/clear"))).release()

    async def delete_page(self, ledger: Name, page: Name) -> None:
        """Delete the page (one commit, synced; listings leave it out). A page that is
        not listed raises :class:`LedgerError` with code ``page_not_found``."""
        (await self.request("DELETE", self.url(self.page_path(ledger, page)))).release()

    async def delete_ledger(self, ledger: Name) -> None:
        """Delete every page of the ledger (``ledger_not_found`` when it has none)."""
        (await self.request("DELETE", self.url(f"/v1/ledgers/{quote(ledger)}"))).release()

    async def batch(
        self,
        ledger: Name,
        page: Name,
        puts: Iterable[builtins.tuple[bytes, bytes] | builtins.tuple[bytes, bytes, str]] = (),
        deletes: Iterable[bytes] = (),
    ) -> int:
        """Many puts and deletes in one commit; returns how many were applied."""
        ops: list[dict[str, str]] = []
        for p in puts:
            op = {"op": "put", "key": b64(p[0]), "value": b64(p[1])}
            if len(p) == 3:
                op["priority"] = p[2]
            ops.append(op)
        ops.extend({"op": "delete", "key": b64(k)} for k in deletes)
        doc = await self._json(
            "POST", self.url(self.page_path(ledger, page) + "/batch"), {"ops": ops}
        )
        return int(doc["applied"])

    async def set_versionstamped_key(
        self, ledger: Name, page: Name, template: bytes, value: bytes, *, lazy: bool = False
    ) -> bytes:
        """Set the key ``template`` becomes once its incomplete versionstamp is filled in
        (``template`` ends in the stamp's 4-byte offset, as ``pack_with_versionstamp``
        makes it); returns that key."""
        op = {"op": "set_versionstamped_key", "key": b64(template), "value": b64(value)}
        return await self._stamped(ledger, page, op, lazy)

    async def set_versionstamped_value(
        self, ledger: Name, page: Name, key: bytes, template: bytes, *, lazy: bool = False
    ) -> bytes:
        """Set ``key`` to ``template`` with its incomplete versionstamp filled in
        (``template`` ends in the stamp's 4-byte offset); returns the value stored."""
        op = {"op": "set_versionstamped_value", "key": b64(key), "value": b64(template)}
        return await self._stamped(ledger, page, op, lazy)

    async def _stamped(self, ledger: Name, page: Name, op: dict[str, str], lazy: bool) -> bytes:
        op["priority"] = "lazy" if lazy else "eager"
        doc = await self._json(
            "POST", self.url(self.page_path(ledger, page) + "/batch"), {"ops": [op]}
        )
        return unb64(doc["versionstamped"][0])

    async def entries(
        self,
        ledger: Name,
        page: Name,
        *,
        start: bytes | None = None,
        end: bytes | None = None,
        prefix: bytes | None = None,
        limit: int | None = None,
        at: str | None = None,
        values: bool = True,
        page_size: int = 1000,
    ) -> AsyncIterator[Item]:
        """Entries in key order, paging through the whole range (or ``limit`` entries)."""
        token: str | None = None
        sent = 0
        while True:
            want = page_size if limit is None else min(page_size, limit - sent)
            if want <= 0:
                return
            doc = await self._json(
                "GET",
                self.url(
                    self.page_path(ledger, page) + "/entries",
                    {
                        "start": start,
                        "end": end,
                        "prefix": prefix,
                        "limit": want,
                        "at": at,
                        "token": token,
                        "values": None if values else 0,
                    },
                ),
            )
            for d in doc["entries"]:
                yield item_of(d)
                sent += 1
            token = doc["next"]
            if token is None:
                return

    async def sync(
        self, ledger: Name | None = None, page: Name | None = None, timeout: float = 60.0
    ) -> dict[str, Any]:
        """Upload, download and merge until quiet; LedgerError if it cannot finish."""
        url = self.url(
            "/v1/sync",
            {
                "ledger": raw(ledger) if ledger is not None else None,
                "page": raw(page) if page is not None else None,
                "timeout": str(timeout),
            },
        )
        return dict(await self._json("POST", url))

    async def policy(self, ledger: Name, page: Name, policy: str | None = None) -> dict[str, Any]:
        """The page's merge policy (and its conflict state); set it when ``policy`` is given."""
        url = self.url(self.page_path(ledger, page) + "/policy")
        if policy is None:
            return dict(await self._json("GET", url))
        return dict(await self._json("PUT", url, {"policy": policy}))

    async def register_resolver(self, ledger: Name, callback: ResolverCallback) -> Session:
        """Resolve the ledger's conflicts with ``callback`` until the returned session closes."""
        s = await self.open_session()
        try:
            await s.register_resolver(ledger, callback)
        except BaseException:
            await s.close()
            raise
        return s

    async def heads(self, ledger: Name, page: Name) -> list[dict[str, Any]]:
        doc = await self._json("GET", self.url(self.page_path(ledger, page) + "/heads"))
        return list(doc["heads"])

    async def history(self, ledger: Name, page: Name, limit: int = 100) -> list[dict[str, Any]]:
        doc = await self._json(
            "GET", self.url(self.page_path(ledger, page) + "/history", {"limit": limit})
        )
        return list(doc["commits"])

    # -- sessions --------------------------------------------------------------------

    async def open_session(self) -> Session:
        session = self.session
        try:
            with reaching(self.socket):
                ws = await session.ws_connect(self.url("/v1/session"), max_msg_size=0)
        except aiohttp.WSServerHandshakeError as e:
            raise LedgerError(f"http_{e.status}", str(e), e.status) from None
        s = Session(ws)
        s._start()
        return s

    def transaction(self, ledger: Name, page: Name) -> _TxnContext:
        """``async with c.transaction(l, p) as txn:`` commits on success, rolls back on error."""
        return _TxnContext(self, ledger, page)

    async def subscribe(self, ledger: Name, page: Name, prefix: bytes = b"") -> Watch:
        """A :class:`Watch` on its own session, registered when this returns; close it."""
        s = await self.open_session()
        try:
            w = await s.subscribe(ledger, page, prefix)
        except BaseException:
            await s.close()
            raise
        w.owns_session = True
        return w

    async def watch(self, ledger: Name, page: Name, prefix: bytes = b"") -> AsyncIterator[Change]:
        """Changes of every later commit under ``prefix``, in order, until the caller stops."""
        w = await self.subscribe(ledger, page, prefix)
        try:
            async for change in w:
                yield change
        finally:
            await w.close()

    def documents(self, ledger: Name, page: Name) -> AsyncDocuments:
        """The page's documents (:mod:`daemon.client_docs`)."""
        from ledgerd.daemon.client_docs import AsyncDocuments

        return AsyncDocuments(self, ledger, page)

    # -- operations (issue 19) -------------------------------------------------------

    async def check(
        self,
        ledger: Name | None = None,
        page: Name | None = None,
        *,
        cloud: bool = False,
        repair: bool = False,
    ) -> dict[str, Any]:
        """Check pages (all, a ledger's, or one); with ``cloud`` against the bucket too;
        with ``repair`` fix what can be. The report: ``healthy``, ``pages``, ...
        (``POST /v1/check``)."""
        body: dict[str, Any] = {"cloud": cloud, "repair": repair}
        if ledger is not None:
            body["ledger"] = b64(raw(ledger))
        if page is not None:
            body["page"] = b64(raw(page))
        return dict(await self._json("POST", self.url("/v1/check"), body))

    async def gc(self, ledger: Name | None = None, page: Name | None = None) -> dict[str, Any]:
        """Prune history past its retention and collect garbage now (every page, a
        ledger's, or one); what it freed (``POST /v1/gc``)."""
        body: dict[str, Any] = {}
        if ledger is not None:
            body["ledger"] = b64(raw(ledger))
        if page is not None:
            body["page"] = b64(raw(page))
        return dict(await self._json("POST", self.url("/v1/gc"), body))

    async def evict(self, ledger: Name, page: Name) -> dict[str, Any]:
        """Delete the local copy of a closed, fully synced (or empty) page; its next use
        restores it (``POST /v1/evict``)."""
        body = {"ledger": b64(raw(ledger)), "page": b64(raw(page))}
        return dict(await self._json("POST", self.url("/v1/evict"), body))

    async def du(self, ledger: Name | None = None, page: Name | None = None) -> dict[str, Any]:
        """What pages hold and what their files take (``GET /v1/du``)."""
        query: dict[str, str | bytes | int | None] = {
            "ledger": None if ledger is None else raw(ledger),
            "page": None if page is None else raw(page),
        }
        return dict(await self._json("GET", self.url("/v1/du", query)))

    async def health(self, sync: bool = False) -> dict[str, Any]:
        """``GET /v1/health``: its body, also when it says 503 (``status`` is then
        ``failing``, or with ``sync`` ``degraded``)."""
        with reaching(self.socket):
            async with self.session.get(self.url("/v1/health", {"sync": int(sync)})) as resp:
                doc = await resp.json()
        if not isinstance(doc, dict) or "status" not in doc:
            raise LedgerError(f"http_{resp.status}", f"unexpected health answer: {doc!r}")
        return doc

    async def metrics(self) -> str:
        """``GET /v1/metrics``: the metrics in Prometheus' text format."""
        resp = await self.request("GET", self.url("/v1/metrics"))
        with reaching(self.socket):
            async with resp:
                return await resp.text()


async def _file_chunks(path: Path, total: int, progress: Progress | None) -> AsyncIterator[bytes]:
    done = 0
    async with aiofiles.open(path, "rb") as f:
        while chunk := await f.read(CHUNK):
            done += len(chunk)
            if progress:
                progress(done, total)
            yield chunk


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
                if not fut.done():
                    fut.set_exception(LedgerError("closed", "the session was closed"))
            for q in self._events.values():
                q.put_nowait(None)

    async def call(self, op: str, **args: Any) -> dict[str, Any]:
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

    async def watch(self, ledger: Name, page: Name, prefix: bytes = b"") -> AsyncIterator[Change]:
        w = await self.subscribe(ledger, page, prefix)
        async for change in w:
            yield change

    async def register_resolver(self, ledger: Name, callback: ResolverCallback) -> None:
        """Answer the ledger's merges with ``callback`` while this session is open."""
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
        except Exception as e:  # tell the daemon at once: the merge changes nothing
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
        with contextlib.suppress(LedgerError):  # the merge gave up waiting
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


class _TxnContext:
    def __init__(self, client: AsyncClient, ledger: Name, page: Name) -> None:
        self.client, self.ledger, self.page = client, ledger, page
        self.session: Session | None = None
        self.txn: AsyncTransaction | None = None
        self.commit_id: str | None = None

    async def __aenter__(self) -> AsyncTransaction:
        self.session = await self.client.open_session()
        self.txn = await self.session.begin(self.ledger, self.page)
        return self.txn

    async def __aexit__(
        self, et: type[BaseException] | None, e: BaseException | None, tb: TracebackType | None
    ) -> None:
        assert self.session is not None and self.txn is not None
        try:
            if et is None:
                self.commit_id = await self.txn.commit()
            else:
                await self.txn.rollback()
        finally:
            await self.session.close()


Transaction = AsyncTransaction
"""The name this class had first."""

BlockingResolver = Callable[[ResolveRequest], Answer]
"""A resolver for blocking code: it runs on a worker thread, not on the client's loop."""


async def _anext(ait: AsyncIterator[T]) -> T:
    return await ait.__anext__()


async def _pull(chunks: Iterable[bytes]) -> AsyncIterator[bytes]:
    """A blocking iterable of chunks as an async one (each ``next`` on a worker thread)."""
    it = iter(chunks)
    while (chunk := await asyncio.to_thread(next, it, None)) is not None:
        yield chunk


class _Bridge:
    """The one way the blocking classes run the async ones: a private event loop on a
    background thread; :meth:`call` runs one coroutine there and returns its result (or
    raises its exception) in the calling thread, :meth:`iterate` does the same per item."""

    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        self._thread = threading.Thread(
            target=self.loop.run_forever, name="ledgerd-client", daemon=True
        )
        self._thread.start()

    def call(self, coro: Coroutine[Any, Any, T]) -> T:
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result()

    def iterate(self, ait: AsyncIterator[T]) -> Iterator[T]:
        """Items of ``ait``; closing the blocking iterator (or leaving a for loop early
        and dropping it) closes the async one on the loop."""
        try:
            while True:
                try:
                    yield self.call(_anext(ait))
                except StopAsyncIteration:
                    return
        finally:
            aclose = getattr(ait, "aclose", None)
            if aclose is not None and self.loop.is_running():
                self.call(aclose())

    def stop(self) -> None:
        if self.loop.is_running():
            self.loop.call_soon_threadsafe(self.loop.stop)
            self._thread.join()
            self.loop.close()


class Client:
    """A blocking client: :class:`AsyncClient` through :class:`_Bridge`, method for method
    (``tests/daemon/test_client.py`` checks that every public method has its counterpart
    with the same parameters)."""

    def __init__(self, socket: str | Path | None = None, timeout: float | None = None) -> None:
        self._bridge = _Bridge()
        self.aio = AsyncClient(socket, timeout)
        self._call = self._bridge.call

    url = staticmethod(AsyncClient.url)
    page_path = staticmethod(AsyncClient.page_path)

    def close(self) -> None:
        if self._bridge.loop.is_running():
            self._call(self.aio.close())
            self._bridge.stop()

    def __enter__(self) -> Client:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- repository ----------------------------------------------------------------

    def status(self) -> dict[str, Any]:
        return self._call(self.aio.status())

    def ledgers(self) -> list[bytes]:
        return self._call(self.aio.ledgers())

    def pages(self, ledger: Name) -> list[bytes]:
        return self._call(self.aio.pages(ledger))

    # -- values --------------------------------------------------------------------

    def get_stream(
        self,
        ledger: Name,
        page: Name,
        key: bytes,
        *,
        at: str | None = None,
        offset: int | None = None,
        length: int | None = None,
        progress: Progress | None = None,
    ) -> Iterator[bytes]:
        return self._bridge.iterate(
            self.aio.get_stream(
                ledger, page, key, at=at, offset=offset, length=length, progress=progress
            )
        )

    def get(self, ledger: Name, page: Name, key: bytes, **kw: Any) -> bytes:
        return self._call(self.aio.get(ledger, page, key, **kw))

    def get_to_file(
        self,
        ledger: Name,
        page: Name,
        key: bytes,
        path: Path,
        progress: Progress | None = None,
        at: str | None = None,
    ) -> int:
        return self._call(self.aio.get_to_file(ledger, page, key, path, progress, at))

    def put(
        self,
        ledger: Name,
        page: Name,
        key: bytes,
        value: bytes | Iterable[bytes] | Path,
        *,
        lazy: bool = False,
        progress: Progress | None = None,
    ) -> None:
        """Like :meth:`AsyncClient.put`; an iterable of chunks is streamed."""
        data = value if isinstance(value, bytes | Path) else _pull(value)
        self._call(self.aio.put(ledger, page, key, data, lazy=lazy, progress=progress))

    def delete(self, ledger: Name, page: Name, key: bytes) -> None:
        self._call(self.aio.delete(ledger, page, key))

    def clear(self, ledger: Name, page: Name) -> None:
        self._call(self.aio.clear(ledger, page))

    def delete_page(self, ledger: Name, page: Name) -> None:
        self._call(self.aio.delete_page(ledger, page))

    def delete_ledger(self, ledger: Name) -> None:
        self._call(self.aio.delete_ledger(ledger))

    def batch(
        self,
        ledger: Name,
        page: Name,
        puts: Iterable[builtins.tuple[bytes, bytes] | builtins.tuple[bytes, bytes, str]] = (),
        deletes: Iterable[bytes] = (),
    ) -> int:
        return self._call(self.aio.batch(ledger, page, list(puts), list(deletes)))

    def set_versionstamped_key(
        self, ledger: Name, page: Name, template: bytes, value: bytes, *, lazy: bool = False
    ) -> bytes:
        return self._call(self.aio.set_versionstamped_key(ledger, page, template, value, lazy=lazy))

    def set_versionstamped_value(
        self, ledger: Name, page: Name, key: bytes, template: bytes, *, lazy: bool = False
    ) -> bytes:
        return self._call(self.aio.set_versionstamped_value(ledger, page, key, template, lazy=lazy))

    def entries(
        self,
        ledger: Name,
        page: Name,
        *,
        start: bytes | None = None,
        end: bytes | None = None,
        prefix: bytes | None = None,
        limit: int | None = None,
        at: str | None = None,
        values: bool = True,
        page_size: int = 1000,
    ) -> Iterator[Item]:
        return self._bridge.iterate(
            self.aio.entries(
                ledger,
                page,
                start=start,
                end=end,
                prefix=prefix,
                limit=limit,
                at=at,
                values=values,
                page_size=page_size,
            )
        )

    def sync(
        self, ledger: Name | None = None, page: Name | None = None, timeout: float = 60.0
    ) -> dict[str, Any]:
        return self._call(self.aio.sync(ledger, page, timeout))

    def policy(self, ledger: Name, page: Name, policy: str | None = None) -> dict[str, Any]:
        return self._call(self.aio.policy(ledger, page, policy))

    def register_resolver(self, ledger: Name, callback: BlockingResolver) -> BlockingSession:
        """Resolve the ledger's conflicts with ``callback`` (run on a worker thread) until
        the returned session closes."""
        return BlockingSession(
            self._bridge, self._call(self.aio.register_resolver(ledger, _on_thread(callback)))
        )

    def heads(self, ledger: Name, page: Name) -> list[dict[str, Any]]:
        return self._call(self.aio.heads(ledger, page))

    def history(self, ledger: Name, page: Name, limit: int = 100) -> list[dict[str, Any]]:
        return self._call(self.aio.history(ledger, page, limit))

    # -- sessions --------------------------------------------------------------------

    def open_session(self) -> BlockingSession:
        return BlockingSession(self._bridge, self._call(self.aio.open_session()))

    def transaction(self, ledger: Name, page: Name) -> BlockingTransaction:
        """``with client.transaction(l, p) as txn:`` commits on a clean exit, rolls back
        on an exception; ``txn.commit_id`` is the commit made."""
        return BlockingTransaction(self._bridge, _TxnContext(self.aio, ledger, page))

    def subscribe(self, ledger: Name, page: Name, prefix: bytes = b"") -> BlockingWatch:
        return BlockingWatch(self._bridge, self._call(self.aio.subscribe(ledger, page, prefix)))

    def watch(self, ledger: Name, page: Name, prefix: bytes = b"") -> Iterator[Change]:
        return self._bridge.iterate(self.aio.watch(ledger, page, prefix))

    def documents(self, ledger: Name, page: Name) -> Documents:
        """The page's documents (:mod:`daemon.client_docs`), blocking."""
        from ledgerd.daemon.client_docs import Documents

        return Documents(self._bridge, self.aio.documents(ledger, page))

    # -- operations (issue 19) -------------------------------------------------------

    def check(
        self,
        ledger: Name | None = None,
        page: Name | None = None,
        *,
        cloud: bool = False,
        repair: bool = False,
    ) -> dict[str, Any]:
        return self._call(self.aio.check(ledger, page, cloud=cloud, repair=repair))

    def health(self, sync: bool = False) -> dict[str, Any]:
        return self._call(self.aio.health(sync))

    def gc(self, ledger: Name | None = None, page: Name | None = None) -> dict[str, Any]:
        return self._call(self.aio.gc(ledger, page))

    def du(self, ledger: Name | None = None, page: Name | None = None) -> dict[str, Any]:
        return self._call(self.aio.du(ledger, page))

    def evict(self, ledger: Name, page: Name) -> dict[str, Any]:
        return self._call(self.aio.evict(ledger, page))

    def metrics(self) -> str:
        return self._call(self.aio.metrics())


def _on_thread(callback: BlockingResolver) -> ResolverCallback:
    async def resolve(request: ResolveRequest) -> Answer:
        return await asyncio.to_thread(callback, request)

    return resolve


class BlockingSession:
    """A :class:`Session` for blocking code (from :meth:`Client.open_session`)."""

    def __init__(self, bridge: _Bridge, session: Session) -> None:
        self._bridge = bridge
        self.aio = session
        self._call = bridge.call

    def __enter__(self) -> BlockingSession:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def call(self, op: str, **args: Any) -> dict[str, Any]:
        return self._call(self.aio.call(op, **args))

    def close(self) -> None:
        self._call(self.aio.close())

    def begin(self, ledger: Name, page: Name) -> BlockingTransaction:
        """A transaction on this session: end it with ``commit`` or ``rollback``."""
        return BlockingTransaction(self._bridge, self._call(self.aio.begin(ledger, page)))

    def subscribe(self, ledger: Name, page: Name, prefix: bytes = b"") -> BlockingWatch:
        return BlockingWatch(self._bridge, self._call(self.aio.subscribe(ledger, page, prefix)))

    def watch(self, ledger: Name, page: Name, prefix: bytes = b"") -> Iterator[Change]:
        return self._bridge.iterate(self.aio.watch(ledger, page, prefix))

    def register_resolver(self, ledger: Name, callback: BlockingResolver) -> None:
        self._call(self.aio.register_resolver(ledger, _on_thread(callback)))


class BlockingWatch:
    """A :class:`Watch` for blocking code: an iterator of :class:`Change`; close it."""

    def __init__(self, bridge: _Bridge, watch: Watch) -> None:
        self._call = bridge.call
        self.aio = watch

    def __iter__(self) -> BlockingWatch:
        return self

    def __next__(self) -> Change:
        try:
            return self._call(self.aio.__anext__())
        except StopAsyncIteration:
            raise StopIteration from None

    def __enter__(self) -> BlockingWatch:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        self._call(self.aio.close())


class BlockingTransaction:
    """An :class:`AsyncTransaction` for blocking code. From :meth:`Client.transaction` it
    is a context manager that opens its own session (commit on a clean exit, rollback
    on an exception); from :meth:`BlockingSession.begin` it is already open."""

    def __init__(self, bridge: _Bridge, txn: AsyncTransaction | _TxnContext) -> None:
        self._call = bridge.call
        self._ctx = txn if isinstance(txn, _TxnContext) else None
        self._txn = txn if isinstance(txn, AsyncTransaction) else None

    def __enter__(self) -> BlockingTransaction:
        if self._ctx is not None:
            self._txn = self._call(self._ctx.__aenter__())
        return self

    def __exit__(
        self, et: type[BaseException] | None, e: BaseException | None, tb: TracebackType | None
    ) -> None:
        if self._ctx is not None:
            self._call(self._ctx.__aexit__(et, e, tb))
        elif et is None:
            self.commit()
        else:
            self.rollback()

    @property
    def aio(self) -> AsyncTransaction:
        if self._txn is None:
            raise LedgerError("closed", "the transaction is not open: use it in a with block")
        return self._txn

    @property
    def id(self) -> str:
        return self.aio.id

    @property
    def base(self) -> str:
        return self.aio.base

    @property
    def commit_id(self) -> str | None:
        return self._txn.commit_id if self._txn is not None else None

    @property
    def versionstamp(self) -> bytes | None:
        return self._txn.versionstamp if self._txn is not None else None

    @property
    def versionstamped_keys(self) -> list[bytes]:
        return self._txn.versionstamped_keys if self._txn is not None else []

    def get(self, key: bytes) -> bytes | None:
        return self._call(self.aio.get(key))

    def put(self, key: bytes, value: bytes, *, lazy: bool = False) -> None:
        self._call(self.aio.put(key, value, lazy=lazy))

    def set_versionstamped_key(self, template: bytes, value: bytes, *, lazy: bool = False) -> None:
        self._call(self.aio.set_versionstamped_key(template, value, lazy=lazy))

    def set_versionstamped_value(self, key: bytes, template: bytes, *, lazy: bool = False) -> None:
        self._call(self.aio.set_versionstamped_value(key, template, lazy=lazy))

    def delete(self, key: bytes) -> None:
        self._call(self.aio.delete(key))

    def clear(self) -> None:
        self._call(self.aio.clear())

    def entries(self, prefix: bytes | None = None, limit: int = 1000) -> list[Item]:
        return self._call(self.aio.entries(prefix, limit))

    def commit(self) -> str | None:
        return self._call(self.aio.commit())

    def rollback(self) -> None:
        self._call(self.aio.rollback())
