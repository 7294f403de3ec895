"""The daemon's side of storage that does not grow: ``POST /v1/gc``, ``GET /v1/du``,
``POST /v1/evict`` and the background collection and eviction.

This module owns which pages a collection or a disk-usage report covers, how their
results read over HTTP, and the background task that collects every
``gc_interval`` seconds and evicts pages under ``disk_budget`` and ``evict_after``.
Collecting one page is :func:`ledgerd.store.page.gc.collect`, evicting one
:meth:`ledgerd.store.Repository.evict`; the routes are :mod:`ledgerd.daemon.admin_api`'s.
A page is collected under a lease, like any request's, and opened only for it if it
was closed (it closes again after); an evicted page is neither collected nor
opened for a report.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from typing import Any

from ledgerd.daemon import errors as ae
from ledgerd.daemon.api import Api
from ledgerd.daemon.codec import b64, text_or_none, unb64
from ledgerd.daemon.config import Config
from ledgerd.daemon.metrics import Metrics
from ledgerd.store import GcResult, Repository, StoreError
from ledgerd.store.errors import named
from ledgerd.store.page import gc as sgc

log = logging.getLogger(__name__)

FIELDS = ("ledger", "page")
EVICTION_INTERVAL = 60.0
"""Seconds between eviction rounds when the background collection is off."""


def _names(api: Api, doc: Any, what: str) -> tuple[bytes | None, bytes | None]:
    if not isinstance(doc, dict) or set(doc) - set(FIELDS):
        raise ae.BadRequest(f'{what} body must be {{"ledger"?: base64, "page"?: base64}}')
    out: list[bytes | None] = []
    for name, kind in (("ledger", "ledger name"), ("page", "page id")):
        v = doc.get(name)
        out.append(None if v is None else api.name_bytes(unb64(v, f"{what} body: {name}"), kind))
    ledger, page = out
    if page is not None and ledger is None:
        raise ae.BadRequest(f"{what} body: page needs ledger")
    return ledger, page


async def pages_of(
    repo: Repository,
    ledger: bytes | None,
    page: bytes | None,
    *,
    include_deleted: bool = False,
    include_lost: bool = False,
) -> list[tuple[bytes, bytes]]:
    """Every page, a ledger's, or one (404 when it does not exist); deleted ones too
    with ``include_deleted``, and with ``include_lost`` those whose database file is
    gone while its -wal remains (:meth:`Repository.page_lost`: a check reports them).
    One page named is returned lost or not: its use then fails as damaged."""
    if ledger is not None and not repo.ledger_exists(ledger):
        raise ae.LedgerNotFound(f"no ledger {named(ledger)}")
    if ledger is not None and page is not None:
        if not repo.page_exists(ledger, page) and not repo.page_lost(ledger, page):
            raise ae.PageNotFound(f"no page {named(page)} in ledger {named(ledger)}")
        return [(ledger, page)]
    keys: list[tuple[bytes, bytes]] = []
    ledgers = await repo.ledgers(include_deleted=include_deleted) if ledger is None else [ledger]
    for led in ledgers:
        pages = await repo.ledger(led).pages(include_deleted=include_deleted)
        if include_lost:
            pages = sorted({*pages, *await repo.ledger(led).lost_pages()})
        keys.extend((led, pid) for pid in pages)
    return keys


def _names_json(ledger: bytes, page: bytes) -> dict[str, Any]:
    return {
        "ledger": b64(ledger),
        "page": b64(page),
        "ledger_text": text_or_none(ledger),
        "page_text": text_or_none(page),
    }


def result_json(r: GcResult) -> dict[str, Any]:
    doc = r.json()
    doc.update(_names_json(r.ledger, r.page))
    return doc


async def run_gc(api: Api, doc: Any) -> dict[str, Any]:
    """The answer of ``POST /v1/gc`` for the body ``doc`` (already parsed)."""
    ledger, page = _names(api, doc, "gc")
    keys = await pages_of(api.repo, ledger, page)
    results, errors = await collect_pages(api.repo, keys, api.metrics)
    return {
        "collected_pages": len(results),
        "commits_pruned": sum(r.commits_pruned for r in results),
        "pieces_freed": sum(r.pieces_freed for r in results),
        "bytes_freed": sum(r.bytes_freed for r in results),
        "file_bytes_before": sum(r.file_bytes_before for r in results),
        "file_bytes_after": sum(r.file_bytes_after for r in results),
        "errors": errors,
        "pages": [result_json(r) for r in results],
    }


async def collect_pages(
    repo: Repository,
    keys: list[tuple[bytes, bytes]],
    metrics: Metrics | None,
    stop: asyncio.Event | None = None,
) -> tuple[list[GcResult], list[dict[str, Any]]]:
    """Collect each page in turn; a page that fails is reported and the rest go on.
    Once ``stop`` is set, a collection under way ends after its current batch."""
    results: list[GcResult] = []
    errors: list[dict[str, Any]] = []
    for key in keys:
        try:
            r = await repo.collect_garbage(*key, stop=None if stop is None else stop.is_set)
        except StoreError as e:
            log.warning("gc of page %s of ledger %s failed: %s", named(key[1]), named(key[0]), e)
            errors.append({**_names_json(*key), "message": str(e)})
            continue
        results.append(r)
        if metrics is not None:
            metrics.gc_done(r)
    return results, errors


SYNC_OFF, SYNCED, PENDING = "off", "synced", "pending"
"""A page's ``sync`` in ``GET /v1/du`` and ``/v1/status``: no cloud (it stays on this
device: ``local only``), nothing waits for upload, or something does."""


def sync_state(api: Api, usage: dict[str, Any]) -> str:
    """The page's ``sync`` (see :data:`SYNC_OFF`) from its :func:`store.page.gc.usage`."""
    if api.engine is None:
        return SYNC_OFF
    return SYNCED if usage["synced"] else PENDING


