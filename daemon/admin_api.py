"""The HTTP endpoints of running the daemon: ``POST /v1/sync``, ``/v1/check``,
``/v1/gc`` and ``/v1/evict``, and ``GET /v1/du``.

This module owns how these requests are read and answered; which pages a check covers
and its report are :mod:`daemon.operations`', collection, disk usage and eviction
:mod:`daemon.collector`'s, sync itself :class:`ledgerd.sync.engine.SyncEngine`'s.
"""

from __future__ import annotations

from aiohttp import web

from ledgerd.daemon import collector, operations
from ledgerd.daemon import errors as ae
from ledgerd.daemon.api import Api, Params
from ledgerd.daemon.codec import b64
from ledgerd.daemon.query import Query
from ledgerd.sync.errors import SyncError, SyncStoppedError


async def sync(api: Api, request: web.Request, p: Params) -> web.Response:
    """Upload everything pending, fetch everything visible and join it, until a round
    is quiet."""
    q = Query.of(request)
    ledger, page = q.bytes("ledger"), q.bytes("page")
    timeout = q.seconds("timeout", 60.0)
    if page is not None and ledger is None:
        raise ae.BadRequest("page needs ledger")
    if api.engine is None:
        raise ae.Conflict("cloud sync is off: start ledgerd with --cloud URL")
    try:
        stats = await api.engine.sync(ledger or None, page or None, timeout=timeout)
    except SyncStoppedError:  # SIGTERM: the engine ended the rounds in flight
        raise ae.ShuttingDown("ledgerd is shutting down: sync was stopped") from None
    except SyncError as e:  # the bucket, a listing, or the timeout (with the last error)
        kind = ae.BUCKET_ERRORS.get(getattr(e, "code", ""), ae.Unavailable)
        raise kind(f"sync failed: {e}") from None
    problems = api.engine.problems(ledger or None, page or None)
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


async def check(api: Api, request: web.Request, p: Params) -> web.Response:
    """POST {"ledger"?, "page"?, "cloud"?, "repair"?}: check pages (all of them, a
    ledger's, or one) and answer the report; see :mod:`ledgerd.sync.check`."""
    doc = await api.optional_json(request, "check body")
    return web.json_response(await operations.run_check(api, doc))


async def gc(api: Api, request: web.Request, p: Params) -> web.Response:
    """POST {"ledger"?, "page"?}: prune history and collect garbage now (every page,
    a ledger's, or one); see :mod:`ledgerd.daemon.collector`."""
    doc = await api.optional_json(request, "gc body")
    return web.json_response(await collector.run_gc(api, doc))


async def evict(api: Api, request: web.Request, p: Params) -> web.Response:
    """POST {"ledger", "page"}: evict the page now (see :mod:`ledgerd.store.repo.eviction`)."""
    doc = await api.optional_json(request, "evict body")
    return web.json_response(await collector.evict_now(api, doc))


async def du(api: Api, request: web.Request, p: Params) -> web.Response:
    """GET ?ledger=&page= (percent-encoded): what pages hold and their files take."""
    q = Query.of(request)
    doc = {k: b64(v) for k in ("ledger", "page") if (v := q.bytes(k)) is not None}
    return web.json_response(await collector.disk_usage(api, doc))
