"""The OpenAPI 3 description of the HTTP API, served at ``GET /v1/openapi.json``.

This module owns the document: one entry per route of :data:`ledgerd.daemon.routes.ROUTES`
(a test checks that the two list the same methods and paths), with its parameters,
bodies and answers. It is data, built once; the daemon serves it as is.
"""

from __future__ import annotations

import functools
from typing import Any

from ledgerd.daemon import __version__
from ledgerd.daemon.codec import FLAG_FALSE, FLAG_TRUE

JSON = "application/json"
BYTES = "application/octet-stream"


def _ref(name: str) -> dict[str, str]:
    return {"$ref": f"#/components/schemas/{name}"}


def _json(schema: dict[str, Any], description: str = "OK") -> dict[str, Any]:
    return {"description": description, "content": {JSON: {"schema": schema}}}


def _errors(*statuses: int) -> dict[str, Any]:
    """Error answers: ``{"error": {"code", "message"}}`` (see the table in docs/http-api.md)."""
    out = {str(s): _json(_ref("Error"), "error (see the code)") for s in statuses}
    out["default"] = _json(_ref("Error"), "error (see the code)")
    return out


def _path(name: str, description: str) -> dict[str, Any]:
    return {
        "name": name,
        "in": "path",
        "required": True,
        "description": description,
        "schema": {"type": "string", "minLength": 1},
    }


def _query(name: str, description: str, schema: dict[str, Any] | None = None) -> dict[str, Any]:
    return {
        "name": name,
        "in": "query",
        "required": False,
        "description": description,
        "schema": schema or {"type": "string"},
    }


FLAG_VALUES = [*FLAG_TRUE, *FLAG_FALSE]
"""A flag's values (any case): anything else is 400 ``bad_request``."""


def _flag(name: str, description: str) -> dict[str, Any]:
    return _query(
        name,
        f"{description}; a flag: 1, true or yes; 0, false, no or empty (any case); "
        "anything else is 400 bad_request",
        {"type": "string", "enum": FLAG_VALUES},
    )


LEDGER = _path("ledger", "ledger name: percent-encoded bytes, 1-128")
PAGE = _path("page", "page id: percent-encoded bytes, 1-128")
KEY = _path("key", "key: percent-encoded bytes, at most 4 KiB; may hold '/'")
COMMIT = _path("commit", "commit id (hex)")
AT = _query("at", "read at this commit (hex id)")
B64 = {"type": "string", "format": "byte"}
NAMES = {"type": "array", "items": {"type": "object"}}
PAGE_PATH = "/v1/ledgers/{ledger}/pages/{page}"


def _op(
    summary: str,
    ok: dict[str, Any],
    *,
    params: tuple[dict[str, Any], ...] = (),
    body: dict[str, Any] | None = None,
    errors: tuple[int, ...] = (400,),
    extra: dict[str, Any] | None = None,
) -> dict[str, Any]:
    op: dict[str, Any] = {"summary": summary, "responses": {**ok, **_errors(*errors)}}
    if params:
        op["parameters"] = list(params)
    if body is not None:
        op["requestBody"] = body
    op.update(extra or {})
    return op


def _status_ok(description: str = "done") -> dict[str, Any]:
    return {"204": {"description": description}}


