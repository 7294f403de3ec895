"""The daemon's side of running it in production: ``POST /v1/check``, ``GET /v1/health``.

This module owns which pages a check covers and how its report reads over HTTP,
and what a health probe is told.
The check of a page is :mod:`ledgerd.store.page.check` (local) and
:mod:`ledgerd.sync.check` (the bucket, and repairs); the routes are
:mod:`ledgerd.daemon.admin_api`'s and :mod:`ledgerd.daemon.status_api`'s. A page is
checked under a lease, like any request's, and opened only for its check if it was
closed (it closes again after), so the daemon keeps serving every page, the one being
checked included.
"""

from __future__ import annotations

import logging
from typing import Any

from ledgerd.daemon import errors as ae
from ledgerd.daemon.api import Api
from ledgerd.daemon.codec import unb64
from ledgerd.daemon.collector import pages_of
from ledgerd.store import StoreError
from ledgerd.store.errors import TooManyOpenPagesError, counted
from ledgerd.store.page import check as ck
from ledgerd.sync.check import BucketIndex, Checked, check_page
from ledgerd.sync.errors import CloudError

log = logging.getLogger(__name__)

CHECK_FIELDS = ("ledger", "page", "cloud", "repair")


def _flag(doc: dict[str, Any], name: str) -> bool:
    v = doc.get(name, False)
    if not isinstance(v, bool):
        raise ae.BadRequest(f"check body: {name} must be true or false")
    return v


def _name(doc: dict[str, Any], name: str, what: str) -> bytes | None:
    v = doc.get(name)
    if v is None:
        return None
    return Api.name_bytes(unb64(v, f"check body: {name}"), what)


async def run_check(api: Api, doc: Any) -> dict[str, Any]:
    """The report of ``POST /v1/check`` for the body ``doc`` (already parsed)."""
    if not isinstance(doc, dict) or set(doc) - set(CHECK_FIELDS):
        raise ae.BadRequest(
            'check body must be {"ledger"?: base64, "page"?: base64, "cloud"?: bool, '
            '"repair"?: bool}'
        )
    ledger = _name(doc, "ledger", "ledger name")
    page = _name(doc, "page", "page id")
    cloud, repair = _flag(doc, "cloud"), _flag(doc, "repair")
    repo = api.repo
    if page is not None and ledger is None:
        raise ae.BadRequest("check body: page needs ledger")
    keys = await pages_of(repo, ledger, page, include_deleted=True, include_lost=True)
    engine = api.engine
    index = BucketIndex(engine.store, engine.codec) if engine is not None else None
    results: list[Checked] = []
    for key in keys:
        results.append(await _one(api, key, index, cloud, repair))
    problems = [p for r in results for p in r.report.problems]
    healthy = all(r.report.healthy for r in results)
    if not healthy or any(p.repaired for p in problems):
        log.warning(
            "check of %s: %s, %d repaired",
            counted(len(results), "page"),
            counted(len(problems), "problem"),
            sum(p.repaired for p in problems),
        )
    return {
        "healthy": healthy,
        "checked_pages": len(results),
        "problems": sum(not p.repaired for p in problems) + sum(r.report.dropped for r in results),
        "repaired": sum(p.repaired for p in problems),
        "cloud": (cloud or repair) and engine is not None,  # whether the bucket was read
        "repair": repair,
        "pages": [r.json() for r in results],
    }


async def _one(
    api: Api, key: tuple[bytes, bytes], index: BucketIndex | None, cloud: bool, repair: bool
) -> Checked:
    try:
        async with api.repo.page(*key, transient=True) as page:
            return await check_page(page, api.engine, index, cloud=cloud, repair=repair)
    except TooManyOpenPagesError as e:  # busy, not damaged: say so, unverified
        report = ck.PageCheck(*key)
        report.add(ck.Problem(ck.NOT_CHECKED, f"not checked: {e}"))
        return Checked(report)
    except (StoreError, CloudError) as e:
        report = ck.PageCheck(*key)
        report.add(ck.Problem(ck.SQLITE if isinstance(e, StoreError) else ck.CLOUD, str(e)))
        return Checked(report)


async def health(api: Api, strict_sync: bool) -> tuple[dict[str, Any], bool]:
    """The body of ``GET /v1/health`` and whether it is a success: the daemon is up (it
    answered), its repository is open and readable, and (with ``strict_sync``) sync
    is healthy. Sync's state is in the body either way, with every reason it is not."""
    repo_error: str | None = None
    if api.repo.usage.closed:
        repo_error = "the repository is closed"
    else:
        try:
            await api.repo.usage.read_all("SELECT 1")
        except Exception as e:  # the disk, the file: whatever it is, the probe says it
            repo_error = f"{type(e).__name__}: {e}"
    engine = api.engine
    sync: dict[str, Any] = {"enabled": engine is not None}
    if engine is None:
        sync["state"] = "off"  # no cloud: every page stays on this device
    else:
        sync.update(engine.health())
        sync["state"] = "synced" if sync["synced"] else "pending" if sync["healthy"] else "degraded"
    ok = repo_error is None and (not strict_sync or engine is None or bool(sync["healthy"]))
    status = "ok" if repo_error is None and sync.get("healthy", True) else "degraded"
    if repo_error is not None:
        status = "failing"
    return (
        {
            "status": status,
            "up": True,
            "repository": {"open": repo_error is None, "error": repo_error},
            "sync": sync,
        },
        ok,
    )
