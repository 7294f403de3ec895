"""The checks a decoded tree node's columns pass (:func:`store.tree.btree.decode_node`).

This module owns those checks: entries of four fields (or five, with siblings), priorities
0 or 1, keys of bytes, dots of the tree's dot size, well-formed digests. Each runs over whole
columns (``map``, ``set``, ``join``) rather than entry by entry, so that reading a node costs
little more than msgpack's own decoding. It knows nothing of node shapes or levels.
"""

from __future__ import annotations

import itertools
import operator
from collections.abc import Sequence

from ledgerd.store.pieces import digest as dg


def check_entries(raw: tuple[tuple[object, ...], ...], dot_size: int) -> None:
    """Raise TypeError (or InvalidDigestError) unless ``raw`` are well-formed entries."""
    # Four columns of equal length (entries with siblings apart), or zip or the
    # unpacking raises; an entry that is not an array fails the columns' type
    # checks below.
    plain = raw if set(map(len, raw)) == {4} else _with_siblings(raw, dot_size)
    keys, values, priorities, dots = zip(*plain, strict=True)
    if set(map(type, priorities)) != {int} or not set(priorities) <= {0, 1}:
        raise TypeError("priorities are 0 or 1")
    # msgpack makes bytes of bin and nothing else: joining them is the check
    # that every key is bytes (anything else raises TypeError), at C speed.
    b"".join(keys)
    if set(map(len, dots)) != {dot_size} or len(b"".join(dots)) != dot_size * len(dots):
        raise TypeError(f"a dot is {dot_size} bytes")
    check_digests(values)


def _with_siblings(raw: tuple[tuple[object, ...], ...], dot_size: int) -> list[tuple[object, ...]]:
    """The first four fields of each entry, after checking the siblings of those that
    have a fifth: a non-empty tuple of ``(value, priority, dot)`` versions, dots
    strictly decreasing and all below the entry's own (the winner is the largest)."""
    out: list[tuple[object, ...]] = []
    for e in raw:
        if len(e) == 5:
            siblings, dot = e[4], e[3]
            if type(siblings) is not tuple or not siblings or type(dot) is not bytes:
                raise TypeError("siblings are a non-empty array")
            last = dot
            for v in siblings:
                if type(v) is not tuple or len(v) != 3:
                    raise TypeError("a sibling is [value, priority, dot]")
                value, prio, vdot = v
                if type(prio) is not int or prio not in (0, 1):
                    raise TypeError("priorities are 0 or 1")
                if type(vdot) is not bytes or len(vdot) != dot_size or not vdot < last:
                    raise TypeError("siblings' dots decrease, below the entry's own")
                if type(value) is not bytes:
                    raise TypeError("a sibling's value is a digest")
                dg.validate(value)
                last = vdot
            out.append(e[:4])
        elif len(e) == 4:
            out.append(e)
        else:
            raise TypeError("an entry is [key, value, priority, dot(, siblings)]")
    return out


_HASHED = 1 + dg.HASH_SIZE
_HASHED_TYPES = frozenset(t for t in range(256) if dg.is_valid_hashed_type(t))
_FIRST = operator.itemgetter(0)


def _table(types: Sequence[int]) -> bytes:
    """A ``bytes.translate`` table: 1 for these type bytes, 0 for the others."""
    return bytes(int(t in types) for t in range(256))


_IS_HASHED = _table(sorted(_HASHED_TYPES))
_IS_INLINE_VALUE = _table(dg.VALUE_INLINE)
_IS_TOMBSTONE = _table(dg.TOMBSTONE)


def check_digests(digests: Sequence[bytes]) -> None:
    """Raise TypeError unless every one is bytes, and InvalidDigestError unless every
    one is a well-formed digest. Hashed ones, values carried inline and tombstones (a
    leaf's values) are checked at C speed, column by column; others one by one."""
    # The join raises TypeError unless every one is bytes-like, and msgpack makes
    # bytes and never bytearray or memoryview.
    joined = b"".join(digests)
    lengths = list(map(len, digests))
    if set(lengths) == {_HASHED} and set(joined[::_HASHED]) <= _HASHED_TYPES:
        return
    if 0 not in lengths:
        types = bytes(map(_FIRST, digests))
        hashed, inline = types.translate(_IS_HASHED), types.translate(_IS_INLINE_VALUE)
        tombs = types.translate(_IS_TOMBSTONE)
        if (
            hashed.count(1) + inline.count(1) + tombs.count(1) == len(types)
            and set(itertools.compress(lengths, hashed)) <= {_HASHED}
            and max(itertools.compress(lengths, inline), default=0) <= 1 + dg.INLINE_LIMIT
            and set(itertools.compress(lengths, tombs)) <= {1}
        ):
            return
    for d in digests:
        dg.validate(d)
