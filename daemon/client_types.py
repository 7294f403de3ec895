"""What the Python clients share: errors, result types, names and the socket.

This module owns the pieces that :mod:`ledgerd.daemon.client_async`,
:mod:`ledgerd.daemon.client_session`, :mod:`ledgerd.daemon.client_blocking` and
:mod:`ledgerd.daemon.client_docs` all speak: the exceptions a client raises
(:class:`LedgerError` and its subclasses) and how a failed or dropped connection
becomes one, the results it returns (:class:`Item`, :class:`Change`, a resolver's
:class:`ResolveRequest` and the :data:`Answer` to it), how names and keys are quoted
into URLs, and which socket a client uses. It does no I/O of its own. Client programs
import these names from :mod:`ledgerd.daemon.client`.
"""

from __future__ import annotations

import base64
import contextlib
import errno
import os
import stat
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aiohttp

from ledgerd.daemon.client_urls import Name as Name
from ledgerd.daemon.client_urls import quote as quote
from ledgerd.daemon.client_urls import raw as raw
from ledgerd.daemon.socketdir import socket_file

Progress = Callable[[int, int | None], None]
"""Called with (bytes done, total or None) during long transfers."""

CHUNK = 256 * 1024


class LedgerError(Exception):
    """The daemon refused a request: ``code`` is stable, ``status`` is the HTTP status."""

    def __init__(self, code: str, message: str, status: int = 0) -> None:
        super().__init__(message)
        self.code = code
        self.status = status


class NotFoundError(LedgerError):
    """The ledger, page, key or commit does not exist (HTTP 404)."""


class DaemonUnavailableError(LedgerError):
    """The daemon is not running or its socket cannot be reached."""


class UnsafeSocketError(LedgerError):
    """The socket is in a directory that others can write: they could have replaced it."""


DISCONNECTED = (aiohttp.ClientConnectionError, aiohttp.ClientPayloadError, ConnectionError)
"""What a daemon that is not there, or goes away mid-request, raises from aiohttp."""


@contextlib.contextmanager
def reaching(socket: Path) -> Iterator[None]:
    """Turn a connection that fails or drops (at any point of a request, body included),
    or a request that the client's ``timeout`` ended, into :class:`DaemonUnavailableError`."""
    try:
        yield
    except DISCONNECTED as e:
        why: object = e or type(e).__name__
        if isinstance(e, aiohttp.ClientConnectorError):  # what connect() said, without
            # aiohttp's host and TLS asides (and its "[None]" for an error with no errno:
            # a path too long for a socket)
            why = e.os_error.strerror or e.os_error
            if e.os_error.errno == errno.ECONNREFUSED:
                why = _not_a_socket(socket) or why
        raise DaemonUnavailableError(
            "unavailable", f"cannot reach ledgerd at {socket}: {why}"
        ) from None
    except TimeoutError:  # aiohttp's total timeout: a bare TimeoutError
        raise DaemonUnavailableError(
            "unavailable", f"cannot reach ledgerd at {socket}: no answer within the timeout"
        ) from None


NOT_A_SOCKET = "not a socket (ledgerd does not replace it: remove it, or use another path)"
"""How :func:`reaching` ends the reason when the path holds something else than a socket."""


def _not_a_socket(path: Path) -> str | None:
    """Why connect() was refused when something else than a socket is at ``path`` (a file
    or directory: ledgerd refuses to start there, so "start it" would not help), or None."""
    try:
        mode = os.stat(path).st_mode
    except OSError:
        return None
    if stat.S_ISSOCK(mode):
        return None
    kinds = ((stat.S_ISDIR, "a directory"), (stat.S_ISREG, "a regular file"))
    kind = next((name for test, name in kinds if test(mode)), "a special file")
    return f"{path} is {kind}, {NOT_A_SOCKET}"


def socket_path(path: str | Path | None = None) -> Path:
    """The socket to use: the argument, ``$LEDGERD_SOCKET``, or the daemon's default."""
    return Path(socket_file(path))


def b64(data: bytes) -> str:
    """Bytes as the API's base64 (the daemon's :func:`~ledgerd.daemon.codec.b64`)."""
    return base64.b64encode(data).decode()


def unb64(text: str) -> bytes:
    """The daemon's base64 (trusted: the daemon wrote it)."""
    return base64.b64decode(text)


@dataclass(frozen=True, slots=True)
class Item:
    """One entry of a range: ``value`` is None for values over the inline limit (see size).

    In a watch's :class:`Change`, ``value`` and ``size`` are both None for a LAZY value
    that is not on the daemon's device (it came through sync and was never read there);
    a range's items always have their size."""

    key: bytes
    value: bytes | None
    priority: str
    size: int | None


@dataclass(frozen=True, slots=True)
class Change:
    """A watch event: one commit's changes."""

    commit: str
    changed: list[Item]
    deleted: list[bytes]


@dataclass(frozen=True, slots=True)
class Side:
    """One side of a conflict: the value (None if over the inline limit), size, priority."""

    value: bytes | None
    size: int
    priority: str


@dataclass(frozen=True, slots=True)
class ConflictItem:
    """One key's conflict: ``left`` is the version reads show (the winner: the larger
    dot), ``right`` the newest sibling holding another value; None is a delete.
    ``base`` is always None (no common ancestor is known)."""

    key: bytes
    base: Side | None
    left: Side | None
    right: Side | None


@dataclass(frozen=True, slots=True)
class ResolveRequest:
    """Conflicts of a page waiting for this client's answers. ``left`` and ``right``
    both name the head commit the conflicts were read at (history is a line)."""

    ledger: bytes
    page: bytes
    policy: str
    left: str
    right: str
    conflicts: list[ConflictItem]


Answer = dict[bytes, str | bytes | None]
"""Per key: "left", "right", None (delete) or new value bytes."""
ResolverCallback = Callable[[ResolveRequest], Awaitable[Answer]]


async def paged(
    fetch: Callable[[int, str | None], Awaitable[dict[str, Any]]],
    field: str,
    limit: int | None,
    page_size: int,
) -> AsyncIterator[Any]:
    """The ``field`` items of the pages ``fetch(want, token)`` answers, each page's
    ``next`` token asking for the following one, until the last page or ``limit`` items."""
    token: str | None = None
    sent = 0
    while True:
        want = page_size if limit is None else min(page_size, limit - sent)
        if want <= 0:
            return
        page = await fetch(want, token)
        for item in page[field]:
            yield item
            sent += 1
        token = page["next"]
        if token is None:
            return


def item_of(d: dict[str, Any]) -> Item:
    """An :class:`Item` from the daemon's JSON (of a range, a watch event, a transaction)."""
    v, size = d.get("value"), d.get("size")
    return Item(
        unb64(d["key"]),
        None if v is None else unb64(v),
        d["priority"],
        None if size is None else int(size),
    )