@functools.cache
def document() -> dict[str, Any]:
    """The OpenAPI 3.0 document of the API."""
    page = (LEDGER, PAGE)
    key = (LEDGER, PAGE, KEY)
    paths: dict[str, dict[str, Any]] = {
        "/v1/status": {
            "get": _op(
                "the daemon's state: version, device, sync, devices, every page, conflicts",
                {"200": _json(_ref("Status"))},
                params=(
                    _query(
                        "pages_limit",
                        "at most this many pages (default 1000, at most 10000; 0: none)",
                        {"type": "integer", "minimum": 0, "maximum": 10000},
                    ),
                    _query("pages_after", "the pages after this token (a pages_next)"),
                ),
            )
        },
        "/v1/session": {
            "get": _op(
                "a WebSocket session (transactions, watchers, resolvers); needs an Upgrade",
                {"101": {"description": "switching to WebSocket"}},
            )
        },
        "/v1/ledgers": {
            "get": _op(
                "the ledgers",
                {"200": _json({"type": "object", "properties": {"ledgers": NAMES}})},
            )
        },
        "/v1/sync": {
            "post": _op(
                "upload, download and join until a round moves nothing",
                {"200": _json({"type": "object"})},
                params=(
                    _query("ledger", "only this ledger (percent-encoded bytes)"),
                    _query("page", "only this page of the ledger"),
                    _query(
                        "timeout",
                        "seconds, at least 0.001 (else 400 invalid_timeout)",
                        {"type": "number", "minimum": 0.001},
                    ),
                ),
                errors=(400, 409, 503),
            )
        },
        "/v1/ledgers/{ledger}": {
            "delete": _op(
                "delete every page of the ledger (a commit per page, synced)",
                _status_ok("deleted"),
                params=(LEDGER,),
                errors=(400, 404, 413, 507),
            )
        },
        PAGE_PATH: {
            "delete": _op(
                "delete the page: one commit that removes every entry, synced; "
                "listings leave the page out",
                _status_ok("deleted"),
                params=page,
                errors=(400, 404, 413, 507),
            )
        },
        "/v1/ledgers/{ledger}/pages": {
            "get": _op(
                "the pages of a ledger",
                {"200": _json({"type": "object", "properties": {"pages": NAMES}})},
                params=(LEDGER,),
                errors=(400, 404, 413),
            )
        },
        PAGE_PATH + "/keys/{key}": {
            "get": _op(
                "a value (streamed); a part of it with Range or offset and length",
                {
                    "200": {"description": "the value", "content": {BYTES: {"schema": {}}}},
                    "206": {"description": "part of the value", "content": {BYTES: {"schema": {}}}},
                },
                params=(
                    *key,
                    AT,
                    _query("offset", "first byte", {"type": "integer", "minimum": 0}),
                    _query("length", "bytes", {"type": "integer", "minimum": 0}),
                ),
                errors=(400, 404, 413, 414, 416),
            ),
            "head": _op(
                "a value's headers",
                {"200": {"description": "the headers"}, "206": {"description": "the headers"}},
                params=(*key, AT),
                errors=(400, 404, 413, 414, 416),
            ),
            "put": _op(
                "set a key to the body (creates ledger and page)",
                _status_ok("stored"),
                params=(*key, _query("priority", "eager or lazy", {"enum": ["eager", "lazy"]})),
                body={"content": {BYTES: {"schema": {"type": "string", "format": "binary"}}}},
                errors=(400, 408, 413, 414, 507),
            ),
            "delete": _op(
                "delete a key (idempotent)",
                _status_ok("deleted"),
                params=key,
                errors=(400, 404, 413, 414),
            ),
        },
        PAGE_PATH + "/entries": {
            "get": _op(
                "entries in key order, a listing at a time",
                {
                    "200": _json(
                        {
                            "type": "object",
                            "properties": {
                                "entries": {"type": "array", "items": _ref("Entry")},
                                "next": {"type": "string", "nullable": True},
                            },
                        }
                    )
                },
                params=(
                    *page,
                    _query("start", "first key (percent-encoded bytes)"),
                    _query("end", "key after the last"),
                    _query("prefix", "keys starting with these bytes"),
                    _query("limit", "entries", {"type": "integer", "minimum": 1, "maximum": 10000}),
                    _query("token", "continuation token (base64)"),
                    _flag("values", "0: keys and sizes only"),
                    AT,
                ),
                errors=(400, 404, 413),
            )
        },
        PAGE_PATH + "/batch": {
            "post": _op(
                "many puts, deletes and versionstamped writes in one commit",
                {
                    "200": _json(
                        {
                            "type": "object",
                            "properties": {
                                "applied": {"type": "integer"},
                                "versionstamp": {"type": "string", "nullable": True},
                                "versionstamped": {"type": "array", "items": B64},
                            },
                        }
                    )
                },
                params=page,
                body={"required": True, "content": {JSON: {"schema": _ref("Batch")}}},
                errors=(400, 408, 413, 507),
            )
        },
        PAGE_PATH + "/clear": {
            "post": _op(
                "delete every entry (one commit)",
                _status_ok("cleared"),
                params=page,
                errors=(400, 404, 413),
            )
        },
        PAGE_PATH + "/policy": {
            "get": _op(
                "the page's merge policy and its conflicts",
                {"200": _json(_ref("Policy"))},
                params=page,
                errors=(400, 404, 413),
            ),
            "put": _op(
                "set the page's merge policy (remembered)",
                {"200": _json(_ref("Policy"))},
                params=page,
                body={
                    "required": True,
                    "content": {
                        JSON: {
                            "schema": {
                                "type": "object",
                                "required": ["policy"],
                                "properties": {"policy": _ref("PolicyName")},
                            }
                        }
                    },
                },
                errors=(400, 413),
            ),
        },
        PAGE_PATH + "/heads": {
            "get": _op(
                "the page's head commit (local history is a line: a list of one)",
                {
                    "200": _json(
                        {
                            "type": "object",
                            "properties": {
                                "heads": {
                                    "type": "array",
                                    "items": _ref("Commit"),
                                    "minItems": 1,
                                    "maxItems": 1,
                                }
                            },
                        }
                    )
                },
                params=page,
                errors=(400, 404, 413),
            )
        },
        PAGE_PATH + "/history": {
            "get": _op(
                "commits, newest first",
                {
                    "200": _json(
                        {
                            "type": "object",
                            "properties": {"commits": {"type": "array", "items": _ref("Commit")}},
                        }
                    )
                },
                params=(
                    *page,
                    _query("limit", "commits", {"type": "integer", "minimum": 1}),
                    _query("start", "from this commit (hex id)"),
                ),
                errors=(400, 404, 413),
            )
        },
        PAGE_PATH + "/commits/{commit}": {
            "get": _op(
                "one commit",
                {"200": _json(_ref("Commit"))},
                params=(*page, COMMIT),
                errors=(400, 404, 413),
            )
        },
        "/v1/check": {
            "post": _op(
                "check (and repair) pages: SQLite, pieces, commits, heads, journals, the bucket",
                {"200": _json(_ref("CheckReport"))},
                body={"content": {JSON: {"schema": _ref("CheckRequest")}}},
                errors=(400, 404, 413),
            )
        },
        "/v1/gc": {
            "post": _op(
                "prune history past its retention and collect garbage now; what was freed",
                {"200": _json(_ref("GcReport"))},
                body={"content": {JSON: {"schema": _ref("PagesRequest")}}},
                errors=(400, 404, 413),
            )
        },
        "/v1/evict": {
            "post": _op(
                "delete the local copy of a closed, fully synced (or empty) page",
                {"200": _json({"type": "object"})},
                body={"content": {JSON: {"schema": _ref("PagesRequest")}}},
                errors=(400, 404, 409, 413),
            )
        },
        "/v1/du": {
            "get": _op(
                "disk use per page: files, live and stored pieces, commits kept, synced",
                {"200": _json(_ref("DiskUsage"))},
                params=(
                    _query("ledger", "only this ledger (percent-encoded bytes)"),
                    _query("page", "only this page of the ledger (percent-encoded bytes)"),
                ),
                errors=(400, 404, 413),
            )
        },
        "/v1/metrics": {
            "get": _op(
                "the daemon's metrics in Prometheus' text format",
                {"200": {"description": "the metrics", "content": {"text/plain": {"schema": {}}}}},
            )
        },
        "/v1/health": {
            "get": _op(
                "for probes: up, repository open, sync healthy (or why not)",
                {
                    "200": _json(_ref("Health")),
                    "503": _json(_ref("Health"), "the repository is unusable (or sync, ?sync=1)"),
                },
                params=(_flag("sync", "1: answer 503 when sync is not healthy"),),
            )
        },
        "/v1/openapi.json": {"get": _op("this document", {"200": _json({"type": "object"})})},
        **_document_paths(),
        **_conflict_paths(),
    }
    return {
        "openapi": "3.0.3",
        "info": {
            "title": "ledgerd",
            "version": __version__,
            "description": (
                "The HTTP API of ledgerd over its Unix socket "
                "(curl --unix-socket SOCK http://ledgerd/v1/...). Names and keys in paths "
                "are percent-encoded bytes; in JSON, keys, values and names are base64. "
                "Each query parameter takes one value: one given more than once is 400 "
                "bad_request, naming it."
            ),
        },
        "servers": [{"url": "http://ledgerd"}],
        "paths": paths,
        "components": {"schemas": _schemas()},
    }


