"""The HTTP API over the Unix socket (``/v1/...``), served by aiohttp.

This module owns the routes, how names, keys and values travel, peer-credential
checks, error responses and request draining. WebSocket sessions are in
:mod:`daemon.session`.

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
import base64
import binascii
import contextlib
import contextvars
import grp
import json
import logging
import math
import os
import pwd
import re
import socket
import struct
import time
import weakref
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import parse_qsl, unquote_to_bytes

from aiohttp import web

from ledgerd.daemon import __version__
from ledgerd.daemon import errors as ae
from ledgerd.daemon.config import Config
from ledgerd.store import Commit, Page, Policy, Priority, Repository, StoreError
from ledgerd.store import digest as dg
from ledgerd.store.btree import Entry
from ledgerd.store.view import KEY_LIMIT, View

log = logging.getLogger(__name__)

VERSION = __version__
INLINE_VALUE_LIMIT = 1024 * 1024
"""``entries`` responses carry values up to this size; larger ones carry null and a size."""
DEFAULT_LIMIT, MAX_LIMIT = 1000, 10_000
ENTRY_GROUP = 128
"""Entries of a listing whose values are read at once (at most 128 x 64 KiB)."""
STREAM_CHUNK = 256 * 1024

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


@dataclass
class DaemonState:
    started: float = field(default_factory=time.time)
    shutting_down: bool = False
    inflight: int = 0
    idle: asyncio.Event = field(default_factory=asyncio.Event)
    extra_status: dict[str, Any] = field(default_factory=dict)


def b64(data: bytes) -> str:
    return base64.b64encode(data).decode()


def unb64(text: object, what: str, index: int | None = None) -> bytes:
    """Decode base64 from JSON; ``what`` names the field in the error (with
    ``index``, as ``ops[index].what``: formatted only when there is an error)."""
    try:
        if type(text) is not str:
            raise TypeError
        return binascii.a2b_base64(text, strict_mode=True)
    except (binascii.Error, ValueError, TypeError):
        name = what if index is None else f"ops[{index}].{what}"
        problem = "is not valid base64" if type(text) is str else "must be a base64 string"
        raise ae.BadRequest(f"{name} {problem}") from None


Change = tuple[bytes, bytes | None, Priority]


def batch_changes(ops: list[Any]) -> list[Change]:
    """The changes of a batch's ``ops``: ``{"op": "put", "key", "value", "priority"?}``
    or ``{"op": "delete", "key"}``, keys and values in base64.

    Well-formed ops take a lean loop; the first sign of trouble hands the whole
    list to the checking loop, whose error names the op and the field (and which
    decides alone whether the ops are good).
    """
    a2b, eager = binascii.a2b_base64, Priority.EAGER
    changes: list[Change] = []
    try:
        for op in ops:
            kind = op["op"]
            if kind == "put":
                key, value = a2b(op["key"], strict_mode=True), a2b(op["value"], strict_mode=True)
                p = op.get("priority")
                changes.append((key, value, eager if p is None else parse_priority(p)))
            elif kind == "delete":
                changes.append((a2b(op["key"], strict_mode=True), None, eager))
            else:
                raise ValueError(kind)
    except (KeyError, TypeError, ValueError, AttributeError, binascii.Error, ae.BadRequest):
        return _checked_batch_changes(ops)
    return changes


def _checked_batch_changes(ops: list[Any]) -> list[Change]:
    changes: list[Change] = []
    for i, op in enumerate(ops):
        if not isinstance(op, dict):
            raise ae.BadRequest(f"ops[{i}] must be an object")
        kind = op.get("op")
        key = unb64(op.get("key"), "key", i)
        if kind == "put":
            value = unb64(op.get("value"), "value", i)
            p = op.get("priority")
            prio = Priority.EAGER if p is None else parse_priority(p if isinstance(p, str) else "?")
            changes.append((key, value, prio))
        elif kind == "delete":
            changes.append((key, None, Priority.EAGER))
        else:
            raise ae.BadRequest(f"ops[{i}].op must be 'put' or 'delete'")
    return changes


def parse_json(data: bytes | str, what: str) -> Any:
    """Decode JSON from a client: any failure is a 400 naming ``what``. Besides syntax
    errors, that covers what ``json`` raises on hostile input: nesting deep enough to
    exhaust the recursion limit, integers past Python's int-string conversion limit
    (both ValueError or RecursionError, not JSONDecodeError), and bodies that are not
    UTF-8."""
    try:
        text = data.decode() if isinstance(data, bytes) else data
        return json.loads(text)
    except RecursionError:
        raise ae.BadRequest(f"{what} is nested too deeply") from None
    except ValueError as e:  # JSONDecodeError, UnicodeDecodeError, int-string limit
        raise ae.BadRequest(f"{what} is not valid JSON: {e}") from None


def text_or_none(data: bytes) -> str | None:
    try:
        return data.decode()
    except UnicodeDecodeError:
        return None


def commit_json(c: Commit) -> dict[str, Any]:
    return {
        "id": c.id.hex(),
        "parents": [p.hex() for p in c.parents],
        "timestamp": c.timestamp,
        "generation": c.generation,
        "merge": c.is_merge,
    }


_leases: contextvars.ContextVar[contextlib.ExitStack] = contextvars.ContextVar("leases")
"""The page leases of the request (or session op) being served."""


@contextlib.contextmanager
def page_leases() -> Iterator[None]:
    """Pages that :meth:`Api.page` hands out inside the block stay leased (open)
    until it ends: one block per request, and one per op of a session (a session's
    transactions and watchers keep their pages open by themselves)."""
    with contextlib.ExitStack() as stack:
        token = _leases.set(stack)
        try:
            yield
        finally:
            _leases.reset(token)


_peer_cache: weakref.WeakKeyDictionary[asyncio.BaseTransport, tuple[int, int] | None] = (
    weakref.WeakKeyDictionary()
)


def peer_credentials(request: web.Request) -> tuple[int, int] | None:
    """(uid, gid) of the process at the other end of the Unix socket.

    The kernel fixes them when the peer connects, so they are asked once per
    connection, not once per request.
    """
    transport = request.transport
    if transport is None:
        return None
    if transport in _peer_cache:
        return _peer_cache[transport]
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

    def __init__(self, raw: str) -> None:
        self.params = {
            k: v.encode("latin-1")
            for k, v in parse_qsl(raw, keep_blank_values=True, encoding="latin-1")
        }

    def bytes(self, name: str) -> bytes | None:
        return self.params.get(name)

    def text(self, name: str) -> str | None:
        v = self.params.get(name)
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
        try:
            n = int(v)
        except ValueError:
            raise ae.BadRequest(f"query parameter {name} must be an integer") from None
        if n < lo:
            raise ae.BadRequest(f"query parameter {name} must be at least {lo}")
        return n

    def seconds(self, name: str, default: float) -> float:
        """A positive, finite number of seconds (``default`` when absent)."""
        v = self.text(name)
        if v is None or v == "":
            return default
        try:
            n = float(v)
        except ValueError:
            n = math.nan
        if not math.isfinite(n) or n <= 0:
            raise ae.BadRequest(f"query parameter {name} must be a positive number of seconds")
        return n

    def flag(self, name: str, default: bool) -> bool:
        v = self.text(name)
        if v is None:
            return default
        return v.lower() not in ("0", "false", "no", "")


def parse_priority(text: str | None) -> Priority:
    if text is None or text == "" or text.lower() == "eager":
        return Priority.EAGER
    if text.lower() == "lazy":
        return Priority.LAZY
    raise ae.BadRequest(f"priority must be 'eager' or 'lazy', not {text!r}")


def priority_name(p: Priority) -> str:
    return "lazy" if p == Priority.LAZY else "eager"


_RANGE = re.compile(r"bytes=([0-9]*)-([0-9]*)", re.ASCII)


def _position(digits: str) -> int:
    """A byte position; one past any value's size when it is too long to be a size
    (and too long for ``int()``'s digit limit)."""
    return int(digits) if len(digits) <= 18 else 2**63


def parse_range(header: str, size: int) -> tuple[int, int]:
    """``bytes=a-b`` / ``bytes=a-`` / ``bytes=-n`` -> (offset, length), as RFC 9110
    14.1.2: a range must select at least one byte of the value (``bytes=-0``, a start
    at or past the end, any range of an empty value: 416); a malformed one is 400."""
    m = _RANGE.fullmatch(header.strip())
    if m is None or m.group(1) == m.group(2) == "":
        raise ae.BadRequest(f"malformed Range header {header[:100]!r}: one 'bytes=' range")
    first, last = m.group(1), m.group(2)
    if first == "":  # a suffix: the last n bytes
        n = _position(last)
        if n == 0 or size == 0:
            raise ae.RangeNotSatisfiable(
                f"range {header[:100]} selects no byte of the {size}-byte value",
                {"Content-Range": f"bytes */{size}"},
            )
        return size - min(n, size), min(n, size)
    a = _position(first)
    if last and _position(last) < a:
        raise ae.BadRequest(f"malformed Range header {header[:100]!r}: the end is before the start")
    if a >= size:
        raise ae.RangeNotSatisfiable(
            f"range {header[:100]} is outside the {size}-byte value",
            {"Content-Range": f"bytes */{size}"},
        )
    b = min(_position(last), size - 1) if last else size - 1
    return a, b - a + 1


class Api:
    def __init__(self, repo: Repository, cfg: Config, state: DaemonState) -> None:
        self.repo = repo
        self.cfg = cfg
        self.state = state
        self.allowed = cfg.allowed_uids()
        self.group = cfg.socket_gid()
        self._peers: dict[int, bool] = {}
        self.sessions: Any = None  # daemon.session.Sessions, set by the server
        self.engine: Any = None  # sync.engine.SyncEngine when cloud sync is on

    def app(self) -> web.Application:
        app = web.Application(
            middlewares=[self.middleware], client_max_size=self.cfg.max_batch_bytes
        )
        # Every path (with any byte, newlines included: not ``.*``) goes to self.route,
        # which reads the raw, still percent-encoded path.
        app.router.add_route("*", r"/{tail:[\s\S]*}", self.route)
        return app

    # -- plumbing ----------------------------------------------------------------

    @web.middleware
    async def middleware(self, request: web.Request, handler: Handler) -> web.StreamResponse:
        try:
            creds = peer_credentials(request)
            if creds is not None and not self.peer_allowed(*creds):
                log.warning("refused a request from uid %d", creds[0])
                raise ae.PeerRefused(f"uid {creds[0]} is not allowed to use this ledgerd")
            if self.state.shutting_down:
                raise ae.ShuttingDown()
            self.state.inflight += 1
            self.state.idle.clear()
            try:
                with page_leases():  # pages this request uses stay open until it ends
                    return await handler(request)
            finally:
                self.state.inflight -= 1
                if self.state.inflight == 0:
                    self.state.idle.set()
        except ae.ApiError as e:
            return self.error(e)
        except StoreError as e:
            err = ae.from_store(e)
            if err.status >= 500:
                log.error("%s %s failed: %s", request.method, request.path, e)
            return self.error(err)
        except web.HTTPRequestEntityTooLarge:
            return self.error(
                ae.TooLarge(f"request body is over the {self.cfg.max_batch_bytes}-byte limit")
            )
        except web.HTTPException as e:  # aiohttp's own (the router's, a body reader's)
            err = ae.NotFound(e.reason) if e.status in (404, 405) else ae.BadRequest(e.reason)
            if e.status >= 500:
                err = ae.ApiError(e.reason)
            err.status = e.status
            return self.error(err)
        except (ConnectionResetError, asyncio.CancelledError):
            raise
        except Exception as e:
            if (known := ae.from_exception(e)) is not None:
                log.error("%s %s failed: %s", request.method, request.path, known)
                return self.error(known)
            log.exception("internal error serving %s %s", request.method, request.path)
            return self.error(ae.ApiError(f"internal error: {type(e).__name__}"))

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

    @staticmethod
    def error(e: ae.ApiError) -> web.Response:
        resp = web.json_response(e.body(), status=e.status, headers=e.headers)
        if isinstance(e, ae.RequestTimeout):  # the rest of its body is not worth waiting for
            resp.force_close()
        return resp

    async def route(self, request: web.Request) -> web.StreamResponse:
        raw_path = request.raw_path.split("?", 1)[0]
        parts = raw_path.split("/")[1:]
        m = request.method
        if not parts or parts[0] != "v1":
            raise ae.NotFound(f"no such endpoint {raw_path} (the API lives under /v1/)")
        p = parts[1:]
        if p == ["status"] and m == "GET":
            return await self.status(request)
        if p == ["session"] and m == "GET":
            return await self.sessions.handle(request)  # type: ignore[no-any-return]
        if p == ["ledgers"] and m == "GET":
            return await self.ledgers(request)
        if p == ["sync"] and m == "POST":
            return await self.sync(request)
        if len(p) >= 2 and p[0] == "ledgers":
            ledger = self.name(p[1], "ledger name")
            if p[2:] == ["pages"] and m == "GET":
                return await self.pages(ledger)
            if len(p) >= 4 and p[2] == "pages":
                page_id = self.name(p[3], "page id")
                rest = p[4:]
                if len(rest) >= 2 and rest[0] == "keys":
                    key = unquote_to_bytes("/".join(rest[1:]))
                    if len(key) > KEY_LIMIT:
                        raise ae.UriTooLong(
                            f"key of {len(key)} bytes is over the {KEY_LIMIT}-byte limit"
                        )
                    if m in ("GET", "HEAD"):
                        return await self.get_key(request, ledger, page_id, key)
                    if m == "PUT":
                        return await self.put_key(request, ledger, page_id, key)
                    if m == "DELETE":
                        return await self.delete_key(ledger, page_id, key)
                if rest == ["entries"] and m == "GET":
                    return await self.entries(request, ledger, page_id)
                if rest == ["batch"] and m == "POST":
                    return await self.batch(request, ledger, page_id)
                if rest == ["clear"] and m == "POST":
                    return await self.clear(ledger, page_id)
                if rest == ["policy"] and m in ("GET", "PUT"):
                    return await self.policy(request, ledger, page_id)
                if rest == ["heads"] and m == "GET":
                    return await self.heads(ledger, page_id)
                if rest == ["history"] and m == "GET":
                    return await self.history(request, ledger, page_id)
                if len(rest) == 2 and rest[0] == "commits" and m == "GET":
                    return await self.commit(ledger, page_id, rest[1])
        raise ae.NotFound(f"no such endpoint: {m} {raw_path}")

    @classmethod
    def name(cls, segment: str, what: str) -> bytes:
        return cls.name_bytes(unquote_to_bytes(segment), what)

    @staticmethod
    def name_bytes(raw: bytes, what: str) -> bytes:
        if not raw:
            raise ae.BadRequest(f"{what} must not be empty")
        if len(raw) > 128:
            raise ae.TooLarge(f"{what} of {len(raw)} bytes is over the 128-byte limit")
        return raw

    async def page(self, ledger: bytes, page_id: bytes, *, create: bool) -> Page:
        if not create and not self.repo.page_exists(ledger, page_id):
            if not self.repo.ledger_exists(ledger):
                raise ae.LedgerNotFound(f"no ledger {ledger!r}")
            raise ae.PageNotFound(f"no page {page_id!r} in ledger {ledger!r}")
        page = await self.repo.open_page(ledger, page_id)
        leases = _leases.get(None)
        if leases is not None:  # no await since open_page returned: it is still open
            leases.enter_context(page.lease())
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

    async def read_body(self, request: web.Request) -> bytes:
        """The whole body (at most ``max_batch_bytes``), read as :meth:`body_chunks`."""
        body = bytearray()
        async for chunk in self.body_chunks(request):
            body += chunk
            if len(body) > self.cfg.max_batch_bytes:
                raise ae.TooLarge(f"request body is over the {self.cfg.max_batch_bytes}-byte limit")
        return bytes(body)

    async def view(self, request: web.Request, page: Page) -> View:
        at = Query(request.query_string).text("at")
        if not at:
            return page
        try:
            cid = bytes.fromhex(at)
        except ValueError:
            raise ae.BadRequest("at must be a commit id in hex") from None
        return await page.snapshot(cid)

    # -- endpoints -----------------------------------------------------------------

    async def status(self, request: web.Request) -> web.Response:
        pages = []
        for pg in self.repo.open_pages():
            if pg.closed:  # closed as idle while this listed the others
                continue
            with pg.lease(use=False):
                pages.append(
                    {
                        "ledger": b64(pg.ledger),
                        "page": b64(pg.id),
                        "ledger_text": text_or_none(pg.ledger),
                        "page_text": text_or_none(pg.id),
                        "heads": len(await pg.heads()),
                        "policy": pg.policy.value,
                        "conflict": pg.pending_conflict,
                        **(await self.engine.page_status(pg) if self.engine else {}),
                    }
                )
        return web.json_response(
            {
                "version": VERSION,
                "pid": os.getpid(),
                "device_id": self.repo.device_id.hex(),
                "data_dir": str(self.repo.root),
                "uptime_s": round(time.time() - self.state.started, 3),
                "cloud": self.cfg.cloud or None,
                "sync_error": self.engine.last_error if self.engine else None,
                "open_pages": pages,
                **self.state.extra_status,
            }
        )

    async def sync(self, request: web.Request) -> web.Response:
        """Upload everything pending, fetch everything visible, merge, until a round is quiet."""
        q = Query(request.query_string)
        ledger, page = q.bytes("ledger"), q.bytes("page")
        timeout = q.seconds("timeout", 60.0)
        if page is not None and ledger is None:
            raise ae.BadRequest("page needs ledger")
        if self.engine is None:
            raise ae.Conflict("cloud sync is off: start ledgerd with --cloud URL")
        from ledgerd.sync.errors import SyncError

        try:
            stats = await self.engine.sync(ledger or None, page or None, timeout=timeout)
        except TimeoutError:
            raise ae.Unavailable(f"sync did not finish within {timeout:g}s") from None
        except SyncError as e:
            raise ae.Unavailable(f"sync failed: {e}") from None
        errors = [
            {"ledger": b64(led), "page": b64(pid), "error": st.last_error}
            for (led, pid), st in self.engine.states.items()
            if st.last_error
        ]
        if errors:
            err = ae.Unavailable(f"sync incomplete: {errors[0]['error']}")
            return web.json_response({**err.body(), "pages": errors}, status=err.status)
        return web.json_response(
            {
                "rounds": stats.rounds,
                "uploaded_packs": stats.uploaded_packs,
                "downloaded_packs": stats.downloaded_packs,
            }
        )

    async def ledgers(self, request: web.Request) -> web.Response:
        names = await self.repo.ledgers()
        return web.json_response(
            {"ledgers": [{"name": b64(n), "text": text_or_none(n)} for n in names]}
        )

    async def pages(self, ledger: bytes) -> web.Response:
        if not self.repo.ledger_exists(ledger):
            raise ae.LedgerNotFound(f"no ledger {ledger!r}")
        ids = await self.repo.ledger(ledger).pages()
        return web.json_response({"pages": [{"id": b64(i), "text": text_or_none(i)} for i in ids]})

    async def get_key(
        self, request: web.Request, ledger: bytes, page_id: bytes, key: bytes
    ) -> web.StreamResponse:
        page = await self.page(ledger, page_id, create=False)
        view = await self.view(request, page)
        entry = await view.get_entry(key)
        if entry is None:
            raise ae.KeyNotFound(f"key {key[:64]!r} is not in the page")
        headers = {
            "Accept-Ranges": "bytes",
            "ETag": '"' + entry.value.hex() + '"',
            "Ledger-Priority": priority_name(entry.priority),
        }
        plain = not request.query_string and "Range" not in request.headers
        if plain and not dg.is_index(entry.value):  # one piece: answer from memory
            data = await view.objects.get_piece(entry.value)
            if request.method == "HEAD":
                headers["Content-Length"] = str(len(data))
                return web.Response(status=200, headers=headers)
            return web.Response(body=data, headers=headers, content_type="application/octet-stream")
        size = await view.objects.size(entry.value)
        q = Query(request.query_string)
        offset, length, status = 0, size, 200
        if "Range" in request.headers:
            offset, length = parse_range(request.headers["Range"], size)
            status = 206
        elif q.text("offset") is not None or q.text("length") is not None:
            offset = q.int("offset", 0) or 0
            if offset > size:
                raise ae.RangeNotSatisfiable(f"offset {offset} is past the {size}-byte value")
            want = q.int("length", size - offset)
            length = min(size - offset, size if want is None else want)
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
            await resp.write(first)
            async for chunk in chunks:
                await resp.write(chunk)
            await resp.write_eof()
        except ConnectionError:  # the client went away (`ledgerctl get | head`): normal
            log.debug("the client of %s %s left before the end", request.method, request.path)
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

    async def put_key(
        self, request: web.Request, ledger: bytes, page_id: bytes, key: bytes
    ) -> web.Response:
        priority = parse_priority(Query(request.query_string).text("priority"))
        page = await self.page(ledger, page_id, create=True)
        length = request.content_length
        if length is not None and length <= 256 * 1024:
            body = await self.read_body(request)
            if len(body) != length:
                raise ae.BadRequest("request body is shorter than its Content-Length")
            await page.put(key, body, priority)
        else:
            await page.put(key, self.body_chunks(request), priority)
        return web.Response(status=204)

    async def delete_key(self, ledger: bytes, page_id: bytes, key: bytes) -> web.Response:
        page = await self.page(ledger, page_id, create=False)
        await page.delete(key)
        return web.Response(status=204)

    async def clear(self, ledger: bytes, page_id: bytes) -> web.Response:
        page = await self.page(ledger, page_id, create=False)
        await page.clear()
        return web.Response(status=204)

    async def entries(self, request: web.Request, ledger: bytes, page_id: bytes) -> web.Response:
        page = await self.page(ledger, page_id, create=False)
        view = await self.view(request, page)
        q = Query(request.query_string)
        limit = q.int("limit", DEFAULT_LIMIT, lo=1) or DEFAULT_LIMIT
        if limit > MAX_LIMIT:
            raise ae.BadRequest(f"limit must be at most {MAX_LIMIT}")
        token = q.text("token")
        found, nxt = await view._page(
            q.bytes("start"),
            q.bytes("end"),
            q.bytes("prefix"),
            limit,
            unb64(token, "token") if token else None,
        )
        with_values = q.flag("values", True)
        out, n = await entries_json(view, found, with_values, self.cfg.max_listing_bytes)
        if n < len(found):  # the body is full: the next listing starts at the first left out
            nxt = found[n].key
        return web.json_response({"entries": out, "next": b64(nxt) if nxt is not None else None})

    async def batch(self, request: web.Request, ledger: bytes, page_id: bytes) -> web.Response:
        doc = parse_json(await self.read_body(request), "batch body")
        ops = doc.get("ops") if isinstance(doc, dict) else None
        if not isinstance(ops, list):
            raise ae.BadRequest('batch body must be {"ops": [...]}')
        changes = batch_changes(ops)
        page = await self.page(ledger, page_id, create=True)
        await page.write(changes)
        return web.json_response({"applied": len(changes)})

    async def policy(self, request: web.Request, ledger: bytes, page_id: bytes) -> web.Response:
        """GET: the page's merge policy; PUT {"policy": NAME}: set it (remembered)."""
        page = await self.page(ledger, page_id, create=request.method == "PUT")
        if request.method == "PUT":
            try:
                doc = parse_json(await self.read_body(request), "policy body")
                policy = Policy(doc["policy"])
            except (ValueError, KeyError, TypeError, ae.BadRequest):
                names = ", ".join(p.value for p in Policy)
                raise ae.BadRequest(
                    f'body must be {{"policy": NAME}} with NAME one of {names}'
                ) from None
            await page.set_policy(policy)
        return web.json_response(
            {
                "policy": page.policy.value,
                "heads": len(await page.heads()),
                "conflict": page.pending_conflict,
            }
        )

    async def heads(self, ledger: bytes, page_id: bytes) -> web.Response:
        page = await self.page(ledger, page_id, create=False)
        await page.flush()
        return web.json_response({"heads": [commit_json(c) for c in await page.heads()]})

    async def history(self, request: web.Request, ledger: bytes, page_id: bytes) -> web.Response:
        page = await self.page(ledger, page_id, create=False)
        await page.flush()
        q = Query(request.query_string)
        limit = q.int("limit", 100, lo=1) or 100
        start = q.text("start")
        try:
            start_id = bytes.fromhex(start) if start else None
        except ValueError:
            raise ae.BadRequest("start must be a commit id in hex") from None
        commits = await page.history(min(limit, MAX_LIMIT), start_id)
        return web.json_response({"commits": [commit_json(c) for c in commits]})

    async def commit(self, ledger: bytes, page_id: bytes, cid_hex: str) -> web.Response:
        page = await self.page(ledger, page_id, create=False)
        try:
            cid = bytes.fromhex(cid_hex)
        except ValueError:
            raise ae.BadRequest("commit id must be hex") from None
        return web.json_response(commit_json(await page.load_commit(cid)))


ENTRY_OVERHEAD = 64
"""Bytes counted per entry of a listing besides its base64 key and value (names, quotes,
priority, size)."""


def _b64_len(n: int) -> int:
    return 4 * -(-n // 3)


async def entries_json(
    view: View, found: list[Entry], with_values: bool, budget: int
) -> tuple[list[dict[str, Any]], int]:
    """JSON objects for entries (key, priority, size, and the value when small enough),
    and how many of ``found`` they are: they stop before the one that would take
    the JSON past ``budget`` bytes (but hold at least one entry), so that a listing
    of large values never builds an unbounded body. Values are read a group at a
    time, a group's single-piece values in one query."""
    out: list[dict[str, Any]] = []
    used = 0
    for g in range(0, len(found), ENTRY_GROUP):
        group = found[g : g + ENTRY_GROUP]
        small = [e.value for e in group if not dg.is_index(e.value)]
        values = await view.objects.read_many(small) if with_values else {}
        for i, e in enumerate(group, g):
            item: dict[str, Any] = {"key": b64(e.key), "priority": priority_name(e.priority)}
            cost = len(item["key"]) + ENTRY_OVERHEAD
            if e.value in values:
                item["size"] = len(values[e.value])
                cost += _b64_len(item["size"])
            else:
                item["size"] = size = await view.objects.size(e.value)
                if with_values:
                    inline = size <= INLINE_VALUE_LIMIT
                    cost += _b64_len(size) if inline else 0
                    if out and used + cost > budget:  # don't read what will not be sent
                        return out, i
                    item["value"] = b64(await view.objects.read_all(e.value)) if inline else None
            if out and used + cost > budget:
                return out, i
            if e.value in values:
                item["value"] = b64(values[e.value])
            used += cost
            out.append(item)
    return out, len(found)
