"""The HTTP endpoints of conflicts: listing them and resolving them by hand.

This module owns ``GET /v1/conflicts``, ``GET /v1/ledgers/{L}/pages/{P}/conflicts`` and
``POST /v1/ledgers/{L}/pages/{P}/conflicts/resolve``: how a page's conflicts
(:meth:`ledgerd.store.Page.list_conflicts`) become JSON, and how a resolution's body
becomes :meth:`ledgerd.store.Page.resolve`. Its handlers are entries of
:data:`ledgerd.daemon.routes.ROUTES`; the routes' matching, page leases, error responses
and request bodies are :mod:`daemon.api`'s, the error codes :mod:`daemon.errors`'.

Keys and values in JSON are base64, names base64 with their text, as everywhere in
the API; ``expect`` is the hex token a resolution may carry to refuse siblings that
changed since they were listed.
"""

from __future__ import annotations

import re
from typing import Any

from aiohttp import web

from ledgerd.daemon import errors as ae
from ledgerd.daemon.api import Api, Params
from ledgerd.daemon.codec import (
    INLINE_VALUE_LIMIT,
    b64,
    integer_param,
    parse_json,
    priority_name,
    text_or_none,
    unb64,
)
from ledgerd.daemon.query import Query
from ledgerd.store import (
    KeyConflict,
    ObjectNotFoundError,
    Page,
    PageUnavailableError,
    Take,
    check_key,
    expect_of,
)
from ledgerd.store.errors import named
from ledgerd.store.pieces import digest as dg
from ledgerd.store.tree import dots

DEFAULT_LIMIT, MAX_LIMIT = 100, 1000
"""Conflicting keys per page in a listing."""
_EXPECT = re.compile(r"[0-9a-f]{16}", re.ASCII)


# -- JSON out ------------------------------------------------------------------------


async def _side(page: Page, v: tuple[bytes, int, bytes]) -> dict[str, Any]:
    """One sibling: its value (base64; null when deleted, over 1 MiB or not on this
    device), size (null when deleted or unknown here), priority, deleted, and the write's
    time (microseconds) and device (the writer's tag, hex)."""
    digest, prio, dot = v
    doc: dict[str, Any] = {
        "deleted": digest == dg.TOMBSTONE,
        "value": None,
        "size": None,
        "priority": priority_name(prio),
        "time": dots.time_of(dot),
        "device": dots.tag_of(dot).hex(),
    }
    if digest == dg.TOMBSTONE:
        return doc
    try:
        doc["size"] = size = await page.objects.size(digest)
        if size <= INLINE_VALUE_LIMIT:
            doc["value"] = b64(await page.objects.read_all(digest))
    except ObjectNotFoundError:  # a LAZY value not fetched, and not fetchable now
        pass
    return doc


async def _key_doc(page: Page, c: KeyConflict) -> dict[str, Any]:
    return {
        "key": b64(c.key),
        "expect": c.expect,
        "ours": await _side(page, c.ours),
        "theirs": [await _side(page, v) for v in c.theirs],
    }


async def page_doc(page: Page, start: bytes, limit: int, budget: int) -> tuple[dict[str, Any], int]:
    """A page's conflicts from ``start`` on: at most ``limit`` keys (none when 0), and no
    more once their values pass ``budget`` bytes (at least one key); ``next`` is the key
    the next listing starts at, ``expect`` the whole page's (when the listing is whole).
    Also the bytes of values it holds."""
    found = await page.list_conflicts(start, limit + 1)
    more = found[limit:]
    found = found[:limit]
    out: list[dict[str, Any]] = []
    used = 0
    for i, c in enumerate(found):
        if out and used > budget:
            more = found[i:]
            break
        doc = await _key_doc(page, c)
        used += sum(len(s["value"] or "") for s in (doc["ours"], *doc["theirs"]))
        out.append(doc)
    whole = not start and not more
    doc = {
        "ledger": b64(page.ledger),
        "page": b64(page.id),
        "ledger_text": text_or_none(page.ledger),
        "page_text": text_or_none(page.id),
        "device": page.graph.tag.hex(),
        "policy": page.policy.value,
        "count": page.conflict_count,
        "conflict": page.pending_conflict,
        "conflicts": out,
        "next": b64(more[0].key) if more else None,
        "expect": expect_of(found) if whole else None,
    }
    return doc, used


# -- endpoints -----------------------------------------------------------------------