def _document_paths() -> dict[str, Any]:
    """The documents' routes (``daemon/docs_api.py``, ``indexes_api.py``, ``attachments_api.py``,
    ``changes_api.py``; docs/documents.md)."""
    obj = {"type": "object"}
    col = _path("collection", "collection name")
    did = _path("id", "document id (a ULID, or one the client chose: 1-512 bytes of UTF-8)")
    att = _path("att", "attachment id (a ULID)")
    name = _path("name", "index name")
    page = (LEDGER, PAGE)
    doc = (*page, col, did)
    json_body: dict[str, Any] = {"content": {JSON: {"schema": {}}}}
    raw_body = {"content": {"application/octet-stream": {"schema": {"type": "string"}}}}
    errs = (400, 404, 409, 413)
    base = PAGE_PATH + "/docs"
    listing = (
        _query("limit", "at most this many", {"type": "integer"}),
        _query("token", "continue a listing"),
        _flag("deleted", "1: include soft-deleted documents"),
    )
    rev = (_query("rev", "the expected current revision"), _query("new_rev", "a revision"))
    return {
        base + "/_changes": {
            "get": _op(
                "documents changed since a commit, a page at a time (follow=1: NDJSON)",
                {"200": _json(obj)},
                params=(
                    *page,
                    *listing[:2],
                    _query("since", "a commit id (hex)"),
                    _query("collection", "only this collection"),
                    _flag("follow", "1: stream"),
                    _query("heartbeat", "seconds between empty lines", {"type": "number"}),
                    _flag("conflicts", "1: each document with its kept conflicts' revisions"),
                ),
                errors=errs,
            )
        },
        base + "/{collection}": {
            "get": _op("list a collection", {"200": _json(obj)}, params=(*page, col, *listing)),
            "post": _op(
                "create a document (the body is its _data)",
                {"201": _json(obj)},
                params=(*page, col),
                body=json_body,
                errors=errs,
            ),
        },
        base + "/{collection}/_bulk_docs": {
            "post": _op(
                'write documents in one commit ({"docs": [...]}, CouchDB\'s shape); a result '
                "per document",
                {"201": _json({"type": "array", "items": obj})},
                params=(*page, col),
                body={"content": {JSON: {"schema": obj}}},
                errors=errs,
            )
        },
        base + "/{collection}/_find": {
            "post": _op(
                "a selector query (pouchdb-find's and CouchDB Mango's shape): "
                '{"docs", "bookmark"}',
                {"200": _json(obj)},
                params=(*page, col),
                body={"content": {JSON: {"schema": obj}}},
                errors=errs,
            )
        },
        base + "/{collection}/_explain": {
            "post": _op(
                "the plan a _find request would run: an index, or a scan",
                {"200": _json(obj)},
                params=(*page, col),
                body={"content": {JSON: {"schema": obj}}},
                errors=errs,
            )
        },
        base + "/{collection}/_indexes": {
            "get": _op(
                "the collection's indexes (one whose definition cannot be read here: "
                "null paths, code and message)",
                {"200": _json(_ref("IndexList"))},
                params=(*page, col),
                errors=errs,
            )
        },
        base + "/{collection}/_indexes/{name}": {
            "put": _op(
                "declare an index ({partition, sort?})",
                {"200": _json(_ref("Index"))},
                params=(*page, col, name),
                body={"content": {JSON: {"schema": obj}}},
                errors=errs,
            ),
            "delete": _op("drop an index", _status_ok(), params=(*page, col, name), errors=errs),
        },
        base + "/{collection}/_indexes/{name}/find": {
            "get": _op(
                "query an index",
                {"200": _json(obj)},
                params=(
                    *page,
                    col,
                    name,
                    _query("eq", "the partition value (JSON)"),
                    _query("start", "sort key from (JSON)"),
                    _query("end", "sort key before (JSON)"),
                    *listing,
                ),
                errors=errs,
            )
        },
        base + "/{collection}/_indexes/{name}/rebuild": {
            "post": _op("rebuild an index", _status_ok(), params=(*page, col, name), errors=errs)
        },
        base + "/{collection}/{id}": {
            "get": _op(
                "a document (rev: that revision, the current one or a kept conflict's)",
                {"200": _json(obj)},
                params=(
                    *doc,
                    listing[2],
                    _flag("conflicts", "1: with its kept conflicts' revisions (_meta._conflicts)"),
                    _query("rev", "this revision"),
                ),
                errors=errs,
            ),
            "put": _op(
                "replace a document's _data (If-Match or rev); without either, create the "
                "document with this id (201; 409 when it exists)",
                {"200": _json(obj), "201": _json(obj)},
                params=(
                    *doc,
                    *rev,
                    _query("resolves", "kept conflicts' revisions this one supersedes (R1,R2)"),
                ),
                body=json_body,
                errors=errs,
            ),
            "delete": _op(
                "soft delete; rev naming a kept conflict: remove that conflict",
                {"200": _json(obj)},
                params=(*doc, *rev),
                errors=errs,
            ),
        },
        base + "/{collection}/{id}/purge": {
            "post": _op("purge", {"200": _json(obj)}, params=(*doc, *rev), errors=errs)
        },
        base + "/{collection}/{id}/attachments": {
            "post": _op(
                "add an attachment (raw body)",
                {"201": _json(obj)},
                params=(*doc, _query("filename", "its file name"), *rev),
                body=raw_body,
                errors=errs,
            )
        },
        base + "/{collection}/{id}/attachments/{att}": {
            "put": _op(
                "replace an attachment (raw body)",
                {"200": _json(obj)},
                params=(*doc, att, _query("filename", "its file name"), *rev),
                body=raw_body,
                errors=errs,
            ),
            "get": _op(
                "an attachment's content; a part of it with Range or offset and length",
                {"200": {"description": "the content"}, "206": {"description": "a range"}},
                params=(
                    *doc,
                    att,
                    _query("offset", "first byte", {"type": "integer", "minimum": 0}),
                    _query("length", "bytes", {"type": "integer", "minimum": 0}),
                    listing[2],
                ),
                errors=(*errs, 416),
            ),
            "head": _op(
                "an attachment's size and type",
                {"200": {"description": "headers only"}},
                params=(*doc, att, listing[2]),
                errors=errs,
            ),
            "delete": _op("remove an attachment", {"200": _json(obj)}, params=(*doc, att, *rev)),
        },
    }


