"""The asyncio client: :class:`AsyncClient`.

This module owns the calls of the HTTP API: values streamed both ways (from and to
files too), ranges paged through, and the repository, sync, policy and operations
calls. The connection, URLs and the daemon's errors are
:mod:`ledgerd.daemon.client_http`'s. Sessions, watches and transactions are
:mod:`ledgerd.daemon.client_session`'s: this module opens their connections, and
:class:`TxnContext` is ``async with client.transaction(...)``, a transaction on a session
of its own. The blocking client is this one through a bridge
(:mod:`ledgerd.daemon.client_blocking`); what a value may be is
:mod:`ledgerd.daemon.client_body`'s.
"""

from __future__ import annotations

import os
from collections.abc import AsyncGenerator, Awaitable, Coroutine, Iterable
from pathlib import Path
from types import TracebackType
from typing import Any

import aiofiles
import aiohttp

from ledgerd.daemon.client_body import Content, sending
from ledgerd.daemon.client_conflicts import (
    PageConflicts,
    Resolved,
    TakeName,
    page_conflicts,
    resolve_body,
    resolved,
)
from ledgerd.daemon.client_docs import AsyncDocuments
from ledgerd.daemon.client_http import HttpClient
from ledgerd.daemon.client_session import AsyncTransaction, Session, Watch
from ledgerd.daemon.client_types import (
    CHUNK,
    Change,
    DaemonUnavailableError,
    Item,
    LedgerError,
    Name,
    Progress,
    ResolverCallback,
    b64,
    item_of,
    paged,
    quote,
    raw,
    reaching,
    unb64,
)


