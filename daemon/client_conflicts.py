"""The clients' conflicts: listing them and resolving them by hand.

This module owns what ``AsyncClient.conflicts`` and ``AsyncClient.resolve`` (and the
blocking ``Client``'s, through the bridge) send and answer: the result types
(:class:`PageConflicts`, :class:`PendingConflict`, :class:`Sibling`, :class:`Resolved`)
decoded from ``/v1/conflicts``, ``/v1/ledgers/{L}/pages/{P}/conflicts`` and its
``/resolve``, and the resolution's body. Talking HTTP is
:mod:`ledgerd.daemon.client_async`'s.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal

from ledgerd.daemon.client_types import LedgerError, b64, unb64
from ledgerd.daemon.client_urls import Name, raw

TakeName = Literal["ours", "theirs", "delete"]


@dataclass(frozen=True, slots=True)
class Sibling:
    """One of a key's concurrent versions. ``value`` is None when it is a delete
    (``deleted``), over 1 MiB (``size`` says how large) or not on the daemon's device
    (``size`` None too); ``time`` is when it was written (microseconds since the epoch),
    ``device`` the writing device's tag (hex)."""

    value: bytes | None
    size: int | None
    priority: str
    deleted: bool
    time: int
    device: str


@dataclass(frozen=True, slots=True)
class PendingConflict:
    """A key whose siblings hold different values: ``ours`` is what reads show now,
    ``theirs`` the others; ``expect`` names them all (pass it to :meth:`resolve` to refuse
    siblings that changed since)."""

    key: bytes
    expect: str
    ours: Sibling
    theirs: list[Sibling]


@dataclass(frozen=True, slots=True)
class PageConflicts:
    """A page's conflicts: ``count`` keys conflict, ``conflicts`` lists them (all, unless
    a ``limit`` cut the listing: then ``next`` is the key it would go on from);
    ``conflict`` is why they wait for a resolver (None if none is waited for);
    ``expect`` names every conflict of the page (None when the listing is not whole);
    ``device`` is the daemon's device's tag (a :class:`Sibling` it wrote has it)."""

    ledger: bytes
    page: bytes
    device: str
    policy: str
    count: int
    conflict: str | None
    conflicts: list[PendingConflict]
    next: bytes | None
    expect: str | None


@dataclass(frozen=True, slots=True)
class Resolved:
    """What a resolution did: the keys resolved, and the conflicts left on the page."""

    keys: list[bytes]
    conflicts: int


def _sibling(doc: dict[str, Any]) -> Sibling:
    value = doc.get("value")
    return Sibling(
        value=None if value is None else unb64(value),
        size=doc.get("size"),
        priority=str(doc["priority"]),
        deleted=bool(doc["deleted"]),
        time=int(doc["time"]),
        device=str(doc["device"]),
    )


def page_conflicts(doc: dict[str, Any]) -> PageConflicts:
    """A page's conflicts from the daemon's JSON."""
    nxt = doc.get("next")
    return PageConflicts(
        ledger=unb64(doc["ledger"]),
        page=unb64(doc["page"]),
        device=str(doc["device"]),
        policy=str(doc["policy"]),
        count=int(doc["count"]),
        conflict=doc.get("conflict"),
        conflicts=[
            PendingConflict(
                key=unb64(c["key"]),
                expect=str(c["expect"]),
                ours=_sibling(c["ours"]),
                theirs=[_sibling(t) for t in c["theirs"]],
            )
            for c in doc["conflicts"]
        ],
        next=None if nxt is None else unb64(nxt),
        expect=doc.get("expect"),
    )


def resolve_body(
    key: Name | None, take: TakeName | None, value: bytes | None, expect: str | None
) -> dict[str, Any]:
    """The body of ``POST .../conflicts/resolve``: exactly one of ``take`` and ``value``."""
    if (take is None) == (value is None):
        raise LedgerError("bad_request", "give take ('ours', 'theirs' or 'delete') or a value")
    body: dict[str, Any] = {"take": take if value is None else {"value": b64(value)}}
    if key is not None:
        body["key"] = b64(raw(key))  # (a str as UTF-8, as every client method takes it)
    if expect is not None:
        body["expect"] = expect
    return body


def resolved(doc: dict[str, Any]) -> Resolved:
    return Resolved([unb64(k) for k in doc["resolved"]], int(doc["conflicts"]))