INDEX_PATH = {
    "oneOf": [
        {"type": "string", "minLength": 1},
        {"type": "array", "minItems": 1, "items": {"type": "string"}},
    ],
    "description": 'dotted text ("address.city"), or the list of the names when one '
    'holds a dot (["a.b"])',
}


def _schemas() -> dict[str, Any]:
    return {
        **_conflict_schemas(),
        "Index": {
            "type": "object",
            "required": ["collection", "name", "partition", "sort", "ready"],
            "properties": {
                "collection": {"type": "string"},
                "name": {"type": "string"},
                "partition": {
                    **INDEX_PATH,
                    "nullable": True,
                    "description": "the partition path; null when the definition cannot "
                    "be read here (see code)",
                },
                "sort": {**INDEX_PATH, "nullable": True, "description": "the sort path, or null"},
                "ready": {"type": "boolean", "description": "built (false while building)"},
                "code": {
                    "type": "string",
                    "enum": ["corrupt", "unsupported_layout"],
                    "description": "only when the definition cannot be read here: "
                    "unsupported_layout (a newer ledgerd's), corrupt (damaged)",
                },
                "message": {
                    "type": "string",
                    "description": "only with code: why, and what to do",
                },
            },
        },
        "IndexList": {
            "type": "object",
            "required": ["indexes"],
            "properties": {"indexes": {"type": "array", "items": _ref("Index")}},
        },
        "Error": {
            "type": "object",
            "required": ["error"],
            "properties": {
                "error": {
                    "type": "object",
                    "required": ["code", "message"],
                    "properties": {"code": {"type": "string"}, "message": {"type": "string"}},
                }
            },
        },
        "Entry": {
            "type": "object",
            "properties": {
                "key": B64,
                "value": {**B64, "nullable": True},
                "priority": {"enum": ["eager", "lazy"]},
                "size": {"type": "integer"},
            },
        },
        "Batch": {
            "type": "object",
            "required": ["ops"],
            "properties": {
                "ops": {
                    "type": "array",
                    "items": {
                        "type": "object",
                        "required": ["op", "key"],
                        "properties": {
                            "op": {
                                "enum": [
                                    "put",
                                    "delete",
                                    "set_versionstamped_key",
                                    "set_versionstamped_value",
                                ]
                            },
                            "key": B64,
                            "value": B64,
                            "priority": {"enum": ["eager", "lazy"]},
                        },
                    },
                }
            },
        },
        "PolicyName": {"enum": ["last_one_wins", "automatic_with_fallback", "custom"]},
        "Policy": {
            "type": "object",
            "properties": {
                "policy": _ref("PolicyName"),
                "heads": {
                    "type": "integer",
                    "description": "always 1: local history is a line",
                },
                "conflicts": {
                    "type": "integer",
                    "description": "keys whose siblings (concurrent writes, kept under every "
                    "policy) hold different values",
                },
                "conflict": {
                    "type": "string",
                    "nullable": True,
                    "description": "why the conflicts wait for a resolver (none connected, "
                    "or it failed), or null",
                },
            },
        },
        "Commit": {
            "type": "object",
            "properties": {
                "id": {"type": "string"},
                "parents": {
                    "type": "array",
                    "items": {"type": "string"},
                    "maxItems": 1,
                    "description": "the commit before it on this device (none for the first)",
                },
                "timestamp": {"type": "integer"},
                "generation": {"type": "integer"},
            },
        },
        "Status": {
            "type": "object",
            "required": ["version", "device_id", "open_pages", "pages", "devices", "conflicts"],
            "properties": {
                "version": {"type": "string"},
                "device_id": {"type": "string"},
                "cloud": {"type": "string", "nullable": True},
                "sync": {"type": "object", "nullable": True},
                "open_pages": NAMES,
                "pages": {"type": "array", "items": _ref("PageSync")},
                "pages_total": {"type": "integer", "nullable": True},
                "pages_next": {"type": "string", "nullable": True},
                "devices": {"type": "array", "items": _ref("Device")},
                "conflicts": {"type": "array", "items": _ref("PageConflicts")},
            },
        },
        "PageSync": {
            "type": "object",
            "description": "a page stored here and its sync (no page is opened for it)",
            "properties": {
                "ledger": B64,
                "page": B64,
                "open": {"type": "boolean"},
                "evicted": {"type": "boolean"},
                "sync": {"enum": ["off", "local", "synced", "pending", "error"]},
                "last_sync": {
                    "type": "number",
                    "nullable": True,
                    "description": "UNIX time of its last upload or import recorded here",
                },
                "last_error": {"type": "string", "nullable": True},
                "conflicts": {
                    "type": "integer",
                    "nullable": True,
                    "description": "keys with concurrent values (null: not known, closed)",
                },
                "conflict": {"type": "string", "nullable": True},
            },
        },
        "Device": {
            "type": "object",
            "description": "a device the bucket's feed showed (this one first)",
            "properties": {
                "device": {"type": "string"},
                "this_device": {"type": "boolean"},
                "last_pack_at": {
                    "type": "number",
                    "nullable": True,
                    "description": "the feed time (UNIX seconds) of its newest pack listed",
                },
                "last_seq": {"type": "integer", "nullable": True},
                "clock_ahead_s": {
                    "type": "number",
                    "nullable": True,
                    "description": "its clock is at least this far ahead of this one "
                    "(negative: at most that far behind); null: none of its writes imported",
                },
                "clock_seen_at": {"type": "number", "nullable": True},
                "error": {"type": "string", "nullable": True},
            },
        },
        "PageConflicts": {
            "type": "object",
            "description": "a page whose keys hold concurrent values",
            "properties": {
                "ledger": B64,
                "page": B64,
                "keys": {"type": "integer"},
                "policy": {"type": "string", "nullable": True, "description": "(open pages)"},
                "waiting": {"type": "string", "nullable": True},
                "open": {
                    "type": "boolean",
                    "description": "false: the page is closed, and this is its last sync's",
                },
                "resolver_connected": {"type": "boolean"},
            },
        },
        "Health": {
            "type": "object",
            "required": ["status", "up", "repository", "sync"],
            "properties": {
                "status": {"enum": ["ok", "degraded", "failing"]},
                "up": {"type": "boolean"},
                "repository": {"type": "object"},
                "sync": {"type": "object"},
            },
        },
        "CheckRequest": {
            "type": "object",
            "additionalProperties": False,
            "properties": {
                "ledger": B64,
                "page": B64,
                "cloud": {"type": "boolean"},
                "repair": {"type": "boolean"},
            },
        },
        "PagesRequest": {
            "type": "object",
            "additionalProperties": False,
            "properties": {"ledger": B64, "page": B64},
        },
        "GcReport": {
            "type": "object",
            "required": ["collected_pages", "pieces_freed", "bytes_freed", "errors", "pages"],
            "properties": {
                "collected_pages": {"type": "integer"},
                "commits_pruned": {"type": "integer"},
                "pieces_freed": {"type": "integer"},
                "bytes_freed": {"type": "integer"},
                "file_bytes_before": {"type": "integer"},
                "file_bytes_after": {"type": "integer"},
                "errors": NAMES,
                "pages": NAMES,
            },
        },
        "DiskUsage": {
            "type": "object",
            "required": ["file_bytes", "live_bytes", "pages"],
            "properties": {
                "file_bytes": {"type": "integer"},
                "live_bytes": {"type": "integer"},
                "pages": NAMES,
            },
        },
        "CheckReport": {
            "type": "object",
            "required": ["healthy", "checked_pages", "problems", "repaired", "pages"],
            "properties": {
                "healthy": {"type": "boolean"},
                "checked_pages": {"type": "integer"},
                "problems": {"type": "integer"},
                "repaired": {"type": "integer"},
                "cloud": {"type": "boolean"},
                "repair": {"type": "boolean"},
                "pages": {"type": "array", "items": {"type": "object"}},
            },
        },
    }


