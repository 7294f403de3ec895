"""The HTTP API over the Unix socket (``/v1/...``), served by aiohttp.

This module owns the routes (:data:`ROUTES`, a table matched on the raw path), how
names, keys and values travel in requests, peer-credential checks, error responses
and request draining. JSON shapes and base64 are in :mod:`daemon.codec`, the
connection layer under aiohttp's parser in :mod:`daemon.protocol`, WebSocket
sessions in :mod:`daemon.session`.

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
import contextvars
import grp
import logging
import math
import os
import pwd
import re
import socket
import struct
import time
import weakref
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any, cast
from urllib.parse import parse_qsl, unquote_to_bytes

from aiohttp import HttpVersion11, hdrs, web
from aiohttp.http_exceptions import HttpProcessingError
from aiohttp.web_protocol import RequestPayloadError

from ledgerd.daemon import __version__
from ledgerd.daemon import conflicts_api as conflicts
from ledgerd.daemon import docs_api as docs
from ledgerd.daemon import errors as ae
from ledgerd.daemon import status_report as report
from ledgerd.daemon.codec import (
    Change,
    b64,
    batch_body_changes,
    commit_json,
    entries_json,
    flag_param,
    integer_param,
    number_param,
    parse_json,
    parse_priority,
    priority_name,
    repeated_param,
    text_or_none,
    token_param,
)
from ledgerd.daemon.collector import SYNC_OFF
from ledgerd.daemon.config import Config
from ledgerd.daemon.metrics import ROUTE_KEY
from ledgerd.store import (
    KEY_LIMIT,
    OFF_LOOP_BYTES,
    HeldBudget,
    Page,
    Policy,
    Repository,
    StoreError,
    TooManyOpenPagesError,
    View,
    off_loop,
)
from ledgerd.store.errors import named
from ledgerd.store.pieces import digest as dg

log = logging.getLogger(__name__)
access = logging.getLogger("ledgerd.daemon.access")
"""The access log: a line per request, at DEBUG."""

VERSION = __version__
DEFAULT_LIMIT, MAX_LIMIT = 1000, 10_000
STREAM_CHUNK = 256 * 1024
CONTROL_BODY_BYTES = 64 * 1024
"""The longest body of a control request (a page's merge policy, check, GC, evict):
a few names and flags, so a large one is refused (413) before it is read, rather
than read up to ``max_batch_bytes`` and parsed on the event loop."""
BIG_BATCH_BYTES = 4 * 1024 * 1024
"""A batch whose body is over this, or of a length not given (chunked), is big: big
batches are read and written one at a time (:attr:`Api.big_batches`), so that what
batches hold in memory stays about twice ``max_batch_bytes`` (docs/performance.md)."""
MIN_SECONDS = 0.001
"""The smallest timeout a query takes (``POST /v1/sync?timeout=``): a millisecond, below
which nothing could finish (5e-324 is a number, not a timeout)."""


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


class _Leases:
    """The page leases of one request or session op (see :func:`page_leases`)."""

    __slots__ = ("held", "_token")

    def __init__(self) -> None:
        self.held: list[contextlib.AbstractContextManager[Page]] = []

    def hold(self, page: Page) -> None:
        lease = page.lease()
        lease.__enter__()
        self.held.append(lease)

    def __enter__(self) -> _Leases:
        self._token = _leases.set(self)
        return self

    def __exit__(self, *exc: object) -> None:
        _leases.reset(self._token)
        while self.held:  # each ends however the block ended: a lease only counts users
            self.held.pop().__exit__(None, None, None)


_leases: contextvars.ContextVar[_Leases] = contextvars.ContextVar("leases")
"""The page leases of the request (or session op) being served."""


def page_leases() -> _Leases:
    """Pages that :meth:`Api.page` hands out inside the block stay leased (open)
    until it ends: one block per request, and one per op of a session (a session's
    transactions and watchers keep their pages open by themselves)."""
    return _Leases()


_peer_cache: weakref.WeakKeyDictionary[asyncio.BaseTransport, tuple[int, int] | None] = (
    weakref.WeakKeyDictionary()
)
_ASK = (-1, -1)  # what the cache answers for a transport it does not know yet


def peer_credentials(request: web.Request) -> tuple[int, int] | None:
    """(uid, gid) of the process at the other end of the Unix socket.

    The kernel fixes them when the peer connects, so they are asked once per
    connection, not once per request.
    """
    transport = request.transport
    if transport is None:
        return None
    known = _peer_cache.get(transport, _ASK)
    if known is not _ASK:
        return known
    sock = transport.get_extra_info("socket")
    creds: tuple[int, int] | None = None
    if sock is not None and sock.family == socket.AF_UNIX:
        raw = sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i"))
        _pid, uid, gid = struct.unpack("3i", raw)
        creds = int(uid), int(gid)
    _peer_cache[transport] = creds
    return creds


def _in_group(uid: int, gid: int) -> bool:
    try:
        name = pwd.getpwuid(uid).pw_name
        return name in grp.getgrgid(gid).gr_mem or pwd.getpwuid(uid).pw_gid == gid
    except KeyError:
        return False


class Query:
    """Query parameters as raw bytes (percent-decoded, not UTF-8-decoded)."""

    @classmethod
    def of(cls, request: web.Request) -> Query:
        """The request's parameters, from its query string as sent (still percent-encoded:
        aiohttp's ``query_string`` is decoded as UTF-8 already)."""
        raw = request.rel_url.raw_query_string
        return cls(raw) if raw else _NO_QUERY

    def __init__(self, raw: str) -> None:
        self.params: dict[str, bytes] = {}
        self.repeated: set[str] = set()
        """Names given more than once: reading one is 400 (each takes one value; the
        first or the last winning would act on what the client may not have meant)."""
        for k, v in parse_qsl(raw, keep_blank_values=True, encoding="latin-1"):
            if k in self.params:
                self.repeated.add(k)
            self.params.setdefault(k, v.encode("latin-1"))

    def bytes(self, name: str) -> bytes | None:
        if name in self.repeated:
            raise repeated_param(name)
        return self.params.get(name)

    def text(self, name: str) -> str | None:
        v = self.bytes(name)
        if v is None:
            return None
        try:
            return v.decode()
        except UnicodeDecodeError:
            raise ae.BadRequest(f"query parameter {name} is not UTF-8") from None

    def int(self, name: str, default: int | None = None, lo: int = 0) -> int | None:
        v = self.text(name)
        if v is None or v == "":
            return default
        n = integer_param(name, v)
        if n < lo:
            raise ae.BadRequest(f"query parameter {name} must be at least {lo}")
        return n

    def seconds(self, name: str, default: float) -> float:
        """A finite number of seconds, at least :data:`MIN_SECONDS` (``default`` when
        absent); anything else is 400 ``invalid_timeout``."""
        v = self.text(name)
        if v is None or v == "":
            return default
        n = number_param(name, v)
        if not math.isfinite(n) or n < MIN_SECONDS:
            raise ae.InvalidTimeout(
                f"query parameter {name} must be a number of seconds, at least {MIN_SECONDS}"
                f" (not {v[:40]})"
            )
        return n

    def flag(self, name: str, default: bool) -> bool:
        """A flag (:func:`codec.flag_param`: 1, true, yes; 0, false, no or empty)."""
        v = self.text(name)
        if v is None:
            return default
        return flag_param(name, v)


def _unquote(segment: str) -> bytes:
    """A percent-encoded path segment's bytes (``unquote_to_bytes``, without its work
    when there is no ``%``)."""
    return unquote_to_bytes(segment) if "%" in segment else segment.encode()


_NO_QUERY = Query("")
"""The parameters of every request without a query string (most of them)."""

_RANGE_SPEC = re.compile(r"([0-9]*)-([0-9]*)", re.ASCII)


def _position(digits: str) -> int:
    """A byte position; one past any value's size when it is too long to be a size
    (and too long for ``int()``'s digit limit). Leading zeros are no part of its length
    (RFC 9110 allows them: ``bytes=000…0001-2`` is bytes 1-2)."""
    digits = digits.lstrip("0") or "0"
    return int(digits) if len(digits) <= 18 else 2**63


def requested_range(
    headers: Mapping[str, str], size: int, etag: str | None, q: Query
) -> tuple[int, int] | None:
    """The part of a ``size``-byte value that a request's ``Range`` asks for, as
    (offset, length), or None for the whole value (a 200): no ``Range``, or one to
    ignore (see :func:`parse_range`), or an ``If-Range`` that is not ``etag`` (the
    value changed since the client read its first part: RFC 9110 13.1.5; a date, or a
    value without an ETag, never matches). Without a ``Range``, the query's
    ``offset`` and ``length`` ask the same way (206, or 416 when no byte is selected)."""
    header = headers.get(hdrs.RANGE)
    if header is None:
        return _query_range(q, size)
    if_range = headers.get(hdrs.IF_RANGE)
    if if_range is not None and (etag is None or if_range.strip() != etag):
        return None
    return parse_range(header, size)


def _query_range(q: Query, size: int) -> tuple[int, int] | None:
    if q.text("offset") is None and q.text("length") is None:
        return None
    offset = q.int("offset", 0) or 0
    want = q.int("length", size - offset)
    length = max(0, min(size - offset, size if want is None else want))
    if offset >= size or length == 0:
        why = (
            f"offset {offset} is at or past the end"
            if offset >= size
            else f"length {want} selects no byte"
        )
        raise ae.RangeNotSatisfiable(
            f"{why} of the {size}-byte value", {"Content-Range": f"bytes */{size}"}
        )
    return offset, length


def parse_range(header: str, size: int) -> tuple[int, int] | None:
    """A ``Range`` header as (offset, length) of a ``size``-byte value, as RFC 9110 14:
    ``bytes=a-b``, ``bytes=a-`` or ``bytes=-n`` (the unit in any case); a range that
    selects no byte (``bytes=-0``, a start at or past the end) is 416; a malformed one
    400. None (serve the whole value, 200) where the RFC lets a server ignore the
    header: a unit other than bytes (it must), several ranges (no multipart answers
    here), and a suffix range of an empty value (satisfiable: the whole, empty, value)."""
    unit, eq, spec_list = header.strip().partition("=")
    if eq and unit.strip().lower() != "bytes":
        return None
    specs = [s.strip() for s in spec_list.split(",") if s.strip()]  # empty elements: RFC 9110 5.6.1
    parsed = [_RANGE_SPEC.fullmatch(s) for s in specs]
    if not eq or not specs or any(m is None or m.group(1) == m.group(2) == "" for m in parsed):
        raise ae.BadRequest(f"malformed Range header {header[:100]!r}: expected bytes=a-b")
    for m in parsed:
        assert m is not None
        if m.group(1) and m.group(2) and _position(m.group(2)) < _position(m.group(1)):
            raise ae.BadRequest(
                f"malformed Range header {header[:100]!r}: the end is before the start"
            )
    if len(parsed) > 1:
        return None
    assert parsed[0] is not None
    first, last = parsed[0].group(1), parsed[0].group(2)
    if first == "":  # a suffix: the last n bytes
        n = _position(last)
        if n == 0:
            raise ae.RangeNotSatisfiable(
                f"range {header[:100]} selects no byte of the {size}-byte value",
                {"Content-Range": f"bytes */{size}"},
            )
        if size == 0:
            return None
        return size - min(n, size), min(n, size)
    a = _position(first)
    if a >= size:
        raise ae.RangeNotSatisfiable(
            f"range {header[:100]} is outside the {size}-byte value",
            {"Content-Range": f"bytes */{size}"},
        )
    b = min(_position(last), size - 1) if last else size - 1
    return a, b - a + 1


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


def _handed_over(changes: list[Change]) -> Iterator[Change]:
    """``changes`` in order, each dropped from the list as it is taken (the list ends
    empty): what the write has taken is not held here too."""
    changes.reverse()
    while changes:
        yield changes.pop()


class Api:
    def __init__(self, repo: Repository, cfg: Config, state: DaemonState) -> None:
        self.repo = repo
        self.cfg = cfg
        self.state = state
        self.allowed = cfg.allowed_uids()
        self.group = cfg.socket_gid()
        self._peers: dict[int, bool] = {}
        self.in_flight = 0
        """Requests holding one of ``max_concurrent_requests`` (:meth:`slot`)."""
        self._bound_warned = -60.0  # (monotonic) when a bound last turned requests away
        self.followers = 0
        """Followed changes feeds holding one of ``max_followers`` (:meth:`following`)."""
        self.held_budget = HeldBudget(cfg.max_held_index_bytes)
        """Memory for the index rows every document page holds (store.docindex)."""
        self.sessions: Any = None  # daemon.session.Sessions, set by the server
        self.engine: Any = None  # sync.engine.SyncEngine when cloud sync is on
        self.metrics: Any = None  # daemon.metrics.Metrics, set by the server
        self.requests: set[asyncio.Task[Any]] = set()
        """The tasks of the requests being served (:meth:`cancel_requests`)."""
        self.big_batches = asyncio.Semaphore(1)
        """Held by the big batch being read and written (:data:`BIG_BATCH_BYTES`)."""

    async def handle(self, request: web.BaseRequest) -> web.StreamResponse:
        """Every request, as aiohttp's low-level server (:mod:`daemon.protocol`) hands
        it over: :data:`ROUTES` is the router, so there is no ``web.Application``
        router or middleware chain to go through first."""
        return await self.serve(cast(web.Request, request))  # the server makes Requests

    # -- plumbing ----------------------------------------------------------------

    async def serve(self, request: web.Request) -> web.StreamResponse:
        """Every request's plumbing, in one frame: the peer check, page leases,
        errors as JSON, the metrics, and the access log (a DEBUG line per request,
        ``--log-level debug``), around :meth:`route`."""
        started = time.monotonic()
        response: web.StreamResponse | None = None
        task = asyncio.current_task()
        if task is not None:
            self.requests.add(task)
        try:
            try:
                creds = peer_credentials(request)
                if creds is not None and not self.peer_allowed(*creds):
                    log.warning("refused a request from uid %d", creds[0])
                    raise ae.PeerRefused(f"uid {creds[0]} is not allowed to use this ledgerd")
                if self.state.shutting_down:
                    raise ae.ShuttingDown()
                encoding = request.headers.get(hdrs.CONTENT_ENCODING)
                if encoding is not None and encoding.strip().lower() != "identity":
                    raise ae.UnsupportedEncoding(
                        f"Content-Encoding {encoding[:40]!r} is not supported: send the body"
                        " as it is"
                    )
                if (coding := request.headers.get(hdrs.TRANSFER_ENCODING)) is not None:
                    _check_transfer_coding(coding)
                route, found = self.match(request)
                with self.slot(route):
                    if request.headers.get(hdrs.EXPECT):  # once the request may go on
                        await _expect(request)
                    with page_leases():  # pages this request uses stay open until it ends
                        response = await route.handler(self, request, self.params(found))
            except ae.ApiError as e:
                response = self.error(e)
            except StoreError as e:
                err = ae.from_store(e)
                if isinstance(e, TooManyOpenPagesError):  # a bound, like overloaded
                    self._warn_bound(str(err))
                elif err.status >= 500:
                    log.error("%s %s failed: %s", request.method, request.path, err)
                response = self.error(err)
            except web.HTTPRequestEntityTooLarge:
                response = self.error(
                    ae.TooLarge(f"request body is over the {self.cfg.max_batch_bytes}-byte limit")
                )
            except (HttpProcessingError, RequestPayloadError) as e:
                # A body the parser refused part-way (a bad chunk): the client's error. The
                # rest is not worth reading (aiohttp would try, fail again and log it as
                # unhandled): the body ends here and the connection closes.
                cause = e.__cause__ if isinstance(e, RequestPayloadError) else e
                what = cause.message if isinstance(cause, HttpProcessingError) else str(e)
                response = self.error(ae.BadRequest(f"malformed request body: {what}"))
                response.force_close()
                request.content.feed_eof()
            except web.HTTPException as e:  # aiohttp's own (a body reader's)
                err = ae.NotFound(e.reason) if e.status in (404, 405) else ae.BadRequest(e.reason)
                if e.status >= 500:
                    err = ae.ApiError(e.reason)
                err.status = e.status
                response = self.error(err)
            except (ConnectionResetError, asyncio.CancelledError):
                raise
            except Exception as e:
                if (known := ae.from_exception(e)) is not None:
                    log.error("%s %s failed: %s", request.method, request.path, known)
                    response = self.error(known)
                else:
                    log.exception("internal error serving %s %s", request.method, request.path)
                    response = self.error(ae.ApiError(f"internal error: {type(e).__name__}"))
            return response
        finally:
            if task is not None:
                self.requests.discard(task)
            self.served(request, response, time.monotonic() - started)

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
        self, request: web.Request, response: web.StreamResponse | None, seconds: float
    ) -> None:
        """Count the request (its status is 500 for the metrics, ``-`` in the access
        log, when it ended with no response: the client left, or shutdown)."""
        if self.metrics is not None:
            status = 500 if response is None else response.status
            method = request.method if request.method in METHODS else "other"
            self.metrics.request_done(request.get(ROUTE_KEY, "unmatched"), method, status, seconds)
        if access.isEnabledFor(logging.DEBUG):
            access.debug(
                "%s %s %s %.1f ms",
                request.method,
                request.raw_path[:200],
                "-" if response is None else response.status,
                seconds * 1000,
            )

    def peer_allowed(self, uid: int, gid: int) -> bool:
        """Listed users (or this user and root) and members of ``socket_group``."""
        if uid in self.allowed:
            return True
        if self.group is None:
            return False
        if gid == self.group:
            return True
        if uid not in self._peers:
            self._peers[uid] = _in_group(uid, self.group)
        return self._peers[uid]

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

    def match(self, request: web.Request) -> tuple[Route, dict[str, str]]:
        """The request's route in :data:`ROUTES`, matched on the raw (still
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
        hit = ROUTER.find(request.method, parts[1:])
        if hit is None:
            allowed = ROUTER.allowed(parts[1:])
            if allowed:
                raise ae.MethodNotAllowed(
                    f"{raw_path} takes {', '.join(allowed)}, not {request.method}",
                    headers={"Allow": ", ".join(allowed)},
                )
            raise ae.NotFound(f"no such endpoint: {request.method} {raw_path}")
        route, found = hit
        request[ROUTE_KEY] = route.template  # for the metrics
        return route, found

    @contextlib.contextmanager
    def slot(self, route: Route) -> Iterator[None]:
        """One of ``max_concurrent_requests`` for the request's whole life, or 503
        ``overloaded`` at once when none is free. Routes that do not count (health and
        metrics, cheap and needed most when the daemon is busy; a session, which is
        bounded as a connection) take none."""
        if not route.counted:
            yield
            return
        limit = self.cfg.max_concurrent_requests
        if self.in_flight >= limit:
            raise ae.Overloaded(
                f"{limit} requests are being served (max_concurrent_requests): try again shortly"
            )
        self.in_flight += 1
        try:
            yield
        finally:
            self.in_flight -= 1

    @contextlib.contextmanager
    def following(self) -> Iterator[None]:
        """For a request that becomes a stream for as long as its client stays (a
        followed changes feed): it gives back its request slot (:meth:`slot`) and holds
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
            self.in_flight += 1  # given back by slot() when the request ends
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
        leases = _leases.get(None)
        if leases is not None:  # no await since open_page returned: it is still open
            leases.hold(page)
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

    async def view(self, request: web.Request, page: Page) -> View:
        at = Query.of(request).text("at")
        if not at:
            return page
        return await page.snapshot(await page.find_commit(at))

    # -- endpoints (in ROUTES) -------------------------------------------------------

    async def session(self, request: web.Request, p: Params) -> web.StreamResponse:
        return await self.sessions.handle(request)  # type: ignore[no-any-return]

    async def status(self, request: web.Request, p: Params) -> web.Response:
        """The daemon's facts, its open pages, and (:mod:`daemon.status_report`) every
        page's sync, the devices and the conflicts."""
        q = Query.of(request)
        limit = q.int("pages_limit", report.PAGES_LIMIT)
        if limit is None or limit > report.MAX_PAGES_LIMIT:
            raise ae.BadRequest(f"pages_limit must be at most {report.MAX_PAGES_LIMIT}")
        after = q.text("pages_after")
        pages: dict[tuple[bytes, bytes], dict[str, Any]] = {}
        for pg in self.repo.open_pages():
            if pg.closed or pg.deleted:  # closed as idle meanwhile, or deleted (rm)
                continue
            with pg.lease(use=False):
                pages[pg.ledger, pg.id] = {
                    "ledger": b64(pg.ledger),
                    "page": b64(pg.id),
                    "ledger_text": text_or_none(pg.ledger),
                    "page_text": text_or_none(pg.id),
                    "heads": len(await pg.heads()),
                    "conflicts": pg.conflict_count,
                    "policy": pg.policy.value,
                    "conflict": pg.pending_conflict,
                    **(await self.engine.page_status(pg) if self.engine else {"sync": SYNC_OFF}),
                }
        return web.json_response(
            {
                "version": VERSION,
                "pid": os.getpid(),
                "device_id": self.repo.device_id.hex(),
                "data_dir": str(self.repo.root),
                "uptime_s": round(time.time() - self.state.started, 3),
                "cloud": self.cfg.cloud or None,
                "sync_error": self.engine.last_error if self.engine else None,
                "sync": self.engine.status() if self.engine else None,
                "open_pages": list(pages.values()),
                **await report.pages_report(
                    self.repo, self.engine, pages, limit, report.token_key(after) if after else None
                ),
                "devices": self.engine.devices() if self.engine else [],
                "conflicts": await report.conflicts_report(self.repo, self.engine, pages),
                **self.state.extra_status,
            }
        )

    async def sync(self, request: web.Request, p: Params) -> web.Response:
        """Upload everything pending, fetch everything visible and join it, until a round
        is quiet."""
        q = Query.of(request)
        ledger, page = q.bytes("ledger"), q.bytes("page")
        timeout = q.seconds("timeout", 60.0)
        if page is not None and ledger is None:
            raise ae.BadRequest("page needs ledger")
        if self.engine is None:
            raise ae.Conflict("cloud sync is off: start ledgerd with --cloud URL")
        from ledgerd.sync.errors import SyncError, SyncStoppedError

        try:
            stats = await self.engine.sync(ledger or None, page or None, timeout=timeout)
        except SyncStoppedError:  # SIGTERM: the engine ended the rounds in flight
            raise ae.ShuttingDown("ledgerd is shutting down: sync was stopped") from None
        except SyncError as e:  # the bucket, a listing, or the timeout (with the last error)
            kind = ae.BUCKET_ERRORS.get(getattr(e, "code", ""), ae.Unavailable)
            raise kind(f"sync failed: {e}") from None
        problems = self.engine.problems(ledger or None, page or None)
        if problems:
            err = ae.Unavailable(f"sync incomplete: {problems[0]['error']}")
            return web.json_response({**err.body(), "problems": problems}, status=err.status)
        return web.json_response(
            {
                "rounds": stats.rounds,
                "uploaded_packs": stats.uploaded_packs,
                "downloaded_packs": stats.downloaded_packs,
            }
        )

    async def ledgers(self, request: web.Request, p: Params) -> web.Response:
        names = await self.repo.ledgers()
        return web.json_response(
            {"ledgers": [{"name": b64(n), "text": text_or_none(n)} for n in names]}
        )

    async def pages(self, request: web.Request, p: Params) -> web.Response:
        if not await self.repo.ledger_listed(p.ledger):
            raise ae.LedgerNotFound(f"no ledger {named(p.ledger)}")
        ids = await self.repo.ledger(p.ledger).pages()
        return web.json_response({"pages": [{"id": b64(i), "text": text_or_none(i)} for i in ids]})

    async def get_key(self, request: web.Request, p: Params) -> web.StreamResponse:
        page, key = await self.page(p.ledger, p.page, create=False), p.key
        plain = not request.rel_url.raw_query_string and "Range" not in request.headers
        view = page if plain else await self.view(request, page)
        entry = await view.get_entry(key)
        if entry is None:
            raise ae.KeyNotFound(f"key {named(key[:64])} is not in the page")
        headers = {
            "Accept-Ranges": "bytes",
            "ETag": '"' + entry.value.hex() + '"',
            "Ledger-Priority": priority_name(entry.priority),
        }
        if plain and not dg.is_index(entry.value):  # one piece: answer from memory
            data = await view.objects.get_piece(entry.value)
            if request.method == "HEAD":
                headers["Content-Length"] = str(len(data))
                return web.Response(status=200, headers=headers)
            return web.Response(body=data, headers=headers, content_type="application/octet-stream")
        size = await view.objects.size(entry.value)
        offset, length, status = 0, size, 200
        part = requested_range(request.headers, size, headers["ETag"], Query.of(request))
        if part is not None:
            (offset, length), status = part, 206
        resp = web.StreamResponse(status=status)
        resp.content_type = "application/octet-stream"
        resp.content_length = length
        resp.headers.update(headers)
        if status == 206:
            resp.headers["Content-Range"] = f"bytes {offset}-{offset + length - 1}/{size}"
        if request.method == "HEAD":
            await resp.prepare(request)
            return resp
        chunks = aiter(await view.objects.read(entry.value, offset, length))
        # The first batch of pieces is read (and verified) before the headers go out,
        # so a corrupt index or first chunk is still a clean 500 corrupt.
        first = await anext(chunks, b"")
        await resp.prepare(request)
        try:
            await self.send(request, resp, first)
            async for chunk in chunks:
                await self.send(request, resp, chunk)
            await resp.write_eof()
        except ConnectionError as e:  # the client went away (`ledgerctl get | head`): normal
            log.debug("the client of %s %s left early: %s", request.method, request.path, e)
        except Exception as e:
            # The headers (status 200, Content-Length) are out: another response would
            # land inside the body. Abort the connection so the client sees a short body.
            if isinstance(e, StoreError):  # e.g. a corrupt chunk: the message says it all
                log.error("aborted %s %s mid-body: %s", request.method, request.path, e)
            else:
                log.exception("aborted %s %s mid-body", request.method, request.path)
            if request.transport is not None:
                request.transport.abort()
        return resp

    async def put_key(self, request: web.Request, p: Params) -> web.Response:
        priority, key = parse_priority(Query.of(request).text("priority")), p.key
        length = request.content_length
        # A small value is read whole (before the page is made: a body that fails makes
        # none); past max_batch_bytes (a bound on what a request holds in memory) it is
        # streamed like a large one, not refused.
        if length is not None and length <= min(256 * 1024, self.cfg.max_batch_bytes):
            body = await self.read_body(request)
            if len(body) != length:
                raise ae.BadRequest("request body is shorter than its Content-Length")
            async with self.first_write(p.ledger, p.page) as page:
                await page.put(key, body, priority)
        else:
            # A page this makes is removed again if the body fails (its lease is this
            # block's, not the request's, so that it ends first): a broken upload
            # leaves no empty page listed, as a small bad body makes none.
            page, made = await self.repo.acquire_new(p.ledger, p.page)
            try:
                with page.lease():  # no await since acquire_new: the page is open
                    await page.put(key, self.body_chunks(request), priority)
            except BaseException:
                if made:
                    await asyncio.shield(self.discard_unwritten(p.ledger, p.page))
                raise
            if made:
                await self.repo.written(p.ledger, p.page)
        return web.Response(status=204)

    async def new_page(self, ledger: bytes, page_id: bytes) -> tuple[Page, bool]:
        """The page, made if it does not exist, as :meth:`page` hands it out, and
        whether this made it: a page made here is marked unwritten until its maker drops
        the mark (:meth:`Repository.acquire_new`)."""
        page, made = await self.repo.acquire_new(ledger, page_id)
        leases = _leases.get(None)
        if leases is not None:  # no await since acquire_new returned: it is still open
            leases.hold(page)
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

    async def delete_key(self, request: web.Request, p: Params) -> web.Response:
        page = await self.page(p.ledger, p.page, create=False)
        await page.delete(p.key)
        return web.Response(status=204)

    async def clear(self, request: web.Request, p: Params) -> web.Response:
        page = await self.page(p.ledger, p.page, create=False)
        await page.clear()
        return web.Response(status=204)

    async def delete_page(self, request: web.Request, p: Params) -> web.Response:
        """Delete the page (one commit, synced; listings leave it out): 404 when it is
        not listed."""
        await self.repo.delete_page(p.ledger, p.page)
        return web.Response(status=204)

    async def delete_ledger(self, request: web.Request, p: Params) -> web.Response:
        """Delete every page of the ledger: 404 when it has no listed page."""
        await self.repo.delete_ledger(p.ledger)
        return web.Response(status=204)

    async def entries(self, request: web.Request, p: Params) -> web.Response:
        page = await self.page(p.ledger, p.page, create=False)
        view = await self.view(request, page)
        q = Query.of(request)
        limit = q.int("limit", DEFAULT_LIMIT, lo=1) or DEFAULT_LIMIT
        if limit > MAX_LIMIT:
            raise ae.BadRequest(f"limit must be at most {MAX_LIMIT}")
        token = q.text("token")
        found, nxt = await view._page(
            q.bytes("start"),
            q.bytes("end"),
            q.bytes("prefix"),
            limit,
            token_param(token) if token else None,
        )
        with_values = q.flag("values", True)
        out, n = await entries_json(view, found, with_values, self.cfg.max_listing_bytes)
        if n < len(found):  # the body is full: the next listing starts at the first left out
            nxt = found[n][0]
        return web.json_response({"entries": out, "next": b64(nxt) if nxt is not None else None})

    async def batch(self, request: web.Request, p: Params) -> web.Response:
        """The ops in one commit. Its versionstamped keys and values share one stamp:
        the answer carries it (hex) and the completed keys and values, in op order.

        A big body is parsed and decoded on a thread, and its values are handed to the
        write one by one, each dropped here as the write takes it; big batches go one at
        a time (:data:`BIG_BATCH_BYTES`; docs/performance.md, "A big batch")."""
        length = request.content_length
        one_at_a_time = length is None or length > BIG_BATCH_BYTES
        async with self.big_batches if one_at_a_time else contextlib.nullcontext():
            body = [await self.read_body(request)]
            big = len(body[0]) > OFF_LOOP_BYTES
            changes, offset = await off_loop(big, batch_body_changes, body)
            if not changes:  # nothing to write: no commit, and no page made for it
                return web.json_response({"applied": 0, "versionstamp": None, "versionstamped": []})
            applied = len(changes)
            async with self.first_write(p.ledger, p.page) as page:
                completed = await page.write(_handed_over(changes))
        stamp = None if offset is None else completed[0][offset : offset + 10]
        return web.json_response(
            {
                "applied": applied,
                "versionstamp": stamp.hex() if stamp is not None else None,
                "versionstamped": [b64(x) for x in completed],
            }
        )

    async def policy(self, request: web.Request, p: Params) -> web.Response:
        """GET: the page's merge policy and its conflicts; PUT {"policy": NAME}: set it
        (remembered)."""
        policy = None
        if request.method == "PUT":  # the body first: a bad one creates no page
            try:
                body = await self.read_body(request, CONTROL_BODY_BYTES, "policy body")
                doc = parse_json(body, "policy body")
                policy = Policy(doc["policy"])
            except (ValueError, KeyError, TypeError, ae.BadRequest):
                names = ", ".join(p.value for p in Policy)
                raise ae.BadRequest(
                    f'body must be {{"policy": NAME}} with NAME one of {names}'
                ) from None
        page = await self.page(p.ledger, p.page, create=policy is not None)
        if policy is not None:
            await page.set_policy(policy)
        return web.json_response(
            {
                "policy": page.policy.value,
                "heads": len(await page.heads()),
                "conflicts": page.conflict_count,
                "conflict": page.pending_conflict,
            }
        )

    async def heads(self, request: web.Request, p: Params) -> web.Response:
        page = await self.page(p.ledger, p.page, create=False)
        await page.flush()
        return web.json_response({"heads": [commit_json(c) for c in await page.heads()]})

    async def history(self, request: web.Request, p: Params) -> web.Response:
        page = await self.page(p.ledger, p.page, create=False)
        await page.flush()
        q = Query.of(request)
        limit = q.int("limit", 100, lo=1) or 100
        start = q.text("start")
        start_id = await page.find_commit(start) if start else None
        commits = await page.history(min(limit, MAX_LIMIT), start_id)
        return web.json_response({"commits": [commit_json(c) for c in commits]})

    async def commit(self, request: web.Request, p: Params) -> web.Response:
        page = await self.page(p.ledger, p.page, create=False)
        cid = await page.find_commit(p.commit)
        return web.json_response(commit_json(await page.load_commit(cid)))

    # -- operations (issue 19: check, health, metrics, the API description) ----------

    async def check(self, request: web.Request, p: Params) -> web.Response:
        """POST {"ledger"?, "page"?, "cloud"?, "repair"?}: check pages (all of them, a
        ledger's, or one) and answer the report; see :mod:`ledgerd.sync.check`."""
        from ledgerd.daemon.operations import run_check

        doc = await self.optional_json(request, "check body")
        return web.json_response(await run_check(self, doc))

    async def gc(self, request: web.Request, p: Params) -> web.Response:
        """POST {"ledger"?, "page"?}: prune history and collect garbage now (every page,
        a ledger's, or one); see :mod:`ledgerd.daemon.collector`."""
        from ledgerd.daemon.collector import run_gc

        doc = await self.optional_json(request, "gc body")
        return web.json_response(await run_gc(self, doc))

    async def evict(self, request: web.Request, p: Params) -> web.Response:
        """POST {"ledger", "page"}: evict the page now (see :mod:`ledgerd.store.repo.eviction`)."""
        from ledgerd.daemon.collector import evict_now

        doc = await self.optional_json(request, "evict body")
        return web.json_response(await evict_now(self, doc))

    async def du(self, request: web.Request, p: Params) -> web.Response:
        """GET ?ledger=&page= (percent-encoded): what pages hold and their files take."""
        from ledgerd.daemon.collector import disk_usage

        q = Query.of(request)
        doc = {k: b64(v) for k in ("ledger", "page") if (v := q.bytes(k)) is not None}
        return web.json_response(await disk_usage(self, doc))

    async def openapi(self, request: web.Request, p: Params) -> web.Response:
        """The OpenAPI 3 description of this API (:mod:`ledgerd.daemon.openapi`)."""
        from ledgerd.daemon.openapi import document

        return web.json_response(document())

    async def health(self, request: web.Request, p: Params) -> web.Response:
        """For probes: up, repository open, sync healthy (or why not)."""
        from ledgerd.daemon.operations import health

        doc, ok = await health(self, Query.of(request).flag("sync", False))
        return web.json_response(doc, status=200 if ok else 503)

    async def metrics_text(self, request: web.Request, p: Params) -> web.Response:
        """The metrics in Prometheus' text format (:mod:`ledgerd.daemon.metrics`)."""
        if self.metrics is None:
            raise ae.NotFound("metrics are off")
        return await self.metrics.endpoint(request)  # type: ignore[no-any-return]


