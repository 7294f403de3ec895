"""The HTTP endpoints of keys: ``/v1/ledgers/{L}/pages/{P}/keys/...``, ``entries``,
``batch`` and ``clear``, and ``GET /v1/session`` (where transactions and watchers live).

This module owns how a key's value travels (a raw body, streamed both ways, ranged
reads), listings of entries, and batches (their bodies decoded by :mod:`daemon.codec`).
A session's messages are :mod:`daemon.session`'s; the routes' plumbing is
:mod:`daemon.api`'s.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Iterator

from aiohttp import web

from ledgerd.daemon import errors as ae
from ledgerd.daemon.api import DEFAULT_LIMIT, MAX_LIMIT, Api, Params, stream_body
from ledgerd.daemon.codec import (
    Change,
    b64,
    batch_body_changes,
    entries_json,
    parse_priority,
    priority_name,
    token_param,
)
from ledgerd.daemon.query import Query, requested_range
from ledgerd.store import OFF_LOOP_BYTES, Page, View, collector_paused, off_loop
from ledgerd.store.errors import named
from ledgerd.store.pieces import digest as dg

BIG_BATCH_BYTES = 4 * 1024 * 1024
"""A batch whose body is over this, or of a length not given (chunked), is big: big
batches are read and written one at a time (:attr:`Api.big_batches`), so that what
batches hold in memory stays about twice ``max_batch_bytes`` (docs/performance.md)."""

YOUNG_EVERY_S = 0.05
"""How often the young objects are collected during a big batch, while the collector
is otherwise paused (:func:`store.page.view.collector_paused`)."""

SMALL_VALUE = 256 * 1024
"""A value whose body is at most this (and ``max_batch_bytes``) is read whole before it
is written; a larger one is streamed into the page."""


async def session(api: Api, request: web.Request, p: Params) -> web.StreamResponse:
    return await api.sessions.handle(request)  # type: ignore[no-any-return]


async def view(request: web.Request, page: Page) -> View:
    """The page, or its state at the commit ``?at=``."""
    at = Query.of(request).text("at")
    if not at:
        return page
    return await page.snapshot(await page.find_commit(at))


async def get_key(api: Api, request: web.Request, p: Params) -> web.StreamResponse:
    page, key = await api.page(p.ledger, p.page, create=False), p.key
    plain = not request.rel_url.raw_query_string and "Range" not in request.headers
    found = page if plain else await view(request, page)
    entry = await found.get_entry(key)
    if entry is None:
        raise ae.KeyNotFound(f"key {named(key[:64])} is not in the page")
    headers = {
        "Accept-Ranges": "bytes",
        "ETag": '"' + entry.value.hex() + '"',
        "Ledger-Priority": priority_name(entry.priority),
    }
    if plain and not dg.is_index(entry.value):  # one piece: answer from memory
        data = await found.objects.get_piece(entry.value)
        if request.method == "HEAD":
            headers["Content-Length"] = str(len(data))
            return web.Response(status=200, headers=headers)
        return web.Response(body=data, headers=headers, content_type="application/octet-stream")
    size = await found.objects.size(entry.value)
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
    await stream_body(
        api, request, resp, aiter(await found.objects.read(entry.value, offset, length))
    )
    return resp


async def put_key(api: Api, request: web.Request, p: Params) -> web.Response:
    priority, key = parse_priority(Query.of(request).text("priority")), p.key
    length = request.content_length
    # A small value is read whole (before the page is made: a body that fails makes
    # none); past max_batch_bytes (a bound on what a request holds in memory) it is
    # streamed like a large one, not refused.
    if length is not None and length <= min(SMALL_VALUE, api.cfg.max_batch_bytes):
        body = await api.read_body(request)
        if len(body) != length:
            raise ae.BadRequest("request body is shorter than its Content-Length")
        async with api.first_write(p.ledger, p.page) as page:
            await page.put(key, body, priority)
        return web.Response(status=204)
    # A page this makes is removed again if the body fails (its lease is this block's,
    # not the request's, so that it ends first): a broken upload leaves no empty page
    # listed, as a small bad body makes none.
    page, made = await api.repo.acquire_new(p.ledger, p.page)
    try:
        with page.lease():  # no await since acquire_new: the page is open
            await page.put(key, api.body_chunks(request), priority)
    except BaseException:
        if made:
            await asyncio.shield(api.discard_unwritten(p.ledger, p.page))
        raise
    if made:
        await api.repo.written(p.ledger, p.page)
    return web.Response(status=204)


async def delete_key(api: Api, request: web.Request, p: Params) -> web.Response:
    page = await api.page(p.ledger, p.page, create=False)
    await page.delete(p.key)
    return web.Response(status=204)


async def clear(api: Api, request: web.Request, p: Params) -> web.Response:
    page = await api.page(p.ledger, p.page, create=False)
    await page.clear()
    return web.Response(status=204)


async def entries(api: Api, request: web.Request, p: Params) -> web.Response:
    page = await api.page(p.ledger, p.page, create=False)
    found = await view(request, page)
    q = Query.of(request)
    limit = q.int("limit", DEFAULT_LIMIT, lo=1) or DEFAULT_LIMIT
    if limit > MAX_LIMIT:
        raise ae.BadRequest(f"limit must be at most {MAX_LIMIT}")
    token = q.text("token")
    listed, nxt = await found._page(
        q.bytes("start"),
        q.bytes("end"),
        q.bytes("prefix"),
        limit,
        token_param(token) if token else None,
    )
    with_values = q.flag("values", True)
    out, n = await entries_json(found, listed, with_values, api.cfg.max_listing_bytes)
    if n < len(listed):  # the body is full: the next listing starts at the first left out
        nxt = listed[n][0]
    return web.json_response({"entries": out, "next": b64(nxt) if nxt is not None else None})


def _handed_over(changes: list[Change]) -> Iterator[Change]:
    """``changes`` in order, each dropped from the list as it is taken (the list ends
    empty): what the write has taken is not held here too."""
    changes.reverse()
    while changes:
        yield changes.pop()


async def batch(api: Api, request: web.Request, p: Params) -> web.Response:
    """The ops in one commit. Its versionstamped keys and values share one stamp:
    the answer carries it (hex) and the completed keys and values, in op order.

    A big body is parsed and decoded on a thread, and its values are handed to the
    write one by one, each dropped here as the write takes it; big batches go one at
    a time (:data:`BIG_BATCH_BYTES`; docs/performance.md, "A big batch")."""
    length = request.content_length
    one_at_a_time = length is None or length > BIG_BATCH_BYTES
    async with api.big_batches if one_at_a_time else contextlib.nullcontext():
        body = [await api.read_body(request)]
        big = len(body[0]) > OFF_LOOP_BYTES
        # A batch of 250,000 small values holds a million tracked objects: a full
        # collection of them held the GIL for most of a second. Big batches go one at
        # a time (Api.big_batches); others' cycles are collected when it ends.
        paused = collector_paused(YOUNG_EVERY_S) if one_at_a_time else contextlib.nullcontext()
        with paused:
            changes, offset = await off_loop(big, batch_body_changes, body)
            if not changes:  # nothing to write: no commit, and no page made for it
                return web.json_response({"applied": 0, "versionstamp": None, "versionstamped": []})
            applied = len(changes)
            async with api.first_write(p.ledger, p.page) as page:
                completed = await page.write(_handed_over(changes))
    stamp = None if offset is None else completed[0][offset : offset + 10]
    return web.json_response(
        {
            "applied": applied,
            "versionstamp": stamp.hex() if stamp is not None else None,
            "versionstamped": [b64(x) for x in completed],
        }
    )
