"""Dots and contexts: what a write is called, and what a state has seen.

This module owns the *dot* every entry carries (the writer's clock time and tag:
:data:`store.tree.btree.DOT_SIZE` bytes), a page's *context* (per writer tag, the
largest clock time of that writer's writes the state includes), and the join of
one key's versions (:func:`join_versions`). It has no I/O; joining trees is
:mod:`store.tree.join`'s, and why this converges is in ``docs/convergence.md``.

A writer's writes to a page are applied everywhere in the order it made them, so
``context[tag] >= time`` means the state has seen that write.
"""

from __future__ import annotations

import datetime
import functools
from collections.abc import Callable, Iterable, Mapping

import msgpack

from ledgerd.store.errors import CorruptObjectError
from ledgerd.store.tree.btree import DOT_SIZE, Entry, RawEntry, Version

TAG_SIZE = 8
"""Bytes of a writer's tag: the first bytes of its device id."""
TIME_LIMIT = 9_000_000_000_000_000
"""Largest clock time a dot may carry (microseconds: the year 2255). A time past it
is refused, so that no dot can push every device's clock to its end."""

Context = dict[bytes, int]
"""Per writer tag, the largest clock time (microseconds) of its writes seen."""


def tag_of_device(device_id: bytes) -> bytes:
    return device_id[:TAG_SIZE].ljust(TAG_SIZE, b"\0")


def make(time_us: int, tag: bytes) -> bytes:
    return time_us.to_bytes(8, "big") + tag


def time_of(dot: bytes) -> int:
    return int.from_bytes(dot[:8], "big")


def tag_of(dot: bytes) -> bytes:
    return dot[8:]


def covers(ctx: Mapping[bytes, int], dot: bytes) -> bool:
    """Whether a state of context ``ctx`` has seen the write ``dot``."""
    return ctx.get(dot[8:], -1) >= int.from_bytes(dot[:8], "big")


def join_contexts(a: Mapping[bytes, int], b: Mapping[bytes, int]) -> Context:
    out = dict(a)
    for tag, t in b.items():
        if t > out.get(tag, -1):
            out[tag] = t
    return out


def covers_context(a: Mapping[bytes, int], b: Mapping[bytes, int]) -> bool:
    """Whether ``a`` has seen everything ``b`` has."""
    return all(a.get(tag, -1) >= t for tag, t in b.items())


def latest(ctx: Mapping[bytes, int]) -> int:
    """The largest time in ``ctx`` (0 if empty): a clock reading nothing older."""
    return max(ctx.values(), default=0)


def encode_context(ctx: Mapping[bytes, int]) -> bytes:
    return msgpack.packb(dict(sorted(ctx.items())), use_bin_type=True)  # type: ignore[no-any-return]


def decode_context(data: bytes | object) -> Context:
    """A context from its encoding (or from an already decoded map); CorruptObjectError
    if it is not a map of tags to times."""
    try:
        raw = msgpack.unpackb(data, raw=False) if isinstance(data, bytes) else data
    except Exception as e:  # msgpack raises several unrelated types
        raise CorruptObjectError(f"undecodable context: {e}") from e
    return check_context(raw)


def check_context(raw: object) -> Context:
    if not isinstance(raw, dict):
        raise CorruptObjectError("a context is a map")
    out: Context = {}
    for tag, t in raw.items():
        if type(tag) is not bytes or len(tag) != TAG_SIZE:
            raise CorruptObjectError("a context's writer tag is malformed")
        if type(t) is not int or not 0 <= t <= TIME_LIMIT:
            raise CorruptObjectError("a context's time is out of range")
        out[tag] = t
    return out


def check_dot(dot: object) -> bytes:
    if type(dot) is not bytes or len(dot) != DOT_SIZE or time_of(dot) > TIME_LIMIT:
        raise CorruptObjectError("a dot is 16 bytes, its time below the year 2255")
    return dot


# -- versions of one key ---------------------------------------------------------------


def versions(e: RawEntry | Entry | None) -> list[Version]:
    """The versions an entry holds, winner first (none for an absent key)."""
    if e is None:
        return []
    out: list[Version] = [(e[1], int(e[2]), e[3])]
    if len(e) > 4:
        out.extend(e[4])
    return out


def entry(key: bytes, vs: Iterable[Version]) -> RawEntry | None:
    """The entry holding versions ``vs`` (the largest dot wins), None if there are none."""
    ordered = sorted(vs, key=_dot, reverse=True)
    if not ordered:
        return None
    (value, prio, dot), rest = ordered[0], ordered[1:]
    if rest:
        return (key, value, prio, dot, tuple(rest))
    return (key, value, prio, dot)


def _dot(v: Version) -> bytes:
    return v[2]


Seen = Callable[[bytes], bool]
"""Whether a state has seen the write of a dot (:func:`seen_by` of its context)."""


def seen_by(ctx: Mapping[bytes, int]) -> Seen:
    return functools.partial(covers, ctx)


def join_versions(
    local: list[Version], remote: list[Version], local_saw: Seen, remote_saw: Seen
) -> list[Version]:
    """One key's versions after joining a state holding ``local`` with one holding
    ``remote``: a version one side holds and the other has seen without keeping it was
    superseded there, and goes; the rest stay."""
    rdots = {v[2] for v in remote}
    ldots = {v[2] for v in local}
    kept = [v for v in local if v[2] in rdots or not remote_saw(v[2])]
    kept.extend(v for v in remote if v[2] not in ldots and not local_saw(v[2]))
    return kept


def distinct_values(e: RawEntry | Entry) -> int:
    """How many different (value, priority) pairs the key's versions hold: more than
    one is a conflict for a resolver."""
    return len({(v[0], v[1]) for v in versions(e)})


def format_time(time_us: int) -> str:
    """A clock time as UTC, to the microsecond (for messages)."""
    return (
        datetime.datetime.fromtimestamp(time_us / 1e6, datetime.UTC).isoformat(
            timespec="microseconds"
        )
        if 0 <= time_us <= TIME_LIMIT
        else str(time_us)
    )