Endpoint = Callable[[Api, web.Request, Params], Awaitable[web.StreamResponse]]


@dataclass(frozen=True)
class Route:
    """Methods, a path under ``/v1/`` and the endpoint serving them. In the path,
    ``{name}`` is one segment and ``{name*}`` the rest of the path (keys may hold
    ``/``)."""

    methods: frozenset[str]
    path: tuple[str, ...]
    handler: Endpoint
    counted: bool = True
    """Whether a request takes one of ``max_concurrent_requests`` (:meth:`Api.slot`)."""
    template: str = field(init=False)
    """The path as ``/v1/...`` with ``{name}`` for every parameter (the metrics' label)."""
    _literals: tuple[tuple[int, str], ...] = field(init=False, repr=False)
    _params: tuple[tuple[int, str], ...] = field(init=False, repr=False)
    _tail: str | None = field(init=False, repr=False)

    def __post_init__(self) -> None:
        tail = self.path[-1][1:-2] if self.path[-1].endswith("*}") else None
        fixed = self.path[:-1] if tail is not None else self.path
        if any(s.endswith("*}") for s in fixed):
            raise ValueError(f"only the last segment may be a {{name*}} tail: {self.path}")
        set_ = object.__setattr__  # computed once: the dataclass is frozen
        set_(self, "template", "/v1/" + "/".join(s.replace("*}", "}") for s in self.path))
        set_(self, "_literals", tuple((i, s) for i, s in enumerate(fixed) if s[:1] != "{"))
        set_(self, "_params", tuple((i, s[1:-1]) for i, s in enumerate(fixed) if s[:1] == "{"))
        set_(self, "_tail", tail)

    def fits(self, length: int) -> bool:
        """A path of ``length`` segments may match (a tail takes one or more)."""
        return length >= len(self.path) if self._tail is not None else length == len(self.path)

    def match(self, parts: list[str]) -> dict[str, str] | None:
        """The path's parameters (still percent-encoded) if ``parts`` match."""
        if not self.fits(len(parts)):
            return None
        for i, literal in self._literals:
            if parts[i] != literal:
                return None
        found = {name: parts[i] for i, name in self._params}
        if self._tail is not None:
            found[self._tail] = "/".join(parts[len(self.path) - 1 :])
        return found


