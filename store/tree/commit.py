"""Commits: immutable snapshots of a page's local history and their identifiers.

This module owns the commit record, its deterministic encoding and id, and the
well-known first commit every page starts from. It does not store commits
(:mod:`store.page.graph` does) nor pick their times (the page's clock,
:meth:`store.page.graph.CommitGraph.next_time`).

Commit = ``(parents, timestamp, generation, root, salt)``; its id is SHA-256 over
the msgpack encoding ``[1, parents, timestamp, generation, root, salt]``. History
is a line kept on each device, so a commit has one parent (the first has none).
Timestamps are microseconds since the UNIX epoch; a commit that writes gives its
time to its entries' dots (:mod:`store.tree.dots`).
"""

from __future__ import annotations

import hashlib
import os
import time
from dataclasses import dataclass

import msgpack

from ledgerd.store.errors import CorruptObjectError
from ledgerd.store.tree.btree import EMPTY

FORMAT = 1
ID_SIZE = 32
MAX_PARENTS = 1
"""Parents a commit may have: history is a line."""
INT_MAX = (1 << 63) - 1
"""Largest timestamp or generation (SQLite's INTEGER)."""


@dataclass(frozen=True, slots=True)
class Commit:
    id: bytes
    parents: tuple[bytes, ...]
    timestamp: int
    generation: int
    root: bytes
    salt: bytes
    data: bytes


def _encode(
    parents: tuple[bytes, ...], timestamp: int, generation: int, root: bytes, salt: bytes
) -> bytes:
    return msgpack.packb(  # type: ignore[no-any-return]
        [FORMAT, list(parents), timestamp, generation, root, salt], use_bin_type=True
    )


def make(
    parents: tuple[bytes, ...], timestamp: int, generation: int, root: bytes, salt: bytes
) -> Commit:
    parents = tuple(sorted(parents))
    data = _encode(parents, timestamp, generation, root, salt)
    return Commit(hashlib.sha256(data).digest(), parents, timestamp, generation, root, salt, data)


def decode(data: bytes, expected_id: bytes | None = None) -> Commit:
    """Parse and check a commit encoding; raises CorruptObjectError on anything wrong."""
    try:
        fmt, parents, timestamp, generation, root, salt = msgpack.unpackb(data, raw=False)
        parents = tuple(parents)
        ok = (
            fmt == FORMAT
            and len(parents) <= MAX_PARENTS
            and all(isinstance(p, bytes) and len(p) == ID_SIZE for p in parents)
            and all(a < b for a, b in zip(parents, parents[1:], strict=False))
            and isinstance(timestamp, int)
            and 0 <= timestamp <= INT_MAX
            and isinstance(generation, int)
            and 0 <= generation <= INT_MAX
            and isinstance(root, bytes)
            and isinstance(salt, bytes)
        )
    except Exception as e:  # msgpack raises several unrelated types
        raise CorruptObjectError(f"undecodable commit: {e}") from e
    if not ok:
        raise CorruptObjectError("malformed commit")
    c = Commit(hashlib.sha256(data).digest(), parents, timestamp, generation, root, salt, data)
    if c.data != _encode(parents, timestamp, generation, root, salt):
        raise CorruptObjectError("commit encoding is not canonical")
    if expected_id is not None and c.id != expected_id:
        raise CorruptObjectError("commit id does not match its content")
    return c


FIRST = make((), 0, 0, EMPTY, b"")
"""The empty commit every page starts from, identical on every device."""


def now_us() -> int:
    return time.time_ns() // 1000


def child(parent: Commit, root: bytes, timestamp: int) -> Commit:
    """A commit on ``parent`` holding ``root``, made at ``timestamp`` (µs; the page's
    clock keeps it after the parent's), with a fresh salt."""
    return make(
        (parent.id,), max(timestamp, parent.timestamp), parent.generation + 1, root, os.urandom(16)
    )
