"""WebSocket sessions: what lives as long as a client connection.

This module owns ``GET /v1/session``: transactions (rolled back when the
connection closes), watchers (changes pushed in commit order) and conflict-
resolver registrations (kept per ledger for the pages' conflicts).

Protocol: JSON text frames. A request is ``{"id": ID, "op": OP, ...}``; its reply
is ``{"id": ID, "ok": true, ...}`` or ``{"id": ID, "ok": false, "error": {"code",
"message"}}``. Requests of one connection are served in order. Watch events are
``{"event": "change", "watch": W, "commit": HEX, "changed": [...], "deleted":
[...]}``; a watcher that ends by itself (its page closed, or it failed) sends
``{"event": "ended", "watch": W}``, with ``"error"`` if it failed. Bytes are base64
as in the HTTP API.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import itertools
import json
import logging
import math
import re
from collections.abc import Awaitable, Callable
from typing import Any

from aiohttp import WSMsgType, web

from ledgerd.daemon import errors as ae
from ledgerd.daemon import session_ops as ops
from ledgerd.daemon.api import Api
from ledgerd.daemon.codec import (
    parse_json,
    unb64,
)
from ledgerd.daemon.leases import page_leases
from ledgerd.daemon.session_resolve import ResolveRounds, ResolverSession
from ledgerd.daemon.session_resolve import Resolvers as Resolvers  # (server's, from here)
from ledgerd.store import StoreError, Transaction, Watcher
from ledgerd.store.tree.merge import Choice, MergeRequest

log = logging.getLogger(__name__)

_QUEUED_TXN = re.compile(r'"txn"\s*:\s*"([^"\\]{1,64})"')
"""The transaction a queued request names, read from its text without parsing it
(transaction ids are short and plain; a miss only leaves its transaction's idle clock
running as before)."""


def _queued_txn(data: str) -> str | None:
    m = _QUEUED_TXN.search(data)
    return m.group(1) if m else None


_Queue = asyncio.Queue[tuple[str, str | None] | None]
"""A session's queued requests: each with the transaction it names (read once)."""


class Sessions:
    def __init__(self, api: Api, resolvers: Resolvers) -> None:
        self.api = api
        self.live: set[Session] = set()
        self.resolvers = resolvers
        self._ids = itertools.count(1)

    async def handle(self, request: web.Request) -> web.StreamResponse:
        cfg = self.api.cfg
        # A ping every session_heartbeat seconds; a client that answers none within
        # half of it is gone, and its session ends (transactions rolled back).
        # Pings are answered by Session.run (autoping off), with a bounded wait, so that
        # a client that sends and never reads cannot hold the reader for good.
        ws = web.WebSocketResponse(
            heartbeat=cfg.session_heartbeat, max_msg_size=cfg.max_batch_bytes, autoping=False
        )
        await ws.prepare(request)
        s = Session(self, ws, next(self._ids), request.transport)
        self.live.add(s)
        try:
            await s.run()
        finally:
            self.live.discard(s)
            await s.close()
            # A connection closed with data its client never read stays open until the
            # client reads it (asyncio's close waits to flush): the session is over, so
            # nothing more it has to say matters.
            if s.transport is not None and s.transport.get_write_buffer_size():
                s.transport.abort()
        return ws

    async def close_all(self) -> None:
        for s in list(self.live):
            await s.ws.close(code=1001, message=b"ledgerd is shutting down")