def _params(request: web.Request) -> tuple[int, bytes | None, bytes | None]:
    """``limit``, and ``start`` and ``ledger`` (percent-encoded bytes), from the query."""
    q = Query.of(request)
    q.distinct()  # (any parameter given twice: these routes never took one twice)
    limit = DEFAULT_LIMIT
    if given := q.bytes("limit"):
        limit = integer_param("limit", given.decode("latin-1"))
        if not 1 <= limit <= MAX_LIMIT:
            raise ae.BadRequest(f"limit must be from 1 to {MAX_LIMIT}")
    return limit, q.bytes("start"), q.bytes("ledger")


async def page_conflicts(api: Api, request: web.Request, p: Params) -> web.Response:
    """GET ?start=&limit=: the page's conflicting keys, each with its siblings."""
    limit, start, _ = _params(request)
    page = await api.page(p.ledger, p.page, create=False)
    doc, _ = await page_doc(page, start or b"", limit, api.cfg.max_listing_bytes)
    return web.json_response(doc)


async def all_conflicts(api: Api, request: web.Request, p: Params) -> web.Response:
    """GET ?ledger=&limit=: the conflicts of every open page holding some, or of every
    page of ``ledger`` (each opened in turn); pages without conflicts are left out. Once
    the values listed pass ``max_listing_bytes``, the pages after list no key (their
    ``next`` is their first: list them one at a time)."""
    limit, _, ledger = _params(request)
    left = api.cfg.max_listing_bytes
    out: list[dict[str, Any]] = []

    async def add(page: Page) -> None:
        nonlocal left
        doc, used = await page_doc(page, b"", limit if left > 0 else 0, left)
        out.append(doc)
        left -= used

    if ledger is None:
        for page in api.repo.open_pages():
            if page.closed or not page.conflict_count:
                continue
            with page.lease(use=False):  # looking is no use: it may still close as idle
                await add(page)
    else:
        api.name_bytes(ledger, "ledger name")
        if not api.repo.ledger_exists(ledger):
            raise ae.LedgerNotFound(f"no ledger {named(ledger)}")
        for page_id in await api.repo.ledger(ledger).pages():
            if api.repo.is_evicted(ledger, page_id):  # not opened (fetched) to look
                continue
            try:
                page = await api.repo.open_page(ledger, page_id)
            except PageUnavailableError:
                continue
            with page.lease():
                if page.conflict_count:
                    await add(page)
    return web.json_response({"pages": out})


async def resolve(api: Api, request: web.Request, p: Params) -> web.Response:
    """POST {"key"?, "take", "expect"?}: resolve the key's conflict, or every conflict of
    the page when ``key`` is left out. ``take`` is "ours", "theirs", "delete" or
    {"value": BASE64}."""
    body = await api.read_body(request, what="resolve body")
    doc = parse_json(body, "resolve body")
    if not isinstance(doc, dict):
        raise ae.BadRequest('resolve body must be {"key"?, "take", "expect"?}')
    unknown = sorted(set(doc) - _RESOLVE_FIELDS)
    if unknown:  # (a misspelt "key" must not make a page-wide resolution)
        raise ae.BadRequest(f"a resolve body takes key, take and expect, not {', '.join(unknown)}")
    if "key" in doc and doc["key"] is None:
        raise ae.BadRequest('key is base64 text; leave "key" out to resolve the whole page')
    key = None if "key" not in doc else check_key(unb64(doc["key"], "key"))
    take = _take(doc.get("take"))
    expect = doc.get("expect")
    if expect is not None and (not isinstance(expect, str) or not _EXPECT.fullmatch(expect)):
        raise ae.BadRequest("expect must be the 16 hex digits a conflicts listing gave")
    page = await api.page(p.ledger, p.page, create=False)
    done = await page.resolve(key, take, expect)
    return web.json_response(
        {"resolved": [b64(c.key) for c in done], "conflicts": page.conflict_count}
    )


_RESOLVE_FIELDS = {"key", "take", "expect"}


def _take(take: object) -> Take:
    if take in ("ours", "theirs"):
        return "ours" if take == "ours" else "theirs"
    if take == "delete":
        return None
    if isinstance(take, dict) and set(take) == {"value"}:
        return unb64(take["value"], "take.value")
    raise ae.BadRequest('take must be "ours", "theirs", "delete" or {"value": BASE64}')
