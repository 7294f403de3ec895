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
import os
import pwd
import socket
import struct
import time
import weakref
from collections.abc import Awaitable, Callable, Iterator
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
from ledgerd.store.view import View

log = logging.getLogger(__name__)

VERSION = __version__
INLINE_VALUE_LIMIT = 1024 * 1024
"""``entries`` responses carry values up to this size; larger ones carry null and a size."""
DEFAULT_LIMIT, MAX_LIMIT = 1000, 10_000
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


def parse_range(header: str, size: int) -> tuple[int, int]:
    """``bytes=a-b`` / ``bytes=a-`` / ``bytes=-n`` -> (offset, length)."""
    unit, _, spec = header.partition("=")
    if unit.strip() != "bytes" or "," in spec:
        raise ae.BadRequest("only a single 'bytes=' range is supported")
    first, _, last = spec.strip().partition("-")
    try:
        if first == "":
            n = int(last)
            return max(size - n, 0), min(n, size)
        a = int(first)
        b = int(last) if last else size - 1
    except ValueError:
        raise ae.BadRequest(f"malformed Range header {header!r}") from None
    if a >= size or b < a:
        raise ae.RangeNotSatisfiable(f"range {header} is outside the {size}-byte value")
    return a, min(b, size - 1) - a + 1


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
        app.router.add_route("*", "/{tail:.*}", self.route)
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
            return self.error(ae.from_store(e))
        except web.HTTPRequestEntityTooLarge:
            return self.error(
                ae.TooLarge(f"request body is over the {self.cfg.max_batch_bytes}-byte limit")
            )
        except web.HTTPException as e:
            err = ae.ApiError(e.reason)
            err.status, err.code = e.status, "http_" + str(e.status)
            return self.error(err)
        except (ConnectionResetError, asyncio.CancelledError):
            raise
        except Exception as e:
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
        return web.json_response(e.body(), status=e.status)

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
                "sync": self.engine.status() if self.engine else None,
                "open_pages": pages,
                **self.state.extra_status,
            }
        )

    async def sync(self, request: web.Request) -> web.Response:
        """Upload everything pending, fetch everything visible, merge, until a round is quiet."""
        if self.engine is None:
            raise ae.Conflict("cloud sync is off: start ledgerd with --cloud URL")
        q = Query(request.query_string)
        ledger, page = q.bytes("ledger"), q.bytes("page")
        timeout = float(q.text("timeout") or 60)
        if page is not None and ledger is None:
            raise ae.BadRequest("page needs ledger")
        from ledgerd.sync.errors import SyncError

        try:
            stats = await self.engine.sync(ledger or None, page or None, timeout=timeout)
        except SyncError as e:  # the bucket, a listing, or the timeout (with the last error)
            raise ae.Unavailable(f"sync failed: {e}") from None
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
        chunks = await view.objects.read(entry.value, offset, length)
        await resp.prepare(request)
        async for chunk in chunks:
            await resp.write(chunk)
        await resp.write_eof()
        return resp

    async def put_key(
        self, request: web.Request, ledger: bytes, page_id: bytes, key: bytes
    ) -> web.Response:
        priority = parse_priority(Query(request.query_string).text("priority"))
        page = await self.page(ledger, page_id, create=True)
        length = request.content_length
        if length is not None and length <= 256 * 1024:
            body = await request.read()
            if len(body) != length:
                raise ae.BadRequest("request body is shorter than its Content-Length")
            await page.put(key, body, priority)
        else:
            await page.put(key, request.content.iter_chunked(STREAM_CHUNK), priority)
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
        out = await entries_json(view, found, with_values)
        return web.json_response({"entries": out, "next": b64(nxt) if nxt is not None else None})

    async def batch(self, request: web.Request, ledger: bytes, page_id: bytes) -> web.Response:
        try:
            doc = await request.json()
        except (json.JSONDecodeError, UnicodeDecodeError) as e:
            raise ae.BadRequest(f"batch body is not valid JSON: {e}") from None
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
                doc = await request.json()
                policy = Policy(doc["policy"])
            except (ValueError, KeyError, TypeError, json.JSONDecodeError):
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


async def entries_json(view: View, found: list[Entry], with_values: bool) -> list[dict[str, Any]]:
    """JSON objects for entries: key, priority, size, and the value when small enough."""
    small = [e.value for e in found if not dg.is_index(e.value)]
    values = await view.objects.read_many(small) if with_values else {}
    out = []
    for e in found:
        item: dict[str, Any] = {"key": b64(e.key), "priority": priority_name(e.priority)}
        if e.value in values:
            item["value"] = b64(values[e.value])
            item["size"] = len(values[e.value])
        else:
            size = await view.objects.size(e.value)
            item["size"] = size
            if with_values:
                item["value"] = (
                    b64(await view.objects.read_all(e.value))
                    if size <= INLINE_VALUE_LIMIT
                    else None
                )
        out.append(item)
    return out