def _conflict_paths() -> dict[str, Any]:
    """Conflicts listed and resolved by hand (``daemon/conflicts_api.py``; docs/merging.md)."""
    limit = _query("limit", "conflicting keys per page, 1-1000 (default 100)", {"type": "integer"})
    return {
        "/v1/conflicts": {
            "get": _op(
                "the conflicts of every open page holding some, or of every page of a ledger",
                {
                    "200": _json(
                        {
                            "type": "object",
                            "required": ["pages"],
                            "properties": {
                                "pages": {"type": "array", "items": _ref("PageConflicts")}
                            },
                        }
                    )
                },
                params=(_query("ledger", "every page of this ledger (percent-encoded)"), limit),
                errors=(400, 404),
            )
        },
        PAGE_PATH + "/conflicts": {
            "get": _op(
                "the page's conflicting keys, each with its siblings",
                {"200": _json(_ref("PageConflicts"))},
                params=(
                    LEDGER,
                    PAGE,
                    _query("start", "from this key on (percent-encoded; a listing's next)"),
                    limit,
                ),
                errors=(400, 404),
            )
        },
        PAGE_PATH + "/conflicts/resolve": {
            "post": _op(
                "resolve a key's conflict (or every one of the page): a write that "
                "supersedes exactly its siblings, synced like any write",
                {
                    "200": _json(
                        {
                            "type": "object",
                            "required": ["resolved", "conflicts"],
                            "properties": {
                                "resolved": {"type": "array", "items": B64},
                                "conflicts": {
                                    "type": "integer",
                                    "description": "conflicts left on the page",
                                },
                            },
                        }
                    )
                },
                params=(LEDGER, PAGE),
                body={"required": True, "content": {JSON: {"schema": _ref("Resolve")}}},
                errors=(400, 404, 409, 413, 503),
            )
        },
    }


