"""The HTTP API's request plumbing, and what every handler is given.

This module owns :class:`Api`, what handlers and sessions reach (the repository, the
configuration, pages under the request's leases, bodies read with their limits and
timeouts, writes bounded in time) and :meth:`Api.serve`, the loop every request goes
through: the peer check, the route (:mod:`daemon.router`; the table is
:mod:`daemon.routes`), its request slot, errors as JSON, the metrics and the access
log. A handler is an :data:`Endpoint`; the query string is :mod:`daemon.query`'s,
JSON shapes :mod:`daemon.codec`'s, the connections under aiohttp's parser
:mod:`daemon.protocol`'s.

How bytes travel
    Ledger names, page ids and keys are percent-encoded bytes in the path, so any
    byte can be sent (``%00``, ``%FF``); a key may contain ``/`` as is. Encode
    ``.`` and ``..`` segments (``%2E``), which HTTP clients normalise away.
    ``start``, ``end`` and ``prefix`` query parameters are percent-encoded bytes
    too. In JSON, every key, value, name and continuation token is standard
    base64; commit ids are hex. Values travel as raw bodies, streamed both ways.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from dataclasses import dataclass, field
from typing import Any, cast
from urllib.parse import unquote_to_bytes

from aiohttp import HttpVersion11, hdrs, web
from aiohttp.http_exceptions import HttpProcessingError
from aiohttp.web_protocol import RequestPayloadError

from ledgerd.daemon import __version__
from ledgerd.daemon import errors as ae
from ledgerd.daemon.codec import parse_json
from ledgerd.daemon.config import Config
from ledgerd.daemon.leases import hold, page_leases
from ledgerd.daemon.metrics import Metrics
from ledgerd.daemon.peers import Peers, peer_credentials
from ledgerd.daemon.router import Route, Router
from ledgerd.store import (
    KEY_LIMIT,
    OFF_LOOP_BYTES,
    HeldBudget,
    Page,
    Repository,
    StoreError,
    TooManyOpenPagesError,
    off_loop,
)
from ledgerd.store.errors import named
from ledgerd.sync.engine import SyncEngine

log = logging.getLogger(__name__)
access = logging.getLogger("ledgerd.daemon.access")
"""The access log: a line per request, at DEBUG."""

VERSION = __version__
DEFAULT_LIMIT, MAX_LIMIT = 1000, 10_000
"""Entries in a listing of keys (``GET .../entries``, a session's ``range``)."""
STREAM_CHUNK = 256 * 1024
CONTROL_BODY_BYTES = 64 * 1024
"""The longest body of a control request (a page's merge policy, check, GC, evict):
a few names and flags, so a large one is refused (413) before it is read, rather
than read up to ``max_batch_bytes`` and parsed on the event loop."""
METHODS = frozenset(hdrs.METH_ALL)
"""The methods the metrics count by name (HTTP's standard ones, those of every route
among them); any other (aiohttp's pure-Python parser takes any token as a method)
counts as ``other``, so that clients cannot add series."""


@dataclass
class Params:
    """A route's path parameters: names and key as bytes, a commit id as its hex text."""

    ledger: bytes = b""
    page: bytes = b""
    key: bytes = b""
    commit: str = ""


@dataclass
class DaemonState:
    started: float = field(default_factory=time.time)
    shutting_down: bool = False
    stopping: asyncio.Event = field(default_factory=asyncio.Event)
    """Set when ``shutting_down`` is: what long-lived responses wait on to end."""
    extra_status: dict[str, Any] = field(default_factory=dict)


def _unquote(segment: str) -> bytes:
    """A percent-encoded path segment's bytes (``unquote_to_bytes``, without its work
    when there is no ``%``)."""
    return unquote_to_bytes(segment) if "%" in segment else segment.encode()


def _check_transfer_coding(header: str) -> None:
    """Refuse a ``Transfer-Encoding`` with a coding other than ``chunked`` (415
    ``unsupported_encoding``): aiohttp's parser removes the chunking and leaves any
    other coding (``gzip, chunked``) on the body, which would be stored as sent,
    something else than what the client meant (as a ``Content-Encoding`` would)."""
    codings = [c.strip().lower() for c in header.split(",")]
    if any(c != "chunked" for c in codings):
        raise ae.UnsupportedEncoding(
            f"Transfer-Encoding {header[:40]!r} is not supported: send the body as it is"
            " (chunked or with a Content-Length)"
        )


async def _expect(request: web.BaseRequest) -> None:
    """``Expect: 100-continue``: tell the client to send its body (as aiohttp's
    ``web.Application`` does before any handler runs); any other expectation is 417."""
    expect = request.headers.get(hdrs.EXPECT, "")
    if request.version != HttpVersion11:
        return
    if expect.strip().lower() != "100-continue":
        raise ae.ExpectationFailed(f"unknown expectation {expect[:40]!r}: only 100-continue")
    await request.writer.write(b"HTTP/1.1 100 Continue\r\n\r\n")
    request.writer.output_size = 0  # the response has not started
    await request.writer.drain()


class Api:
    """What every handler and session reaches: the repository, the configuration, the
    daemon's state, the sync engine and the metrics; pages under the request's leases,
    bodies, bounded writes; and the loop every request goes through (:meth:`serve`)."""

    def __init__(self, repo: Repository, cfg: Config, state: DaemonState) -> None:
        self.repo = repo
        self.cfg = cfg
        self.state = state
        self.peers = Peers(cfg)
        self.in_flight = 0
        """Requests holding one of ``max_concurrent_requests`` (:meth:`take_slot`)."""
        self._bound_warned = -60.0  # (monotonic) when a bound last turned requests away
        self.followers = 0
        """Followed changes feeds holding one of ``max_followers`` (:meth:`following`)."""
        self.held_budget = HeldBudget(cfg.max_held_index_bytes)
        """Memory for the index rows every document page holds (store.docindex)."""
        self.sessions: Any = None  # daemon.session.Sessions, set by the server
        self.engine: SyncEngine | None = None  # when cloud sync is on
        self.metrics: Metrics | None = None  # set by the server
        self.requests: set[asyncio.Task[Any]] = set()
        """The tasks of the requests being served (:meth:`cancel_requests`)."""
        self.big_batches = asyncio.Semaphore(1)
        """Held by the big batch being read and written (``keys_api.BIG_BATCH_BYTES``)."""

    def handler(
        self, router: Router[Endpoint]
    ) -> Callable[[web.BaseRequest], Awaitable[web.StreamResponse]]:
        """What aiohttp's low-level server (:mod:`daemon.protocol`) hands every request
        to: :meth:`serve` with ``router``, so there is no ``web.Application`` router or
        middleware chain to go through first (nor a frame of ours: the server makes
        ``web.Request`` objects, which is what :meth:`serve` takes)."""
        return cast(
            Callable[[web.BaseRequest], Awaitable[web.StreamResponse]],
            functools.partial(self.serve, router),
        )

    # -- plumbing ----------------------------------------------------------------

    async def serve(self, router: Router[Endpoint], request: web.Request) -> web.StreamResponse:
        """Every request's plumbing, in one frame: :meth:`admit`, its route and request
        slot, its handler under the request's page leases, errors as JSON
        (:meth:`failure`), the metrics, and the access log (a DEBUG line per request,
        ``--log-level debug``)."""
        started = time.monotonic()
        response: web.StreamResponse | None = None
        template = "unmatched"  # the route's, for the metrics
        task = asyncio.current_task()
        if task is not None:
            self.requests.add(task)
        try:
            try:
                self.admit(request)
                route, found = self.match(router, request)
                template = route.template
                counted = self.take_slot(route)
                try:
                    if request.headers.get(hdrs.EXPECT):  # once the request may go on
                        await _expect(request)
                    with page_leases():  # pages this request uses stay open until it ends
                        response = await route.handler(self, request, self.params(found))
                finally:
                    self.in_flight -= counted
            except (ConnectionResetError, asyncio.CancelledError):
                raise
            except Exception as e:
                response = self.failure(request, e)
            return response
        finally:
            if task is not None:
                self.requests.discard(task)
            self.served(request, template, response, time.monotonic() - started)

    def admit(self, request: web.Request) -> None:
        """Refuse a request from a peer not allowed, one that comes while the daemon
        stops, and one whose body has a coding other than identity or chunked."""
        creds = peer_credentials(request)
        if creds is not None and not self.peers.allowed(*creds):
            log.warning("refused a request from uid %d", creds[0])
            raise ae.PeerRefused(f"uid {creds[0]} is not allowed to use this ledgerd")
        if self.state.shutting_down:
            raise ae.ShuttingDown()
        encoding = request.headers.get(hdrs.CONTENT_ENCODING)
        if encoding is not None and encoding.strip().lower() != "identity":
            raise ae.UnsupportedEncoding(
                f"Content-Encoding {encoding[:40]!r} is not supported: send the body as it is"
            )
        if (coding := request.headers.get(hdrs.TRANSFER_ENCODING)) is not None:
            _check_transfer_coding(coding)

    def failure(self, request: web.Request, e: Exception) -> web.Response:
        """The answer to a request whose handling raised ``e``."""
        if isinstance(e, ae.ApiError):
            return self.error(e)
        if isinstance(e, StoreError):
            return self.error(self._store_error(request, e))
        if isinstance(e, web.HTTPRequestEntityTooLarge):
            limit = self.cfg.max_batch_bytes
            return self.error(ae.TooLarge(f"request body is over the {limit}-byte limit"))
        if isinstance(e, HttpProcessingError | RequestPayloadError):
            # A body the parser refused part-way (a bad chunk): the client's error. The
            # rest is not worth reading (aiohttp would try, fail again and log it as
            # unhandled): the body ends here and the connection closes.
            cause = e.__cause__ if isinstance(e, RequestPayloadError) else e
            what = cause.message if isinstance(cause, HttpProcessingError) else str(e)
            response = self.error(ae.BadRequest(f"malformed request body: {what}"))
            response.force_close()
            request.content.feed_eof()
            return response
        if isinstance(e, web.HTTPException):  # aiohttp's own (a body reader's)
            err: ae.ApiError = (
                ae.NotFound(e.reason) if e.status in (404, 405) else ae.BadRequest(e.reason)
            )
            if e.status >= 500:
                err = ae.ApiError(e.reason)
            err.status = e.status
            return self.error(err)
        if (known := ae.from_exception(e)) is not None:
            log.error("%s %s failed: %s", request.method, request.path, known)
            return self.error(known)
        log.exception("internal error serving %s %s", request.method, request.path)
        return self.error(ae.ApiError(f"internal error: {type(e).__name__}"))

    def _store_error(self, request: web.Request, e: StoreError) -> ae.ApiError:
        err = ae.from_store(e)
        if isinstance(e, TooManyOpenPagesError):  # a bound, like overloaded
            self._warn_bound(str(err))
        elif err.status >= 500:
            log.error("%s %s failed: %s", request.method, request.path, err)
        return err

    async def cancel_requests(self, timeout: float) -> int:
        """Cancel the requests still being served (shutdown, past ``shutdown_timeout``)
        and wait up to ``timeout`` seconds for them to end; how many there were."""
        tasks = set(self.requests)
        for task in tasks:
            task.cancel()
        if tasks:
            _, pending = await asyncio.wait(tasks, timeout=timeout)
            if pending:
                log.error(
                    "%d requests did not end within %gs of being cancelled", len(pending), timeout
                )
        return len(tasks)

    def served(
        self, request: web.Request, route: str, response: web.StreamResponse | None, t: float
    ) -> None:
        """Count the request, of ``t`` seconds, under its ``route`` template (its status
        is 500 for the metrics, ``-`` in the access log, when it ended with no response:
        the client left, or shutdown)."""
        if self.metrics is not None:
            status = 500 if response is None else response.status
            method = request.method if request.method in METHODS else "other"
            self.metrics.request_done(route, method, status, t)
        if access.isEnabledFor(logging.DEBUG):
            access.debug(
                "%s %s %s %.1f ms",
                request.method,
                request.raw_path[:200],
                "-" if response is None else response.status,
                t * 1000,
            )

    def _warn_bound(self, message: str) -> None:
        """Log a bound that turned requests away at most once a minute (a burst would
        log a line per request): the metrics count every answer."""
        now = time.monotonic()
        if now - self._bound_warned >= 60.0:
            self._bound_warned = now
            log.warning("requests turned away: %s", message)

    @staticmethod
    def error(e: ae.ApiError) -> web.Response:
        resp = web.json_response(e.body(), status=e.status, headers=e.headers)
        if isinstance(e, ae.RequestTimeout):  # the rest of its body is not worth waiting for
            resp.force_close()
        return resp

    def match(
        self, router: Router[Endpoint], request: web.Request
    ) -> tuple[Route[Endpoint], dict[str, str]]:
        """The request's route in ``router``, matched on the raw (still
        percent-encoded) path so that names and keys keep every byte, and its path
        parameters."""
        raw_path = request.raw_path.split("?", 1)[0]
        if not raw_path.isascii():  # only aiohttp's pure-Python parser lets one through
            raise ae.BadRequest("the path holds bytes that are not ASCII: percent-encode them")
        parts = raw_path.split("/")[1:]
        if not parts or parts[0] != "v1":
            if not request.rel_url.path.startswith("/"):  # `OPTIONS *`: as aiohttp answers
                raise ae.NotFound("Not Found")
            raise ae.NotFound(f"no such endpoint {raw_path} (the API lives under /v1/)")
        hit = router.find(request.method, parts[1:])
        if hit is None:
            allowed = router.allowed(parts[1:])
            if allowed:
                raise ae.MethodNotAllowed(
                    f"{raw_path} takes {', '.join(allowed)}, not {request.method}",
                    headers={"Allow": ", ".join(allowed)},
                )
            raise ae.NotFound(f"no such endpoint: {request.method} {raw_path}")
        return hit

    def take_slot(self, route: Route[Endpoint]) -> int:
        """One of ``max_concurrent_requests`` for the request's whole life (how many it
        took, 0 or 1: :meth:`serve` gives it back), or 503 ``overloaded`` at once when
        none is free. Routes that do not count (health and metrics, cheap and needed
        most when the daemon is busy; a session, which is bounded as a connection)
        take none."""
        if not route.counted:
            return 0
        limit = self.cfg.max_concurrent_requests
        if self.in_flight >= limit:
            raise ae.Overloaded(
                f"{limit} requests are being served (max_concurrent_requests): try again shortly"
            )
        self.in_flight += 1
        return 1

    @contextlib.contextmanager
    def following(self) -> Iterator[None]:
        """For a request that becomes a stream for as long as its client stays (a
        followed changes feed): it gives back its request slot (:meth:`take_slot`) and holds
        one of ``max_followers`` instead, or is 503 ``overloaded`` at once when none is
        free; so followers, however many, never take the slots of short requests."""
        limit = self.cfg.max_followers
        if self.followers >= limit:
            raise ae.Overloaded(
                f"{limit} changes feeds are being followed (max_followers): try again shortly"
            )
        self.followers += 1
        self.in_flight -= 1
        try:
            yield
        finally:
            self.in_flight += 1  # given back by serve() when the request ends
            self.followers -= 1

    def params(self, found: dict[str, str]) -> Params:
        """A route's path parameters, decoded and checked."""
        p = Params(commit=found.get("commit", ""))
        if (ledger := found.get("ledger")) is not None:
            p.ledger = self.name_bytes(_unquote(ledger), "ledger name")
        if (page := found.get("page")) is not None:
            p.page = self.name_bytes(_unquote(page), "page id")
        if (key := found.get("key")) is not None:
            p.key = _unquote(key)
            if len(p.key) > KEY_LIMIT:
                raise ae.UriTooLong(f"key of {len(p.key)} bytes is over the {KEY_LIMIT}-byte limit")
        return p

    @staticmethod
    def name_bytes(raw: bytes, what: str) -> bytes:
        if not raw:
            raise ae.BadRequest(f"{what} must not be empty")
        if len(raw) > 128:
            raise ae.TooLarge(f"{what} of {len(raw)} bytes is over the 128-byte limit")
        return raw

    async def page(self, ledger: bytes, page_id: bytes, *, create: bool) -> Page:
        if not create and not self.repo.page_exists(ledger, page_id):
            if lost := self.repo.lost_error(ledger, page_id):
                raise lost  # 500 corrupt, as its writes are: not "no such page"
            if not self.repo.ledger_exists(ledger):
                raise ae.LedgerNotFound(f"no ledger {named(ledger)}")
            raise ae.PageNotFound(f"no page {named(page_id)} in ledger {named(ledger)}")
        page = await self.repo.open_page(ledger, page_id)
        hold(page)  # no await since open_page returned: it is still open
        return page

    async def body_chunks(self, request: web.Request) -> AsyncIterator[bytes]:
        """The request body as it arrives; a client silent for ``request_timeout``
        seconds ends it with 408 (and the connection is closed)."""
        chunks = aiter(request.content.iter_chunked(STREAM_CHUNK))
        while True:
            try:
                async with asyncio.timeout(self.cfg.request_timeout):
                    chunk = await anext(chunks)
            except StopAsyncIteration:
                return
            except TimeoutError:
                raise ae.RequestTimeout(
                    f"no part of the request body came for {self.cfg.request_timeout:g}s"
                ) from None
            yield chunk

    async def send(self, request: web.Request, resp: web.StreamResponse, data: bytes) -> None:
        """Write part of a streamed response body (:meth:`bounded`)."""
        await self.bounded(request.transport, resp.write(data))

    async def bounded(self, transport: asyncio.Transport | None, sending: Awaitable[None]) -> None:
        """Await a write to a client; a client that takes none of it for
        ``request_timeout`` seconds is cut off (its connection aborted, then
        ``ConnectionResetError``), so that it holds no handler, buffer, session or page
        lease."""
        try:
            async with asyncio.timeout(self.cfg.request_timeout):
                await sending
        except TimeoutError:
            if transport is not None:
                transport.abort()
            raise ConnectionResetError(
                f"the client took nothing for {self.cfg.request_timeout:g}s"
            ) from None

    async def read_body(
        self, request: web.Request, limit: int | None = None, what: str = "request body"
    ) -> bytes:
        """The whole body (at most ``limit``, or ``max_batch_bytes``), read as
        :meth:`body_chunks`; a body that has arrived whole (most small ones) is taken as
        it is, with no timer, since nothing is waited for. One whose Content-Length is
        over the limit is refused before any of it is read."""
        limit = self.cfg.max_batch_bytes if limit is None else min(limit, self.cfg.max_batch_bytes)
        if (request.content_length or 0) > limit:
            raise ae.TooLarge(f"{what} is over the {limit}-byte limit")
        content = request.content
        if content.is_eof():
            whole = content.read_nowait()
            if len(whole) > limit:
                raise ae.TooLarge(f"{what} is over the {limit}-byte limit")
            return whole
        chunks, size = [], 0
        async for chunk in self.body_chunks(request):
            size += len(chunk)
            if size > limit:
                raise ae.TooLarge(f"{what} is over the {limit}-byte limit")
            chunks.append(chunk)
        # Joined in one copy, on a thread when big (it runs without the GIL): copying
        # tens of MB, the pages first touched, was a step of hundreds of ms on the loop.
        return await off_loop(size > OFF_LOOP_BYTES, b"".join, chunks)

    async def optional_json(self, request: web.Request, what: str) -> Any:
        """The body of a control request (at most :data:`CONTROL_BODY_BYTES`) as JSON,
        or ``{}`` when there is none (only blanks)."""
        body = await self.read_body(request, CONTROL_BODY_BYTES, what)
        return parse_json(body, what) if body.strip() else {}

    async def new_page(self, ledger: bytes, page_id: bytes) -> tuple[Page, bool]:
        """The page, made if it does not exist, as :meth:`page` hands it out, and
        whether this made it: a page made here is marked unwritten until its maker drops
        the mark (:meth:`Repository.acquire_new`)."""
        page, made = await self.repo.acquire_new(ledger, page_id)
        hold(page)  # no await since acquire_new returned: it is still open
        return page, made

    @contextlib.asynccontextmanager
    async def first_write(self, ledger: bytes, page_id: bytes) -> AsyncIterator[Page]:
        """Around a write into the page, which it makes if it does not exist (yields the
        page): a page made here is marked unwritten until the write is acknowledged
        (:meth:`Repository.acquire_new`), so that a daemon killed in between leaves
        no empty page listed after its restart. A write that fails leaves the mark:
        the restart removes the page if it is still empty."""
        page, made = await self.new_page(ledger, page_id)
        yield page
        if made:
            await self.repo.written(ledger, page_id)

    async def discard_unwritten(self, ledger: bytes, page_id: bytes) -> None:
        """Remove a page this daemon made for a first write that failed or changed
        nothing, or for a watch (see :meth:`Repository.discard_unwritten`); a failure
        is logged."""
        try:
            await self.repo.discard_unwritten(ledger, page_id)
        except Exception:
            log.exception("could not remove page %s that nothing was written to", named(page_id))


Endpoint = Callable[[Api, web.Request, Params], Awaitable[web.StreamResponse]]
"""Every handler: the :class:`Api`, the request and its path parameters (its query is
:meth:`daemon.query.Query.of`); its answer."""


async def stream_body(
    api: Api, request: web.Request, resp: web.StreamResponse, chunks: AsyncIterator[bytes]
) -> None:
    """Send a value's ``chunks`` as the body of ``resp`` (prepared here). The first
    chunk is read (and verified) before the headers go out, so a corrupt index or first
    chunk is still a clean error; past that, a failure aborts the connection, so that
    the client sees a short body (another response would land inside this one)."""
    first = await anext(chunks, b"")
    await resp.prepare(request)
    try:
        await api.send(request, resp, first)
        async for chunk in chunks:
            await api.send(request, resp, chunk)
        await resp.write_eof()
    except ConnectionError as e:  # the client went away (`ledgerctl get | head`): normal
        log.debug("the client of %s %s left early: %s", request.method, request.path, e)
    except Exception as e:
        if isinstance(e, StoreError):  # e.g. a corrupt chunk: the message says it all
            log.error("aborted %s %s mid-body: %s", request.method, request.path, e)
        else:
            log.exception("aborted %s %s mid-body", request.method, request.path)
        if request.transport is not None:
            request.transport.abort()