class Router:
    """:data:`ROUTES` indexed by method, first segment and number of segments.

    A request's route is the first of ``routes``, in their order, whose path and
    method match; the index only leaves out the routes that cannot (another method,
    another first segment, too few or too many segments), so the answer is the one
    of trying every route in order, in a few steps rather than forty."""

    def __init__(self, routes: list[Route]) -> None:
        self.longest = max(len(r.path) for r in routes)
        self.firsts = {r.path[0] for r in routes if r.path[0][:1] != "{"}
        self.methods = methods = {m for r in routes for m in r.methods}
        self.index: dict[tuple[str, str | None, int], tuple[Route, ...]] = {}
        for method in methods:
            for first in [*self.firsts, None]:
                for length in range(1, self.longest + 2):
                    found = tuple(
                        r
                        for r in routes
                        if method in r.methods
                        and (r.path[0] == first or r.path[0][:1] == "{")
                        and r.fits(length)
                    )
                    if found:
                        self.index[method, first, length] = found

    def allowed(self, parts: list[str]) -> list[str]:
        """The methods some route serves on the path ``parts`` (after ``v1``)."""
        return sorted(m for m in self.methods if self.find(m, parts) is not None)

    def find(self, method: str, parts: list[str]) -> tuple[Route, dict[str, str]] | None:
        """The route serving ``method`` on the path ``parts`` (after ``v1``), and its
        parameters; None if there is none."""
        if not parts:
            return None
        first = parts[0] if parts[0] in self.firsts else None
        for route in self.index.get((method, first, min(len(parts), self.longest + 1)), ()):
            found = route.match(parts)
            if found is not None:
                return route, found
        return None