def _conflict_schemas() -> dict[str, Any]:
    side = {
        "type": "object",
        "required": ["deleted", "value", "size", "priority", "time", "device"],
        "properties": {
            "deleted": {"type": "boolean", "description": "the sibling is a delete"},
            "value": {
                **B64,
                "nullable": True,
                "description": "null when deleted, over 1 MiB or not on this device",
            },
            "size": {"type": "integer", "nullable": True},
            "priority": {"enum": ["eager", "lazy"]},
            "time": {"type": "integer", "description": "when it was written (microseconds)"},
            "device": {"type": "string", "description": "the writing device's tag (hex)"},
        },
    }
    expect = {"type": "string", "pattern": "^[0-9a-f]{16}$"}
    return {
        "ConflictSide": side,
        "KeyConflict": {
            "type": "object",
            "required": ["key", "expect", "ours", "theirs"],
            "properties": {
                "key": B64,
                "expect": {**expect, "description": "names the key's siblings (resolve)"},
                "ours": {**_ref("ConflictSide"), "description": "what reads show now"},
                "theirs": {"type": "array", "items": _ref("ConflictSide"), "minItems": 1},
            },
        },
        "PageConflicts": {
            "type": "object",
            "properties": {
                "ledger": B64,
                "page": B64,
                "ledger_text": {"type": "string", "nullable": True},
                "page_text": {"type": "string", "nullable": True},
                "device": {"type": "string", "description": "this device's tag (hex)"},
                "policy": {"type": "string"},
                "count": {"type": "integer", "description": "conflicting keys of the page"},
                "conflict": {"type": "string", "nullable": True},
                "conflicts": {"type": "array", "items": _ref("KeyConflict")},
                "next": {**B64, "nullable": True, "description": "the next listing's start"},
                "expect": {
                    **expect,
                    "nullable": True,
                    "description": "names every conflict of the page (a whole listing)",
                },
            },
        },
        "Resolve": {
            "type": "object",
            "required": ["take"],
            "properties": {
                "key": {**B64, "description": "the key; every conflict of the page if absent"},
                "take": {
                    "oneOf": [
                        {"enum": ["ours", "theirs", "delete"]},
                        {"type": "object", "required": ["value"], "properties": {"value": B64}},
                    ]
                },
                "expect": {**expect, "description": "refuse siblings that changed (409)"},
            },
        },
    }
