"""The HTTP endpoints of what the daemon says about itself: ``GET /v1/status``,
``/v1/health``, ``/v1/metrics`` and ``/v1/openapi.json``.

This module owns the daemon's facts and open pages in ``/v1/status``; every page's
sync, the devices and the conflicts are :mod:`daemon.status_report`'s, the health
probe's body :mod:`daemon.operations`', the metrics :mod:`daemon.metrics`', the API's
description :mod:`daemon.openapi`'s.
"""

from __future__ import annotations

import os
import time
from typing import Any

from aiohttp import web

from ledgerd.daemon import errors as ae
from ledgerd.daemon import operations
from ledgerd.daemon import status_report as report
from ledgerd.daemon.api import VERSION, Api, Params
from ledgerd.daemon.codec import b64, text_or_none
from ledgerd.daemon.collector import SYNC_OFF
from ledgerd.daemon.openapi import document
from ledgerd.daemon.query import Query


async def _open_pages(api: Api) -> dict[tuple[bytes, bytes], dict[str, Any]]:
    """What ``open_pages`` says of each page open now, by its names."""
    pages: dict[tuple[bytes, bytes], dict[str, Any]] = {}
    for pg in api.repo.open_pages():
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
                **(await api.engine.page_status(pg) if api.engine else {"sync": SYNC_OFF}),
            }
    return pages


async def status(api: Api, request: web.Request, p: Params) -> web.Response:
    """The daemon's facts, its open pages, and (:mod:`daemon.status_report`) every
    page's sync, the devices and the conflicts."""
    q = Query.of(request)
    limit = q.int("pages_limit", report.PAGES_LIMIT)
    if limit is None or limit > report.MAX_PAGES_LIMIT:
        raise ae.BadRequest(f"pages_limit must be at most {report.MAX_PAGES_LIMIT}")
    after = q.text("pages_after")
    pages = await _open_pages(api)
    engine = api.engine
    return web.json_response(
        {
            "version": VERSION,
            "pid": os.getpid(),
            "device_id": api.repo.device_id.hex(),
            "data_dir": str(api.repo.root),
            "uptime_s": round(time.time() - api.state.started, 3),
            "cloud": api.cfg.cloud or None,
            "sync_error": engine.last_error if engine else None,
            "sync": engine.status() if engine else None,
            "open_pages": list(pages.values()),
            **await report.pages_report(
                api.repo, engine, pages, limit, report.token_key(after) if after else None
            ),
            "devices": engine.devices() if engine else [],
            "conflicts": await report.conflicts_report(api.repo, engine, pages),
            **api.state.extra_status,
        }
    )


async def health(api: Api, request: web.Request, p: Params) -> web.Response:
    """For probes: up, repository open, sync healthy (or why not)."""
    doc, ok = await operations.health(api, Query.of(request).flag("sync", False))
    return web.json_response(doc, status=200 if ok else 503)


async def metrics_text(api: Api, request: web.Request, p: Params) -> web.Response:
    """The metrics in Prometheus' text format (:mod:`ledgerd.daemon.metrics`)."""
    if api.metrics is None:
        raise ae.NotFound("metrics are off")
    return await api.metrics.endpoint(request)


async def openapi(api: Api, request: web.Request, p: Params) -> web.Response:
    """The OpenAPI 3 description of this API (:mod:`ledgerd.daemon.openapi`)."""
    return web.json_response(document())
