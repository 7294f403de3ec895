"""What a session's requests do on a transaction, and the events a watcher sends: a
request's fields in, the reply's fields out (reads, writes, listings, a commit).

Which transaction a request names, its lifetime and the connection are
:mod:`ledgerd.daemon.session`'s.
"""

from __future__ import annotations

from typing import Any

from ledgerd.daemon import errors as ae
from ledgerd.daemon.api import DEFAULT_LIMIT, MAX_LIMIT
from ledgerd.daemon.codec import (
    b64,
    entries_json,
    parse_priority,
    priority_name,
    stamped_key,
    stamped_value,
    unb64,
)
from ledgerd.store import Notification, Transaction


def opt_bytes(req: dict[str, Any], name: str) -> bytes | None:
    """A request's optional base64 field ``name``."""
    v = req.get(name)
    return None if v is None else unb64(v, name)


async def get(txn: Transaction, req: dict[str, Any], max_batch_bytes: int) -> dict[str, Any]:
    entry = await txn.get_entry(unb64(req.get("key"), "key"))
    if entry is None:
        return {"found": False}
    # The reply carries the whole value: no larger than a session message may be
    # (max_batch_bytes, as base64), checked before anything is read.
    size, most = await txn.objects.size(entry.value), max_batch_bytes
    if 4 * -(-size // 3) > most:
        raise ae.TooLarge(
            f"the value of {size} bytes is over what a session message carries "
            f"({most} bytes as base64, max_batch_bytes): read it by key over HTTP"
        )
    value = await txn.objects.read_all(entry.value)
    return {"found": True, "value": b64(value), "priority": priority_name(entry.priority)}


async def put(txn: Transaction, req: dict[str, Any]) -> dict[str, Any]:
    prio = req.get("priority")
    await txn.put(
        unb64(req.get("key"), "key"),
        unb64(req.get("value"), "value"),
        parse_priority(prio),
    )
    return {}


async def set_versionstamped_key(txn: Transaction, req: dict[str, Any]) -> dict[str, Any]:
    """``key`` is a template (its trailing 4-byte offset included), completed at commit."""
    prio = req.get("priority")
    await txn.set_versionstamped_key(
        stamped_key(unb64(req.get("key"), "key"), "key").template,
        unb64(req.get("value"), "value"),
        parse_priority(prio),
    )
    return {}


async def set_versionstamped_value(txn: Transaction, req: dict[str, Any]) -> dict[str, Any]:
    """``value`` is a template (its trailing 4-byte offset included), completed at commit."""
    prio = req.get("priority")
    await txn.set_versionstamped_value(
        unb64(req.get("key"), "key"),
        stamped_value(unb64(req.get("value"), "value"), "value").template,
        parse_priority(prio),
    )
    return {}


async def entries(txn: Transaction, req: dict[str, Any], max_listing_bytes: int) -> dict[str, Any]:
    limit = req.get("limit", DEFAULT_LIMIT)
    if type(limit) is not int or not 1 <= limit <= MAX_LIMIT:
        raise ae.BadRequest(f"limit must be an integer from 1 to {MAX_LIMIT}")
    found, nxt = await txn._page(
        opt_bytes(req, "start"),
        opt_bytes(req, "end"),
        opt_bytes(req, "prefix"),
        limit,
        opt_bytes(req, "token"),
    )
    out, n = await entries_json(txn, found, True, max_listing_bytes)
    if n < len(found):  # the message is full: the next listing starts at the first left out
        nxt = found[n][0]
    return {"entries": out, "next": b64(nxt) if nxt is not None else None}


def committed(txn: Transaction, cid: bytes | None) -> dict[str, Any]:
    """The reply to a commit: its id (None: nothing changed) and versionstamps."""
    stamp = txn.versionstamp
    return {
        "commit": cid.hex() if cid else None,
        "versionstamp": stamp.hex() if stamp is not None else None,
        "versionstamped_keys": [b64(k) for k in txn.versionstamped_keys],
    }


def change_event(wid: str, note: Notification) -> dict[str, Any]:
    """Watcher ``wid``'s ``change`` event for a commit's notification."""
    return {
        "event": "change",
        "watch": wid,
        "commit": note.commit.hex(),
        "changed": [
            {
                "key": b64(c.key),
                "value": b64(c.value) if c.value is not None else None,
                "priority": priority_name(c.priority),
                "size": c.size,
            }
            for c in note.changed
        ],
        "deleted": [b64(k) for k in note.deleted],
    }