async def disk_usage(api: Api, doc: Any) -> dict[str, Any]:
    """The answer of ``GET /v1/du``: per page, its files and what it holds."""
    ledger, page = _names(api, doc, "du")
    keys = await pages_of(api.repo, ledger, page, include_lost=True)  # (listed as errors)
    pages = []
    for key in keys:
        if api.repo.is_evicted(*key):  # (opening it would bring it back)
            pages.append(
                {
                    **_names_json(*key),
                    "evicted": True,
                    "file_bytes": 0,
                    "live_bytes": 0,
                    "sync": SYNC_OFF if api.engine is None else SYNCED,  # (or it was empty)
                }
            )
            continue
        try:
            async with api.repo.page(*key, transient=True) as pg:
                u = await sgc.usage(pg, api.repo.history_retention)
        except StoreError as e:
            pages.append({**_names_json(*key), "error": str(e)})
            continue
        pages.append({**_names_json(*key), "evicted": False, **u, "sync": sync_state(api, u)})
    return {
        "file_bytes": sum(p.get("file_bytes", 0) for p in pages),
        "live_bytes": sum(p.get("live_bytes", 0) for p in pages),
        "pages": pages,
    }


async def evict_now(api: Api, doc: Any) -> dict[str, Any]:
    """The answer of ``POST /v1/evict`` (``{"ledger", "page"}``)."""
    ledger, page = _names(api, doc, "evict")
    if ledger is None or page is None:
        raise ae.BadRequest('evict body must be {"ledger": base64, "page": base64}')
    (key,) = await pages_of(api.repo, ledger, page)
    was = api.repo.is_evicted(*key)
    size = await api.repo.evict(*key)
    if api.metrics is not None and not was:
        api.metrics.evicted.inc()
    return {**_names_json(*key), "evicted": True, "freed_bytes": size}


async def collect_in_background(
    repo: Repository,
    cfg: Config,
    metrics: Metrics | None,
    done: asyncio.Event,
) -> None:
    """Every ``gc_interval`` seconds (or every minute when only eviction is on),
    collect the pages used since the previous round less the retention (their
    history may have aged out since; the first round covers every page), then evict
    pages by age (``evict_after``) and under ``disk_budget``. Returns once ``done``
    is set, between two pages."""
    interval = cfg.gc_interval or EVICTION_INTERVAL
    last_ms: int | None = None
    while True:
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(done.wait(), interval)
        if done.is_set():
            return
        started_ms = int(time.time() * 1000)
        try:
            if cfg.gc_interval > 0:
                if last_ms is None:
                    keys = await pages_of(repo, None, None)
                else:
                    since = last_ms - int(repo.history_retention * 1000)
                    keys = await repo.pages_used_since(since)
                freed = 0
                for key in keys:
                    if done.is_set():
                        return
                    if repo.is_evicted(*key):
                        continue
                    results, _ = await collect_pages(repo, [key], metrics, done)
                    freed += sum(r.bytes_freed for r in results)
                log.debug("background gc of %d pages freed %d bytes", len(keys), freed)
            if cfg.disk_budget or cfg.evict_after:
                n = await repo.evict_by_policy(int(cfg.disk_budget), cfg.evict_after)
                if n:
                    log.info("evicted %d pages (disk_budget, evict_after)", n)
                    if metrics is not None:
                        metrics.evicted.inc(n)
        except Exception:
            log.exception("background gc or eviction failed")
        last_ms = started_ms
