"""The HTTP endpoints of ledgers and pages: listing and deleting them, a page's merge
policy, its heads and its history.

Keys and values are :mod:`daemon.keys_api`'s, documents :mod:`daemon.docs_api`'s,
conflicts :mod:`daemon.conflicts_api`'s; the routes' plumbing is :mod:`daemon.api`'s.
"""

from __future__ import annotations

from aiohttp import web

from ledgerd.daemon import errors as ae
from ledgerd.daemon.api import CONTROL_BODY_BYTES, MAX_LIMIT, Api, Params
from ledgerd.daemon.codec import b64, commit_json, parse_json, text_or_none
from ledgerd.daemon.query import Query
from ledgerd.store import Policy
from ledgerd.store.errors import named


async def ledgers(api: Api, request: web.Request, p: Params) -> web.Response:
    names = await api.repo.ledgers()
    return web.json_response(
        {"ledgers": [{"name": b64(n), "text": text_or_none(n)} for n in names]}
    )


async def pages(api: Api, request: web.Request, p: Params) -> web.Response:
    if not await api.repo.ledger_listed(p.ledger):
        raise ae.LedgerNotFound(f"no ledger {named(p.ledger)}")
    ids = await api.repo.ledger(p.ledger).pages()
    return web.json_response({"pages": [{"id": b64(i), "text": text_or_none(i)} for i in ids]})


async def delete_page(api: Api, request: web.Request, p: Params) -> web.Response:
    """Delete the page (one commit, synced; listings leave it out): 404 when it is
    not listed."""
    await api.repo.delete_page(p.ledger, p.page)
    return web.Response(status=204)


async def delete_ledger(api: Api, request: web.Request, p: Params) -> web.Response:
    """Delete every page of the ledger: 404 when it has no listed page."""
    await api.repo.delete_ledger(p.ledger)
    return web.Response(status=204)


async def _policy_body(api: Api, request: web.Request) -> Policy:
    try:
        body = await api.read_body(request, CONTROL_BODY_BYTES, "policy body")
        doc = parse_json(body, "policy body")
        return Policy(doc["policy"])
    except (ValueError, KeyError, TypeError, ae.BadRequest):
        names = ", ".join(p.value for p in Policy)
        raise ae.BadRequest(f'body must be {{"policy": NAME}} with NAME one of {names}') from None


async def policy(api: Api, request: web.Request, p: Params) -> web.Response:
    """GET: the page's merge policy and its conflicts; PUT {"policy": NAME}: set it
    (remembered)."""
    # (a PUT's body first: a bad one creates no page)
    chosen = await _policy_body(api, request) if request.method == "PUT" else None
    page = await api.page(p.ledger, p.page, create=chosen is not None)
    if chosen is not None:
        await page.set_policy(chosen)
    return web.json_response(
        {
            "policy": page.policy.value,
            "heads": len(await page.heads()),
            "conflicts": page.conflict_count,
            "conflict": page.pending_conflict,
        }
    )


async def heads(api: Api, request: web.Request, p: Params) -> web.Response:
    page = await api.page(p.ledger, p.page, create=False)
    await page.flush()
    return web.json_response({"heads": [commit_json(c) for c in await page.heads()]})


async def history(api: Api, request: web.Request, p: Params) -> web.Response:
    page = await api.page(p.ledger, p.page, create=False)
    await page.flush()
    q = Query.of(request)
    limit = q.int("limit", 100, lo=1) or 100
    start = q.text("start")
    start_id = await page.find_commit(start) if start else None
    commits = await page.history(min(limit, MAX_LIMIT), start_id)
    return web.json_response({"commits": [commit_json(c) for c in commits]})


async def commit(api: Api, request: web.Request, p: Params) -> web.Response:
    page = await api.page(p.ledger, p.page, create=False)
    cid = await page.find_commit(p.commit)
    return web.json_response(commit_json(await page.load_commit(cid)))
