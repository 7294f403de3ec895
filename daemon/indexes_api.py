"""The HTTP endpoints of indexes and queries: ``.../docs/{collection}/_indexes/...``,
``_find`` and ``_explain``.

This module owns declaring, listing, dropping and rebuilding a collection's indexes,
queries over one (``find``), and selector queries (pouchdb-find's and Mango's
``_find``, and the plan ``_explain`` shows). What every document route shares is
:mod:`daemon.docs_http`'s; the routes' plumbing is :mod:`daemon.api`'s.
"""

from __future__ import annotations

from typing import Any

from aiohttp import web

from ledgerd.daemon import errors as ae
from ledgerd.daemon.api import Api, Params
from ledgerd.daemon.codec import parse_json
from ledgerd.daemon.docs_http import (
    DEFAULT_LIMIT,
    JSON_TYPE,
    MAX_LIMIT,
    body_limit,
    document_store,
    documents_page,
    dumps,
    segments,
)
from ledgerd.daemon.query import Query
from ledgerd.store import DocumentStore


async def _find_request(api: Api, request: web.Request) -> tuple[str, Any]:
    collection, _ = segments(request)
    DocumentStore.check(collection)
    body = parse_json(await api.read_body(request, body_limit(api), "find request"), "find request")
    if not isinstance(body, dict):
        raise ae.BadRequest("a find request is a JSON object")
    return collection, body


async def find_documents(api: Api, request: web.Request, p: Params) -> web.Response:
    """POST ``{"selector", "fields", "sort", "limit", "skip", "bookmark", "use_index"}``
    (CouchDB's and pouchdb-find's ``_find``): ``{"docs": [...], "bookmark"}``, each
    document with its ``_id``; ``"warning"`` when ``use_index`` could not be used. An
    answer whose JSON would pass ``max_listing_bytes`` is cut short (at least one
    document), its bookmark continuing after the last one sent."""
    collection, body = await _find_request(api, request)
    docs = await document_store(api, p, write=False)
    limit = body.get("limit")
    while True:
        res = await docs.find(collection, body if limit is None else {**body, "limit": limit})
        texts: list[str] = []
        used = 0
        for d in res.docs:
            t = dumps(d)
            if texts and used + len(t) > api.cfg.max_listing_bytes:
                break
            texts.append(t)
            used += len(t)
        if len(texts) == len(res.docs):
            break
        limit = len(texts)
    warning = "" if res.plan.warning is None else f',"warning":{dumps(res.plan.warning)}'
    text = f'{{"docs":[{",".join(texts)}],"bookmark":{dumps(res.bookmark)}{warning}}}'
    return web.Response(text=text, content_type=JSON_TYPE)


async def explain_find(api: Api, request: web.Request, p: Params) -> web.Response:
    """POST a find request (as ``_find``): the plan it would run, ``"scan": true`` when no
    declared index serves it, with the index's name and why."""
    collection, body = await _find_request(api, request)
    docs = await document_store(api, p, write=False)
    return web.json_response(await docs.explain(collection, body), dumps=dumps)


def _path_json(path: str | list[str]) -> str | list[str]:
    """An index path as the API shows it: dotted text (``"address.city"``), unless a
    name in it holds a dot (a field named ``"a.b"``), then the list of its names
    (``["a.b"]``), since the text would read as ``["a", "b"]``. Either form declares
    the same index again. A path given as text (split at its dots) stays as given."""
    if isinstance(path, str) or any("." in part for part in path):
        return path
    return ".".join(path)


def _index_json(
    collection: str,
    name: str,
    partition: str | list[str],
    sort: str | list[str] | None,
    ready: bool,
) -> Any:
    return {
        "collection": collection,
        "name": name,
        "partition": _path_json(partition),
        "sort": None if sort is None else _path_json(sort),
        "ready": ready,
    }


async def list_indexes(api: Api, request: web.Request, p: Params) -> web.Response:
    collection, _ = segments(request)
    DocumentStore.check(collection)
    docs = await document_store(api, p, write=False)
    out = []
    for i in await docs.indexes(collection):
        if i.code is not None:  # its definition cannot be read here: why, not its paths
            out.append(
                {
                    "collection": i.collection,
                    "name": i.name,
                    "partition": None,
                    "sort": None,
                    "ready": False,
                    "code": i.code,
                    "message": i.message,
                }
            )
            continue
        out.append(
            _index_json(
                i.collection,
                i.name,
                list(i.partition_path),
                None if i.sort_path is None else list(i.sort_path),
                i.ready,
            )
        )
    return web.json_response({"indexes": out})


async def declare_index(api: Api, request: web.Request, p: Params) -> web.Response:
    """PUT ``{"partition": PATH, "sort": PATH?}`` (paths as ``"a.b"`` or ``["a", "b"]``);
    answers the index as declared, its paths as given."""
    collection, _, name = segments(request)
    DocumentStore.check(collection)
    body = parse_json(await api.read_body(request, body_limit(api), "index body"), "index body")
    if not isinstance(body, dict) or "partition" not in body or set(body) - {"partition", "sort"}:
        raise ae.BadRequest('index body must be {"partition": PATH, "sort": PATH?}')
    partition, sort = body["partition"], body.get("sort")
    DocumentStore.check_index(collection, name, partition, sort)  # a bad one makes no page
    docs = await document_store(api, p, write=True)
    i = await docs.declare_index(collection, name, partition, sort)
    return web.json_response(_index_json(collection, name, partition, sort, i.ready))


async def drop_index(api: Api, request: web.Request, p: Params) -> web.Response:
    collection, _, name = segments(request)
    DocumentStore.check(collection)
    docs = await document_store(api, p, write=False)
    await docs.drop_index(collection, name)
    return web.Response(status=204)


async def rebuild_index(api: Api, request: web.Request, p: Params) -> web.Response:
    collection, _, name, _ = segments(request)
    DocumentStore.check(collection)
    docs = await document_store(api, p, write=False)
    await docs.rebuild_index(collection, name)
    return web.Response(status=204)


async def find(api: Api, request: web.Request, p: Params) -> web.Response:
    """``?eq=JSON`` the partition value, ``start``/``end`` (JSON) the sort range."""
    q = Query.of(request)
    collection, _, name, _ = segments(request)
    DocumentStore.check(collection)
    eq = q.json("eq")
    if "eq" not in q.texts:
        raise ae.BadRequest("query parameter eq (the partition value, as JSON) is required")
    start, end = q.bound("start"), q.bound("end")
    limit = q.utf8_int("limit", DEFAULT_LIMIT, 1, MAX_LIMIT)
    token = q.url_token()
    deleted = q.utf8_flag("deleted")
    docs = await document_store(api, p, write=False)
    return await documents_page(
        lambda n: docs.query(
            collection,
            name,
            eq,
            start=start,
            end=end,
            limit=n,
            token=token,
            include_deleted=deleted,
        ),
        limit,
        api.cfg.max_listing_bytes,
    )
