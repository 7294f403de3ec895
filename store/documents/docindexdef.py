"""Index definitions and keys of the document layer's local indexes.

This module owns :class:`IndexDef` (an index as declared: what it indexes, and a
document's key in it), how index keys are packed (:data:`KEY_FORMAT`), the rows an
index holds, reading a definition's bytes, and the key range of a query. Keeping
the rows equal to the page's documents, and querying them, is
:mod:`store.documents.docindex`'s.
"""

from __future__ import annotations

import logging
import math
from dataclasses import dataclass
from typing import Any

from ledgerd.store.documents import doclayout
from ledgerd.store.documents.doclayout import DocId, Record, State
from ledgerd.store.documents.docmodel import MISSING, lookup_path
from ledgerd.store.errors import InvalidArgumentError
from ledgerd.store.keys import tuple as tup
from ledgerd.store.keys.tuple import encode_float as _encode_float
from ledgerd.store.keys.tuple import encode_str as _encode_str

log = logging.getLogger(__name__)

KEY_FORMAT = b"\x02"
"""How index keys are packed, in ``doc_state.key_format``: 2 packs -0.0 as 0.0 (they are
one double to JSON and to a query). Opening a page whose rows were packed otherwise
(no ``key_format``: the first format) builds its indexes again."""


Scalar = str | float | bool | None


def scalar(v: Any) -> tuple[bool, Scalar]:
    """(indexable, the value as indexed): numbers as floats, so 1 and 1.5 sort together;
    an integer past every double (only a query's, documents hold 64-bit ones) as the
    infinity of its sign, as JSON's ``1e400`` is."""
    if v is None or isinstance(v, bool | str):
        return True, v
    if isinstance(v, int | float):
        try:
            return True, float(v) + 0.0  # (-0.0 + 0.0 is 0.0)
        except OverflowError:
            return True, math.inf if v > 0 else -math.inf
    return False, None


@dataclass(frozen=True, slots=True)
class IndexDef:
    """An index: documents of ``collection`` by the value at ``partition`` (then ``sort``)."""

    collection: str
    name: str
    partition: list[str]
    sort: list[str] | None
    raw: bytes  # its definition's bytes in the tree

    def key_of(self, r: Record) -> bytes | None:
        """The index key of a document, or None if it is not indexed (sparse)."""
        if r.state is State.PURGED:
            return None
        # A packed tuple is its elements' encodings one after the other: each value
        # is encoded alone, the common kinds without the generic packer.
        parts = []
        data = r.data
        for path in (self.partition, self.sort):
            if path is None:
                continue
            if len(path) == 1 and type(data) is dict:  # the common case, without a call
                v = data.get(path[0], MISSING)
            else:
                v = lookup_path(data, path)
            kind = type(v)
            if kind is float or kind is int:
                parts.append(_encode_float(float(v) + 0.0))  # -0.0 is indexed as 0.0
            elif kind is str and "/" not in v:
                parts.append(_encode_str(v))
            else:
                if v is MISSING:
                    return None
                ok, s = scalar(v)
                if not ok or (isinstance(s, str) and "/" in s):
                    return None
                parts.append(tup.pack((s,)))
        return b"".join(parts)

    def reserved_value(self, data: Any) -> str | None:
        """The first indexed string value of ``data`` holding a '/', or None."""
        for path in (self.partition, self.sort):
            if path is None:
                continue
            v = lookup_path(data, path)
            if isinstance(v, str) and "/" in v:
                return ".".join(path)
        return None


@dataclass(frozen=True, slots=True)
class IndexRow:
    doc: DocId
    key: bytes


Row = tuple[int, DocId, bytes | None, bool]
"""An index row to write: (index, document id, key or None to remove it, deleted). A
chosen id (text) is stored as SQLite text, a ULID's bytes as a blob: SQLite orders text
before blobs, so each document keeps one place in the index order."""


def definition(collection: str, name: str, raw: bytes) -> IndexDef | ValueError:
    """The index a definition's bytes define; the error if they cannot be read here
    (FutureLayoutError: a newer ledgerd's; another ValueError: damaged)."""
    try:
        partition, sort = doclayout.decode_definition(raw)
    except ValueError as e:
        log.warning("index %s/%s is not kept here (%s)", collection, name, e)
        return e
    return IndexDef(collection, name, partition, sort, raw)


def partition_range(
    partition: Any, start: Any, end: Any, d: IndexDef
) -> tuple[bytes, bytes | None]:
    """The keys of one partition value, narrowed to ``start <= sort < end``."""
    try:
        return _partition_range(partition, start, end, d)
    except UnicodeEncodeError:  # a str the tuple layer cannot encode: a lone surrogate
        raise InvalidArgumentError("a query's strings must be UTF-8 text") from None


def _partition_range(
    partition: Any, start: Any, end: Any, d: IndexDef
) -> tuple[bytes, bytes | None]:
    ok, p = scalar(partition)
    if not ok:
        raise InvalidArgumentError("an index is queried by a string, number, boolean or null")
    prefix = tup.pack((p,))
    if d.sort is None:
        if start is not None or end is not None:
            raise InvalidArgumentError(f"index {d.name!r} has no sort key to range over")
        return prefix, doclayout.elements_end(prefix)
    lo, hi = prefix, doclayout.elements_end(prefix)
    for bound, is_start in ((start, True), (end, False)):
        if bound is None:
            continue
        ok, s = scalar(bound)
        if not ok:
            raise InvalidArgumentError("a sort range is bounded by scalars")
        if is_start:
            lo = tup.pack((p, s))
        else:
            hi = tup.pack((p, s))
    return lo, hi


Name = tuple[str, str]
"""An index's (collection, name)."""


def plan_changes(
    current: dict[Name, tuple[int, IndexDef]],
    unreadable: dict[Name, ValueError],
    changes: list[tuple[Name, bytes | None]],
) -> tuple[list[int], dict[Name, IndexDef], dict[Name, ValueError]]:
    """What definition ``changes`` (the new definition, None: dropped) do to the
    ``current`` indexes (their row ids and definitions): the row ids to drop, the
    definitions to add, and the definitions that cannot be read here after them."""
    plan = dict(current)
    added: dict[Name, IndexDef] = {}
    dropped: list[int] = []
    unreadable = dict(unreadable)
    for name, raw in changes:
        cur = plan.get(name)
        if cur is not None and (raw is None or cur[1].raw != raw):
            del plan[name]
            if added.pop(name, None) is None:
                dropped.append(cur[0])
        if raw is None or name not in plan:
            unreadable.pop(name, None)
        if raw is not None and name not in plan:
            d = definition(name[0], name[1], raw)
            if isinstance(d, IndexDef):
                added[name] = d
                plan[name] = (0, d)
            else:  # no entries here: see `Views.unreadable`
                unreadable[name] = d
    return dropped, added, unreadable
