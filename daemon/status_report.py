"""What ``/v1/status`` adds to the daemon's facts: every page, the devices, the conflicts.

This module owns the ``pages`` listing of ``GET /v1/status`` (every page stored here,
in name order, a bounded number per request with a continuation token), its
``devices`` and its ``conflicts``. Pages are listed from the data directory and the
usage database, and their sync state comes from what sync recorded
(:meth:`ledgerd.sync.engine.SyncEngine.page_states`): no page is opened. Open pages
add what only an open page knows (heads, conflicts, unuploaded writes). The route
itself is :func:`ledgerd.daemon.status_api.status`.
"""

from __future__ import annotations

from typing import Any

from ledgerd.daemon import errors as ae
from ledgerd.daemon.codec import b64, text_or_none, token_param
from ledgerd.daemon.collector import SYNC_OFF, pages_of
from ledgerd.store import Repository
from ledgerd.sync.engine import SyncEngine

PAGES_LIMIT = 1000
"""Pages in one ``/v1/status`` by default (``pages_limit``)."""
MAX_PAGES_LIMIT = 10_000
"""The most ``pages_limit`` takes."""

Key = tuple[bytes, bytes]


def page_token(key: Key) -> str:
    """The continuation token of the pages after ``key``: its names, length-prefixed."""
    return b64(bytes([len(key[0])]) + key[0] + key[1])


def token_key(text: str) -> Key:
    raw = token_param(text)
    if not raw or not 0 < raw[0] < len(raw) - 1:  # (both names hold a byte at least)
        raise ae.BadRequest("query parameter pages_after is not a token status gave")
    return raw[1 : 1 + raw[0]], raw[1 + raw[0] :]


def _names(key: Key) -> dict[str, Any]:
    return {
        "ledger": b64(key[0]),
        "page": b64(key[1]),
        "ledger_text": text_or_none(key[0]),
        "page_text": text_or_none(key[1]),
    }


async def pages_report(
    repo: Repository,
    engine: SyncEngine | None,
    open_docs: dict[Key, dict[str, Any]],
    limit: int,
    after: Key | None,
) -> dict[str, Any]:
    """``pages`` (at most ``limit``, after ``after``; none listed for a ``limit`` of 0),
    ``pages_total`` and ``pages_next`` (the token of the pages that follow; None at the
    end). ``engine`` is None when sync is off; ``open_docs`` are the entries of
    ``open_pages``, by key."""
    if not limit:  # (a client polling for something else)
        return {"pages": [], "pages_total": None, "pages_next": None}
    keys = await pages_of(repo, None, None)
    total = len(keys)
    if after is not None:
        keys = [k for k in keys if k > after]
    shown = keys[:limit]
    states = engine.page_states(shown) if engine is not None else None
    pages = []
    for i, key in enumerate(shown):
        doc: dict[str, Any] = {
            **_names(key),
            "open": key in open_docs,
            "evicted": repo.is_evicted(*key),
            "sync": SYNC_OFF,
            "last_sync": None,
            "last_error": None,
            "conflicts": None,
            "conflict": None,
        }
        if states is not None:
            doc.update(states[i])
        opened = open_docs.get(key)
        if opened is not None:
            doc["conflicts"], doc["conflict"] = opened["conflicts"], opened["conflict"]
            if doc["sync"] in ("pending", "synced"):  # an open page knows for sure
                doc["sync"] = opened["sync"]
        pages.append(doc)
    more = len(keys) > len(shown)
    return {
        "pages": pages,
        "pages_total": total,
        "pages_next": page_token(shown[-1]) if more and shown else None,
    }


async def conflicts_report(
    repo: Repository, engine: SyncEngine | None, open_docs: dict[Key, dict[str, Any]]
) -> list[dict[str, Any]]:
    """The pages whose keys hold concurrent values: how many, whether they wait for a
    resolver (``waiting``: why) and whether one is connected for the ledger. An open
    page says it now; one that is not, as it was at its last sync (``open`` false)."""
    found: dict[Key, dict[str, Any]] = {}
    for key, count, waiting in engine.conflicted() if engine is not None else []:
        if key not in open_docs and await repo.page_listed(*key):
            found[key] = {"keys": count, "policy": None, "waiting": waiting, "open": False}
    for key, doc in open_docs.items():
        if doc["conflicts"] or doc["conflict"]:
            found[key] = {
                "keys": doc["conflicts"],
                "policy": doc["policy"],
                "waiting": doc["conflict"],
                "open": True,
            }
    resolvers = repo.hooks.resolvers
    return [
        {
            **_names(key),
            **found[key],
            "resolver_connected": bool(resolvers and resolvers.resolver_for(key[0])),
        }
        for key in sorted(found)
    ]