class AsyncClient(HttpClient):
    """A client of one daemon: an aiohttp session over its Unix socket, opened at first
    use; close it, or use the client in ``async with``."""

    async def __aenter__(self) -> AsyncClient:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    # -- repository ----------------------------------------------------------------

    async def status(
        self, pages_limit: int | None = None, pages_after: str | None = None
    ) -> dict[str, Any]:
        """The daemon's state; its ``pages`` at most ``pages_limit``, after the token
        ``pages_after`` (a ``pages_next`` of an earlier status)."""
        query: dict[str, str | bytes | int | None] = {
            "pages_limit": pages_limit,
            "pages_after": pages_after,
        }
        return dict(await self._json("GET", self.url("/v1/status", query)))

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
    ) -> AsyncGenerator[bytes, None]:
        """The value's bytes as they come. A body the daemon cuts short (it stops a
        response it cannot finish: a damaged piece in the middle of a large value) is
        asked for again from where it stopped, the same version only (``If-Range``): the
        daemon then reports the damage before any byte (:class:`LedgerError`, code
        ``corrupt``), or sends the rest; a daemon that went away is
        :class:`DaemonUnavailableError`."""
        url = self.url(
            self.page_path(ledger, page) + "/keys/" + quote(key),
            {"at": at, "offset": offset, "length": length},
        )
        done, headers, etag, total = 0, None, None, None
        while True:
            resp = await self.request("GET", url, headers=headers)
            async with resp:
                if headers is None:
                    etag, total = resp.headers.get("ETag"), resp.content_length
                elif resp.status != 206:  # the value changed since: no splicing
                    raise DaemonUnavailableError(
                        "unavailable",
                        f"ledgerd at {self.socket} cut the value short, and it changed since",
                    )
                resumable = etag is not None and offset is None and length is None
                cut_at = done
                chunks = resp.content.iter_chunked(CHUNK)
                while True:
                    with reaching(self.socket):
                        try:
                            chunk = await chunks.__anext__()
                        except StopAsyncIteration:
                            return
                        except aiohttp.ClientPayloadError:
                            if not resumable or (headers is not None and done == cut_at):
                                raise  # (nothing came since the last time: no loop)
                            break
                    done += len(chunk)
                    if progress:
                        progress(done, total)
                    yield chunk
            assert etag is not None
            headers = {"Range": f"bytes={done}-", "If-Range": etag}

    async def get(
        self,
        ledger: Name,
        page: Name,
        key: bytes,
        *,
        at: str | None = None,
        offset: int | None = None,
        length: int | None = None,
        progress: Progress | None = None,
    ) -> bytes:
        stream = self.get_stream(
            ledger, page, key, at=at, offset=offset, length=length, progress=progress
        )
        return b"".join([c async for c in stream])

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
        value: Content,
        *,
        lazy: bool = False,
        progress: Progress | None = None,
    ) -> None:
        """Set ``key`` to ``value``: bytes (a ``str`` as UTF-8), a file's contents
        (``progress`` told as it is read) or chunks of bytes, streamed
        (:data:`~ledgerd.daemon.client_body.Content`)."""
        url = self.url(
            self.page_path(ledger, page) + "/keys/" + quote(key),
            {"priority": "lazy" if lazy else None},
        )
        headers = {"Content-Type": "application/octet-stream"}
        async with sending(value, progress) as body:
            if body.length is not None:
                headers["Content-Length"] = str(body.length)
            resp = await self.request("PUT", url, data=body.data, headers=headers)
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

    def batch(
        self,
        ledger: Name,
        page: Name,
        puts: Iterable[tuple[bytes, bytes] | tuple[bytes, bytes, str]] = (),
        deletes: Iterable[bytes] = (),
    ) -> Coroutine[Any, Any, int]:
        """Many puts and deletes in one commit; returns how many were applied.
        ``puts`` and ``deletes`` are read when this is called, in the calling thread
        (the blocking client's caller's, not its loop's), and sent when awaited."""
        ops: list[dict[str, str]] = []
        for p in puts:
            op = {"op": "put", "key": b64(p[0]), "value": b64(p[1])}
            if len(p) == 3:
                op["priority"] = p[2]
            ops.append(op)
        ops.extend({"op": "delete", "key": b64(k)} for k in deletes)
        return self._batch(ledger, page, ops)

    async def _batch(self, ledger: Name, page: Name, ops: list[dict[str, str]]) -> int:
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
    ) -> AsyncGenerator[Item, None]:
        """Entries in key order, paging through the whole range (or ``limit`` entries)."""
        path = self.page_path(ledger, page) + "/entries"
        query: dict[str, str | bytes | int | None] = {"start": start, "end": end, "prefix": prefix}
        query.update(at=at, values=None if values else 0)

        def fetch(want: int, token: str | None) -> Awaitable[dict[str, Any]]:
            return self._json("GET", self.url(path, {**query, "limit": want, "token": token}))

        async for d in paged(fetch, "entries", limit, page_size):
            yield item_of(d)

    async def sync(
        self, ledger: Name | None = None, page: Name | None = None, timeout: float = 60.0
    ) -> dict[str, Any]:
        """Upload, download and join until quiet; LedgerError if it cannot finish."""
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
        """The page's merge policy and its conflicts (``conflicts``: keys whose siblings
        hold different values; ``conflict``: why they wait for a resolver, or None; ``heads``
        is 1); set the policy when ``policy`` is given."""
        url = self.url(self.page_path(ledger, page) + "/policy")
        if policy is None:
            return dict(await self._json("GET", url))
        return dict(await self._json("PUT", url, {"policy": policy}))

    async def conflicts(
        self,
        ledger: Name | None = None,
        page: Name | None = None,
        *,
        limit: int | None = None,
        start: bytes | None = None,
    ) -> list[PageConflicts]:
        """Pending conflicts: the page's (a list of one; from key ``start`` on), every
        page's of ``ledger``, or every open page's holding some; at most ``limit`` keys
        per page, 100 by default (see :class:`PageConflicts`; docs/merging.md)."""
        if page is not None and ledger is None:
            raise LedgerError("bad_request", "a page is named with its ledger")
        if ledger is not None and page is not None:
            query: dict[str, str | bytes | int | None] = {"limit": limit, "start": start}
            url = self.url(self.page_path(ledger, page) + "/conflicts", query)
            return [page_conflicts(await self._json("GET", url))]
        query = {"limit": limit, "ledger": None if ledger is None else raw(ledger)}
        doc = await self._json("GET", self.url("/v1/conflicts", query))
        return [page_conflicts(p) for p in doc["pages"]]

    async def resolve(
        self,
        ledger: Name,
        page: Name,
        key: Name | None = None,
        *,
        take: TakeName | None = None,
        value: bytes | None = None,
        expect: str | None = None,
    ) -> Resolved:
        """Resolve ``key``'s conflict (every conflict of the page when ``key`` is None):
        ``take`` "ours" (what reads show), "theirs" (the one other sibling) or "delete",
        or ``value``, a new value. ``expect`` (a listing's) refuses siblings that changed
        since (409 ``siblings_changed``)."""
        url = self.url(self.page_path(ledger, page) + "/conflicts/resolve")
        doc = await self._json("POST", url, resolve_body(key, take, value, expect))
        return resolved(doc)

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

    def transaction(self, ledger: Name, page: Name) -> TxnContext:
        """``async with c.transaction(l, p) as txn:`` commits on success, rolls back on error."""
        return TxnContext(self, ledger, page)

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

    async def watch(
        self, ledger: Name, page: Name, prefix: bytes = b""
    ) -> AsyncGenerator[Change, None]:
        """Changes of every later commit under ``prefix``, in order, until the caller stops."""
        w = await self.subscribe(ledger, page, prefix)
        try:
            async for change in w:
                yield change
        finally:
            await w.close()

    def documents(self, ledger: Name, page: Name) -> AsyncDocuments:
        """The page's documents (:mod:`daemon.client_docs`)."""
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


class TxnContext:
    """``async with client.transaction(l, p) as txn``: a session of its own, a transaction
    begun on it, committed on a clean exit (``commit_id``) or rolled back on an error."""

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