def _route(methods: str, path: str, handler: Endpoint, *, counted: bool = True) -> Route:
    return Route(frozenset(methods.split()), tuple(path.split("/")), handler, counted)


PAGE = "ledgers/{ledger}/pages/{page}"
ROUTES = [
    _route("GET", "status", Api.status),
    _route("GET", "session", Api.session, counted=False),
    _route("GET", "ledgers", Api.ledgers),
    _route("POST", "sync", Api.sync),
    _route("DELETE", "ledgers/{ledger}", Api.delete_ledger),
    _route("GET", "ledgers/{ledger}/pages", Api.pages),
    _route("DELETE", PAGE, Api.delete_page),
    _route("GET HEAD", PAGE + "/keys/{key*}", Api.get_key),
    _route("PUT", PAGE + "/keys/{key*}", Api.put_key),
    _route("DELETE", PAGE + "/keys/{key*}", Api.delete_key),
    _route("GET", PAGE + "/entries", Api.entries),
    _route("POST", PAGE + "/batch", Api.batch),
    _route("POST", PAGE + "/clear", Api.clear),
    _route("GET PUT", PAGE + "/policy", Api.policy),
    # Conflicts listed and resolved by hand (daemon/conflicts_api.py).
    _route("GET", "conflicts", conflicts.all_conflicts),
    _route("GET", PAGE + "/conflicts", conflicts.page_conflicts),
    _route("POST", PAGE + "/conflicts/resolve", conflicts.resolve),
    _route("GET", PAGE + "/heads", Api.heads),
    _route("GET", PAGE + "/history", Api.history),
    _route("GET", PAGE + "/commits/{commit}", Api.commit),
    # Documents (daemon/docs_api.py): literal segments before {collection} and {id}.
    _route("GET", PAGE + "/docs/_changes", docs.changes),
    _route("GET", PAGE + "/docs/{collection}", docs.list_documents),
    _route("POST", PAGE + "/docs/{collection}", docs.create_document),
    _route("POST", PAGE + "/docs/{collection}/_bulk_docs", docs.bulk_docs),
    _route("POST", PAGE + "/docs/{collection}/_find", docs.find_documents),
    _route("POST", PAGE + "/docs/{collection}/_explain", docs.explain_find),
    _route("GET", PAGE + "/docs/{collection}/_indexes", docs.list_indexes),
    _route("PUT", PAGE + "/docs/{collection}/_indexes/{name}", docs.declare_index),
    _route("DELETE", PAGE + "/docs/{collection}/_indexes/{name}", docs.drop_index),
    _route("GET", PAGE + "/docs/{collection}/_indexes/{name}/find", docs.find),
    _route("POST", PAGE + "/docs/{collection}/_indexes/{name}/rebuild", docs.rebuild_index),
    _route("GET", PAGE + "/docs/{collection}/{id}", docs.get_document),
    _route("PUT", PAGE + "/docs/{collection}/{id}", docs.replace_document),
    _route("DELETE", PAGE + "/docs/{collection}/{id}", docs.delete_document),
    _route("POST", PAGE + "/docs/{collection}/{id}/purge", docs.purge_document),
    _route("POST", PAGE + "/docs/{collection}/{id}/attachments", docs.add_attachment),
    _route("PUT", PAGE + "/docs/{collection}/{id}/attachments/{att}", docs.add_attachment),
    _route("GET HEAD", PAGE + "/docs/{collection}/{id}/attachments/{att}", docs.get_attachment),
    _route("DELETE", PAGE + "/docs/{collection}/{id}/attachments/{att}", docs.delete_attachment),
    # issue 19 (operations): check and repair, health, metrics, the API description
    _route("POST", "check", Api.check),
    # issue 17 (storage that does not grow): garbage collection, disk usage
    _route("POST", "gc", Api.gc),
    _route("GET", "du", Api.du),
    _route("POST", "evict", Api.evict),
    _route("GET", "openapi.json", Api.openapi),
    _route("GET", "metrics", Api.metrics_text, counted=False),
    _route("GET", "health", Api.health, counted=False),
]
"""The API's routes (the table in docs/http-api.md), tried in order."""

ROUTER = Router(ROUTES)

METHODS = frozenset({*hdrs.METH_ALL, *(m for r in ROUTES for m in r.methods)})
"""The methods the metrics count by name (HTTP's standard ones); any other (aiohttp's
pure-Python parser takes any token as a method) counts as ``other``, so that clients
cannot add series."""
