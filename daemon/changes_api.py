"""The HTTP endpoint of the changes feed: ``GET .../docs/_changes``.

This module owns the feed's pages (JSON, continued by a token) and the followed feed
(newline-delimited JSON until the client leaves or the daemon stops, one of
``max_followers``). What every document route shares is :mod:`daemon.docs_http`'s;
the routes' plumbing is :mod:`daemon.api`'s.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from typing import Any

from aiohttp import web

from ledgerd.daemon import errors as ae
from ledgerd.daemon.api import Api, Params
from ledgerd.daemon.codec import from_hex
from ledgerd.daemon.config import MIN_HEARTBEAT
from ledgerd.daemon.docs_http import (
    MAX_LIMIT,
    document_store,
    document_text,
    documents_page,
    dumps,
    not_json,
)
from ledgerd.daemon.protocol import connection_lost
from ledgerd.daemon.query import Query
from ledgerd.store import Changes, CommitNotFoundError, DocumentStore, StoreError

log = logging.getLogger(__name__)

HEARTBEAT = 10.0
"""Seconds between the empty lines a followed changes feed sends while nothing changes
(``?heartbeat=`` sets it, at least :data:`MIN_HEARTBEAT`): they keep proxies and idle
timers of clients from closing a quiet feed."""
NDJSON_TYPE = "application/x-ndjson"


def _changes_line(batch: Changes) -> bytes:
    texts, damaged = [], list(batch.damaged)
    for d in batch.documents:
        t = document_text(d)
        if t is None:
            damaged.append(not_json(d))
        else:
            texts.append(t)
    bad = f',"damaged":{dumps([d.to_json() for d in damaged])}' if damaged else ""
    line = f'{{"commit":"{batch.commit.hex()}","documents":[{",".join(texts)}]{bad}}}'
    return line.encode() + b"\n"


async def changes(api: Api, request: web.Request, p: Params) -> web.StreamResponse:
    """Documents changed since ``?since=COMMIT`` (every one without it), deleted and
    purged ones included, as ``{"commit", "documents", "next"}``: at most ``?limit=``
    (1,000) documents, and ``next``, a token for ``?token=``, while the change goes on
    (up to the same head); ``commit`` is where to resume. With ``?follow=1``, lines of
    ``{"commit", "documents"}`` (at most ``limit`` documents each) as newline-delimited
    JSON, until the client leaves or the daemon stops (an empty line every
    ``heartbeat`` seconds); a line cut from a longer change carries the commit it
    started from, so resuming there sends its documents at least once. ``?conflicts=1``:
    each document with its kept conflicts' revisions (``_meta._conflicts``)."""
    q = Query.of(request)
    since_text = q.utf8("since")
    try:
        since = from_hex(since_text) if since_text else None
    except ValueError:
        raise ae.BadRequest("since must be a commit id in hex") from None
    collection = q.utf8("collection")
    if collection is not None:  # (an empty one is no collection's name: invalid_name)
        DocumentStore.check(collection)
    follow = q.utf8_flag("follow")
    if follow and q.utf8("token"):
        raise ae.BadRequest("a followed changes feed takes since, not a page's token")
    heartbeat = q.utf8_seconds("heartbeat", HEARTBEAT, MIN_HEARTBEAT)
    docs = await document_store(api, p, write=False)
    if since is not None:
        await docs.page.load_commit(since)  # an unknown commit: 404 before anything is sent
    limit = q.utf8_int("limit", MAX_LIMIT, 1, MAX_LIMIT)
    conflicts = q.utf8_flag("conflicts")
    if not follow:
        token = q.url_token()
        try:
            return await documents_page(
                lambda n: docs.changes_page(
                    since, collection=collection, limit=n, token=token, conflicts=conflicts
                ),
                limit,
                api.cfg.max_listing_bytes,
            )
        except CommitNotFoundError:
            if token is None:
                raise
            # (``since`` was found above): the token's commit is not of this page
            raise ae.BadRequest("the continuation token is not one of this page's") from None
    with api.following():
        return await _follow(api, request, docs, since, collection, limit, heartbeat, conflicts)


async def _follow(
    api: Api,
    request: web.Request,
    docs: DocumentStore,
    since: bytes | None,
    collection: str | None,
    limit: int,
    heartbeat: float,
    conflicts: bool,
) -> web.StreamResponse:
    """The followed changes feed (see :func:`changes`), one of ``max_followers``."""
    resp = web.StreamResponse(headers={"Content-Type": NDJSON_TYPE})
    await resp.prepare(request)
    feed = docs.changes(since, collection=collection, follow=True, batch=limit, conflicts=conflicts)
    nxt: asyncio.Future[Any] | None = None
    # It ends as soon as the client leaves or the daemon stops, whatever the heartbeat.
    gone = connection_lost(request)
    stopping = asyncio.ensure_future(api.state.stopping.wait())
    try:
        while not api.state.shutting_down:
            if nxt is None:
                nxt = asyncio.ensure_future(feed.__anext__())
            await asyncio.wait(
                {nxt, gone, stopping}, timeout=heartbeat, return_when=asyncio.FIRST_COMPLETED
            )
            if gone.done():
                raise ConnectionResetError("the client left")
            if stopping.done():
                break
            if not nxt.done():
                await api.send(request, resp, b"\n")
                continue
            try:
                batch = nxt.result()
            except StopAsyncIteration:  # the page closed
                break
            nxt = None
            await api.send(request, resp, _changes_line(batch))
        await resp.write_eof()
    except ConnectionError:
        log.debug("the client of %s %s left", request.method, request.path)
    except StoreError as e:  # the status is out: the error is the last line
        err = ae.from_store(e)
        log.error("changes feed of %s ended: %s", request.path, e)
        with contextlib.suppress(ConnectionError):
            await resp.write(dumps(err.body()).encode() + b"\n")
            await resp.write_eof()
    finally:
        stopping.cancel()
        if nxt is not None and not nxt.done():
            nxt.cancel()
            await asyncio.wait({nxt})
        await feed.aclose()
    return resp