class Session(ResolverSession):
    def __init__(
        self,
        sessions: Sessions,
        ws: web.WebSocketResponse,
        number: int,
        transport: asyncio.Transport | None = None,
    ) -> None:
        self.sessions = sessions
        self.api = sessions.api
        self.ws = ws
        self.number = number
        self.txns: dict[str, Transaction] = {}
        self._txn_used: dict[str, float] = {}
        """When each open transaction was last used (loop time): see :meth:`_expire`."""
        self._txn_busy: str | None = None
        """The transaction a request is being served on (never rolled back for idleness)."""
        self._txn_queued: dict[str, int] = {}
        """Requests waiting in the queue, by the transaction they name: one waiting
        behind a slow request (a commit waiting for a resolver) is a use, not idleness."""
        self._expired: dict[str, str] = {}
        """Why transactions :meth:`_expire` rolled back (the latest few): for a later use."""
        self._pages: dict[str, tuple[bytes, bytes]] = {}
        """The page (ledger, page id) of each open transaction and watcher: see
        :meth:`_ended`."""
        self.watchers: dict[str, tuple[Watcher, asyncio.Task[None]]] = {}
        self._send_lock = asyncio.Lock()
        self._ids = itertools.count(1)
        self.resolving = ResolveRounds(self.api, self.send, self._ids)
        """The conflicts put to this session, as a resolver, waiting for its answers."""
        self.transport = transport
        """The connection, aborted when its client takes nothing for ``request_timeout``
        seconds (:meth:`_bounded`); None: sends wait without bound."""
        self.queued_bytes = 0
        """The size of the requests waiting in the queue (``max_session_queue_bytes``)."""
        self.ops: dict[str, Callable[[dict[str, Any]], Awaitable[dict[str, Any]]]] = {
            "ping": self.op_ping,
            "begin": self.op_begin,
            "get": self.op_get,
            "put": self.op_put,
            "set_versionstamped_key": self.op_set_versionstamped_key,
            "set_versionstamped_value": self.op_set_versionstamped_value,
            "delete": self.op_delete,
            "clear": self.op_clear,
            "entries": self.op_entries,
            "commit": self.op_commit,
            "rollback": self.op_rollback,
            "watch": self.op_watch,
            "unwatch": self.op_unwatch,
            "register_resolver": self.op_register_resolver,
            "resolved": self.op_resolved,
        }

    async def send(self, doc: dict[str, Any]) -> None:
        text = json.dumps(doc)
        await self._bounded(lambda: self.ws.send_str(text))

    async def _bounded(self, sending: Callable[[], Awaitable[None]]) -> None:
        """Send under the lock, bounded as a streamed HTTP response is
        (:meth:`Api.bounded`), so that a client that stops reading holds no reader,
        transaction or page. (The write starts under the lock: made before it, one
        that never ran would be left unawaited.)"""
        async with self._send_lock:
            if self.transport is None:
                await sending()
            else:
                await self.api.bounded(self.transport, sending())

    async def run(self) -> None:
        """Read frames; serve requests in order on a worker, a resolver's answers at once.

        A ``resolved`` answer never waits behind the session's other requests, so a
        client that resolves conflicts and also commits on the same connection
        cannot deadlock against itself.
        """
        queue: _Queue = asyncio.Queue()
        worker = asyncio.create_task(self._serve(queue), name=f"session-{self.number}")
        expiry = None
        if self.api.cfg.session_txn_idle_timeout > 0:
            expiry = asyncio.create_task(self._expire(), name=f"session-{self.number}-expiry")
        try:
            async for msg in self.ws:
                if msg.type == WSMsgType.BINARY:
                    err = ae.BadRequest("send JSON text frames").body()["error"]
                    await self.send({"ok": False, "error": err})
                    continue
                if msg.type == WSMsgType.PING:
                    await self._bounded(functools.partial(self.ws.pong, msg.data))
                    continue
                if msg.type != WSMsgType.TEXT:
                    continue
                if '"resolved"' in msg.data:
                    await self._handle(msg.data, only_resolved=True, queue=queue)
                else:
                    await self._enqueue(msg.data, queue)
        finally:
            queue.put_nowait(None)
            worker.cancel()
            if expiry is not None:
                expiry.cancel()
            await asyncio.gather(worker, *([expiry] if expiry else []), return_exceptions=True)

    async def _expire(self) -> None:
        """Roll back the transactions that went ``session_txn_idle_timeout`` seconds
        without a request on them: an open transaction holds its page open (counted in
        ``max_open_pages``, never closed as idle), its values in memory and its base's
        history, for as long as its client keeps it; a client that begins and never
        ends would hold them for the connection's life. The client is told with a
        ``rolled_back`` event; a later request on the transaction gets ``conflict``."""
        timeout = self.api.cfg.session_txn_idle_timeout
        loop = asyncio.get_running_loop()
        while True:
            wait = timeout
            for tid in list(self._txn_used):
                if tid not in self.txns:  # committed or rolled back meanwhile
                    self._txn_used.pop(tid, None)
                    continue
                if tid == self._txn_busy or tid in self._txn_queued:
                    continue
                # Read now, not before the loop: a rollback below awaits, and a
                # request on this transaction may have been served meanwhile.
                if (used := self._txn_used.get(tid)) is None:
                    continue
                left = used + timeout - loop.time()
                if left > 0:
                    wait = min(wait, left)
                    continue
                txn = self.txns.pop(tid)
                self._txn_used.pop(tid, None)
                why = (
                    f"transaction {tid} was rolled back: no request on it for "
                    f"{timeout:g}s (session_txn_idle_timeout)"
                )
                self._expired[tid] = why
                while len(self._expired) > self.api.cfg.max_session_transactions:
                    del self._expired[next(iter(self._expired))]
                log.info("session %d: %s", self.number, why)
                try:
                    await txn.rollback()
                    await self._ended(tid, changed=False)
                except Exception as e:  # rolled back as far as it goes: the page's to mend
                    log.warning("session %d: rolling back %s: %s", self.number, tid, e)
                with contextlib.suppress(Exception):
                    err = ae.Conflict(why).body()
                    await self.send({"event": "rolled_back", "txn": tid, **err})
            await asyncio.sleep(wait)

    async def _enqueue(self, data: str, queue: _Queue) -> None:
        """Queue a request for the worker, or refuse it at once when ``max_session_queue``
        requests are already waiting. (Refusing, not waiting: the reader must stay free
        to take ``resolved`` answers, which a request in the queue may be waiting for.)"""
        cfg = self.api.cfg
        if queue.qsize() >= cfg.max_session_queue:
            why = f"{cfg.max_session_queue} requests (max_session_queue)"
        elif queue.qsize() and self.queued_bytes + len(data) > cfg.max_session_queue_bytes:
            why = f"{self.queued_bytes} bytes of requests (max_session_queue_bytes)"
        else:
            self.queued_bytes += len(data)
            if (tid := _queued_txn(data)) is not None:
                self._txn_queued[tid] = self._txn_queued.get(tid, 0) + 1
            queue.put_nowait((data, tid))
            return
        rid: Any = None
        with contextlib.suppress(ae.ApiError):
            req = parse_json(data, "message")
            rid = _request_id(req) if isinstance(req, dict) else None
        err = ae.Busy(f"{why} of this session are waiting: wait for their replies")
        await self.send({"id": rid, "ok": False, **err.body()})

    async def _serve(self, queue: _Queue) -> None:
        while (item := await queue.get()) is not None:
            data, tid = item
            self.queued_bytes -= len(data)
            # No await before _handle marks it busy (or used, once served).
            if tid is not None and (n := self._txn_queued.pop(tid, 1) - 1) > 0:
                self._txn_queued[tid] = n
            await self._handle(data)

    async def _handle(
        self,
        data: str,
        only_resolved: bool = False,
        queue: _Queue | None = None,
    ) -> None:
        rid: Any = None
        try:
            req = parse_json(data, "message")
            if not isinstance(req, dict):
                raise ae.BadRequest("a message must be a JSON object")
            if only_resolved and req.get("op") != "resolved":
                assert queue is not None
                await self._enqueue(data, queue)  # just mentioned the word: an ordinary request
                return
            rid = _request_id(req)
            op = self.ops.get(str(req.get("op")))
            if op is None:
                raise ae.BadRequest(f"unknown op {req.get('op')!r}")
            tid = req.get("txn")
            with page_leases():  # the op's pages, not the session's whole life
                if isinstance(tid, str) and tid in self.txns:
                    self._txn_busy = tid
                try:
                    result = await op(req)
                finally:
                    self._txn_busy = None
                    if isinstance(tid, str) and tid in self.txns:
                        self._txn_used[tid] = asyncio.get_running_loop().time()
                    elif isinstance(tid, str):
                        self._txn_used.pop(tid, None)  # it ended
            await self.send({"id": rid, "ok": True, **result})
        except ae.ApiError as e:
            await self.send({"id": rid, "ok": False, **e.body()})
        except StoreError as e:
            await self.send({"id": rid, "ok": False, **ae.from_store(e).body()})
        except (ConnectionResetError, asyncio.CancelledError):
            raise
        except Exception as e:
            if (known := ae.from_exception(e)) is not None:
                log.error("session %d: %s", self.number, known)
                await self.send({"id": rid, "ok": False, **known.body()})
                return
            log.exception("session %d: internal error", self.number)
            await self.send(
                {
                    "id": rid,
                    "ok": False,
                    **ae.ApiError(f"internal error: {type(e).__name__}").body(),
                }
            )

    async def close(self) -> None:
        """The connection ended: roll back its transactions, end its watchers."""
        for tid, txn in list(self.txns.items()):
            with contextlib.suppress(Exception):
                await txn.rollback()
                await self._ended(tid, changed=False)
            log.debug("session %d: rolled back transaction %s on disconnect", self.number, tid)
        self.txns.clear()
        for wid, (w, task) in list(self.watchers.items()):
            w.close()
            task.cancel()
            await self._ended(wid, changed=False)
        self.watchers.clear()
        self.sessions.resolvers.remove(self)
        self.resolving.disconnected()

    # -- helpers -----------------------------------------------------------------

    def _names(self, req: dict[str, Any]) -> tuple[bytes, bytes]:
        ledger = self.api.name_bytes(unb64(req.get("ledger"), "ledger"), "ledger name")
        page_id = self.api.name_bytes(unb64(req.get("page"), "page"), "page id")
        return ledger, page_id

    async def _ended(self, tid: str, changed: bool) -> None:
        """Transaction or watcher ``tid`` ended: if it changed nothing (rolled back,
        committed no change, or watched) and its page holds nothing ever written (a
        begin or watch made it, in this session or another) and nobody else uses it,
        the page goes again, as a failed first write's does, so that it is not listed.
        (Whoever ends last removes it: the one that made it may not be.) One that
        changed it drops its unwritten mark, if it has one (the page holds a commit)."""
        names = self._pages.pop(tid, None)
        if names is not None and not changed:
            await self.api.discard_unwritten(*names)
        elif names is not None:
            await self.api.repo.written(*names)

    def _txn(self, req: dict[str, Any]) -> Transaction:
        txn = self.txns.get(str(req.get("txn")))
        if txn is None:
            why = self._expired.get(str(req.get("txn")))
            raise ae.Conflict(why or f"no open transaction {req.get('txn')!r} in this session")
        return txn

    # -- ops ---------------------------------------------------------------------

    async def op_ping(self, req: dict[str, Any]) -> dict[str, Any]:
        return {"pong": True}

    async def op_begin(self, req: dict[str, Any]) -> dict[str, Any]:
        limit = self.api.cfg.max_session_transactions
        if len(self.txns) >= limit:
            raise ae.Busy(
                f"{limit} transactions of this session are open (max_session_transactions):"
                " commit or roll back one first"
            )
        names = self._names(req)
        # A page this makes is marked unwritten until the transaction commits a change
        # (see _ended).
        page, _ = await self.api.new_page(*names)
        txn = await page.transaction().start()
        tid = f"t{next(self._ids)}"
        self.txns[tid] = txn
        self._txn_used[tid] = asyncio.get_running_loop().time()
        self._pages[tid] = names
        return {"txn": tid, "base": txn.base.id.hex()}

    async def op_get(self, req: dict[str, Any]) -> dict[str, Any]:
        return await ops.get(self._txn(req), req, self.api.cfg.max_batch_bytes)

    async def op_put(self, req: dict[str, Any]) -> dict[str, Any]:
        return await ops.put(self._txn(req), req)

    async def op_set_versionstamped_key(self, req: dict[str, Any]) -> dict[str, Any]:
        return await ops.set_versionstamped_key(self._txn(req), req)

    async def op_set_versionstamped_value(self, req: dict[str, Any]) -> dict[str, Any]:
        return await ops.set_versionstamped_value(self._txn(req), req)

    async def op_delete(self, req: dict[str, Any]) -> dict[str, Any]:
        await self._txn(req).delete(unb64(req.get("key"), "key"))
        return {}

    async def op_clear(self, req: dict[str, Any]) -> dict[str, Any]:
        await self._txn(req).clear()
        return {}

    async def op_entries(self, req: dict[str, Any]) -> dict[str, Any]:
        return await ops.entries(self._txn(req), req, self.api.cfg.max_listing_bytes)

    async def op_commit(self, req: dict[str, Any]) -> dict[str, Any]:
        txn = self._txn(req)
        tid = str(req.get("txn"))
        del self.txns[tid]
        try:
            cid = await txn.commit()
        finally:
            await self._ended(tid, changed=txn.commit_id is not None)
        return ops.committed(txn, cid)

    async def op_rollback(self, req: dict[str, Any]) -> dict[str, Any]:
        txn = self._txn(req)
        tid = str(req.get("txn"))
        del self.txns[tid]
        await txn.rollback()
        await self._ended(tid, changed=False)
        return {}

    async def op_watch(self, req: dict[str, Any]) -> dict[str, Any]:
        limit = self.api.cfg.max_session_watchers
        if len(self.watchers) >= limit:
            raise ae.Busy(
                f"{limit} watchers of this session are open (max_session_watchers):"
                " unwatch one first"
            )
        prefix = ops.opt_bytes(req, "prefix") or b""  # a bad one makes no page
        # A page this makes is marked unwritten, as a begin's is: a kill, which ends the
        # watcher with nothing written, leaves it unlisted after the restart.
        page, _ = await self.api.new_page(*self._names(req))
        watcher = page.watch(prefix)
        wid = f"w{next(self._ids)}"
        task = asyncio.create_task(self._forward(wid, watcher), name=f"watch-{wid}")
        self.watchers[wid] = (watcher, task)
        self._pages[wid] = (page.ledger, page.id)
        return {"watch": wid}

    async def _forward(self, wid: str, watcher: Watcher) -> None:
        """Send the watcher's notifications; when it ends by itself (its page closed,
        or sending failed), release it and tell the client with an ``ended`` event."""
        ended: dict[str, Any] = {"event": "ended", "watch": wid}
        try:
            async for note in watcher:
                await self.send(ops.change_event(wid, note))
        except (ConnectionResetError, asyncio.CancelledError):
            return  # the session ended or unwatched: nobody to tell
        except Exception as e:
            log.exception("session %d: watcher %s failed", self.number, wid)
            ended.update(ae.ApiError(f"the watcher failed: {type(e).__name__}").body())
        else:
            if watcher.ended_reason is not None:  # it fell too far behind
                ended.update(ae.WatcherBehind(watcher.ended_reason).body())
        finally:
            watcher.close()  # a watcher keeps its page open
            if self.watchers.get(wid, (None,))[0] is watcher:
                del self.watchers[wid]
                # Ended by itself: its page closed, or commits came (so it stays).
                self._pages.pop(wid, None)
        with contextlib.suppress(Exception):
            await self.send(ended)

    async def op_unwatch(self, req: dict[str, Any]) -> dict[str, Any]:
        got = self.watchers.pop(str(req.get("watch")), None)
        if got is None:
            raise ae.Conflict(f"no watcher {req.get('watch')!r} in this session")
        got[0].close()
        got[1].cancel()
        await self._ended(str(req.get("watch")), changed=False)
        return {}

    async def ask(self, req: MergeRequest) -> dict[bytes, Choice]:
        """This session as the resolver of a page's conflicts (:class:`ResolveRounds`)."""
        return await self.resolving.ask(req)

    async def op_resolved(self, req: dict[str, Any]) -> dict[str, Any]:
        self.resolving.resolved(req)
        return {}

    async def op_register_resolver(self, req: dict[str, Any]) -> dict[str, Any]:
        ledger = self.api.name_bytes(unb64(req.get("ledger"), "ledger"), "ledger name")
        self.sessions.resolvers.add(ledger, self)
        return {"resolver": True}


def _request_id(req: dict[str, Any]) -> Any:
    """A request's ``id``, echoed in its reply. A number past the largest double
    (``1e400``) parses as infinity, which a reply could only echo as ``Infinity``, not
    JSON: refused (the reply's id is then null)."""
    rid = req.get("id")
    if isinstance(rid, float) and not math.isfinite(rid):
        raise ae.BadRequest(
            "id: a number past the largest double; use a string or a smaller number"
        )
    return rid
