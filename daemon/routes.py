"""The API's route table: every method and path under ``/v1/`` and its handler.

This module owns :data:`ROUTES` (the table in docs/http-api.md), in the order they are
tried, and :data:`ROUTER`, their index. Matching is :mod:`daemon.router`'s, the plumbing
around a handler :mod:`daemon.api`'s, the handlers are the ``*_api`` modules'.
"""

from __future__ import annotations

from typing import TypeAlias

from ledgerd.daemon import (
    admin_api,
    attachments_api,
    changes_api,
    conflicts_api,
    docs_api,
    indexes_api,
    keys_api,
    pages_api,
    router,
    status_api,
)
from ledgerd.daemon.api import Endpoint
from ledgerd.daemon.router import Router, route

Route: TypeAlias = router.Route[Endpoint]
"""A route of this API."""

PAGE = "ledgers/{ledger}/pages/{page}"
DOCS = PAGE + "/docs/{collection}"
ROUTES: list[Route] = [
    route("GET", "status", status_api.status),
    route("GET", "session", keys_api.session, counted=False),
    route("GET", "ledgers", pages_api.ledgers),
    route("POST", "sync", admin_api.sync),
    route("DELETE", "ledgers/{ledger}", pages_api.delete_ledger),
    route("GET", "ledgers/{ledger}/pages", pages_api.pages),
    route("DELETE", PAGE, pages_api.delete_page),
    route("GET HEAD", PAGE + "/keys/{key*}", keys_api.get_key),
    route("PUT", PAGE + "/keys/{key*}", keys_api.put_key),
    route("DELETE", PAGE + "/keys/{key*}", keys_api.delete_key),
    route("GET", PAGE + "/entries", keys_api.entries),
    route("POST", PAGE + "/batch", keys_api.batch),
    route("POST", PAGE + "/clear", keys_api.clear),
    route("GET PUT", PAGE + "/policy", pages_api.policy),
    route("GET", "conflicts", conflicts_api.all_conflicts),
    route("GET", PAGE + "/conflicts", conflicts_api.page_conflicts),
    route("POST", PAGE + "/conflicts/resolve", conflicts_api.resolve),
    route("GET", PAGE + "/heads", pages_api.heads),
    route("GET", PAGE + "/history", pages_api.history),
    route("GET", PAGE + "/commits/{commit}", pages_api.commit),
    # Documents: literal segments before {collection} and {id}.
    route("GET", PAGE + "/docs/_changes", changes_api.changes),
    route("GET", DOCS, docs_api.list_documents),
    route("POST", DOCS, docs_api.create_document),
    route("POST", DOCS + "/_bulk_docs", docs_api.bulk_docs),
    route("POST", DOCS + "/_find", indexes_api.find_documents),
    route("POST", DOCS + "/_explain", indexes_api.explain_find),
    route("GET", DOCS + "/_indexes", indexes_api.list_indexes),
    route("PUT", DOCS + "/_indexes/{name}", indexes_api.declare_index),
    route("DELETE", DOCS + "/_indexes/{name}", indexes_api.drop_index),
    route("GET", DOCS + "/_indexes/{name}/find", indexes_api.find),
    route("POST", DOCS + "/_indexes/{name}/rebuild", indexes_api.rebuild_index),
    route("GET", DOCS + "/{id}", docs_api.get_document),
    route("PUT", DOCS + "/{id}", docs_api.replace_document),
    route("DELETE", DOCS + "/{id}", docs_api.delete_document),
    route("POST", DOCS + "/{id}/purge", docs_api.purge_document),
    route("POST", DOCS + "/{id}/attachments", attachments_api.add_attachment),
    route("PUT", DOCS + "/{id}/attachments/{att}", attachments_api.add_attachment),
    route("GET HEAD", DOCS + "/{id}/attachments/{att}", attachments_api.get_attachment),
    route("DELETE", DOCS + "/{id}/attachments/{att}", attachments_api.delete_attachment),
    # Operations: check and repair, garbage collection, disk usage, eviction, health,
    # metrics, the API description.
    route("POST", "check", admin_api.check),
    route("POST", "gc", admin_api.gc),
    route("GET", "du", admin_api.du),
    route("POST", "evict", admin_api.evict),
    route("GET", "openapi.json", status_api.openapi),
    route("GET", "metrics", status_api.metrics_text, counted=False),
    route("GET", "health", status_api.health, counted=False),
]
"""The API's routes (the table in docs/http-api.md), tried in order."""

ROUTER = Router(ROUTES)
