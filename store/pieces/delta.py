"""Pieces stored as a delta against another stored piece: the format, and reading one back.

A commit that changes one entry of a tree leaf makes a new leaf that differs from the
old one in that entry alone, and storing it whole wrote the leaf's 4.5 KB again for
every entry changed (the load of 100,000 random keys wrote 3.6 times PouchDB's bytes).
A node the :class:`store.tree.builder.Builder` rewrote from a stored one (a leaf spliced
from the runs of its previous version, an inner node whose children changed) is stored
instead as those runs: copies from the *base* (the node it replaced) and the bytes of
what changed, about 100 bytes for one changed entry.

The format, a msgpack array, item by item: a ``bin`` is bytes to append as they are;
an ``int`` is bytes to copy from the base, its offset shifted left 17 bits, or'ed
with its length. The piece is the concatenation; its digest names the whole, so a
reader checks what it rebuilt as it checks any piece. (A copy in one int, not two,
lets a read rebuild a piece with one list comprehension: a cold read of a node may
apply sixteen.)

A base may be a delta itself: a *chain*, which ends at a piece stored whole. Storage
(:func:`store.sqlite.sql.put_deltas`) keeps each chain at most :data:`MAX_DEPTH`
deltas long, so that a cold read of a leaf reads at most that many rows more; reads
(:func:`store.sqlite.schema.chain_of`) get a piece's chain in one query, and
:func:`assemble` rebuilds it.

Written by hand: a general binary delta (bsdiff4, xdelta3) searches for the common
runs, which the builder knows already, and its container (bsdiff4's three bz2
streams) costs more than the change it carries.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

import msgpack

from ledgerd.store.errors import CorruptObjectError
from ledgerd.store.pieces import digest as dg
from ledgerd.store.sqlite.db import Database
from ledgerd.store.sqlite.schema import CHAIN_IN, DIGEST_IN, chain_of, digest_is

MAX_DEPTH = 16
"""Deltas at most between a stored piece and the whole piece its chain ends at. The
random-key load of ``bench.reads`` wrote 205-211 MiB at 16 and 226 at 10 (PouchDB:
216-221), and a cold read follows about half of it (docs/performance.md, Bulk loads)."""

Op = bytes | memoryview | tuple[int, int]
"""One run of a piece: bytes as they are, or ``(offset, length)`` copied from the base."""

_LENGTH_BITS = 17
"""A copy is one int: its offset shifted left by this, or'ed with its length (a whole
piece is at most 64 KiB, :data:`store.pieces.split.MAX_CHUNK`)."""
_LENGTH = (1 << _LENGTH_BITS) - 1

_packer = msgpack.Packer(use_bin_type=True)

_ONE_CHAIN = chain_of(digest_is("digest", "?1"))


def may_be_delta(digest: bytes) -> bool:
    """Whether the piece ``digest`` names may be stored as a delta: a tree node of one
    hashed piece. Other pieces are read as stored, with no chain query."""
    return digest[:1] == dg.TREE_CHUNK


_ONE_PIECE = f"SELECT data FROM objects WHERE {digest_is('digest', '?1')}"


async def read_one(db: Database, digest: bytes) -> object | None:
    """The piece ``digest`` names as stored in ``db``, rebuilt if it is a delta (not
    verified, and of any type: the table is not STRICT); None if it is not stored."""
    if may_be_delta(digest):
        return (await read_whole(db, (digest,))).get(digest)
    rows = await db.read_all(_ONE_PIECE, (digest,), small=True)
    return rows[0][0] if rows else None


_PIECES = f"SELECT digest, data FROM objects WHERE {DIGEST_IN}"


async def read_rows(db: Database, digests: Sequence[bytes]) -> list[Any]:
    """``(digest, piece)`` of those of ``digests`` stored in ``db``, as :func:`read_one`."""
    rows: list[Any] = []
    nodes = [d for d in digests if may_be_delta(d)]
    if len(nodes) < len(digests):
        rows.extend(await db.read_in(_PIECES, [d for d in digests if not may_be_delta(d)]))
    if nodes:
        rows.extend((await read_whole(db, nodes)).items())
    return rows


async def read_whole(db: Database, digests: Sequence[bytes]) -> dict[bytes, bytes]:
    """The pieces of ``digests`` stored in ``db``, rebuilt (not verified; those not
    stored are left out)."""
    if len(digests) == 1:
        return assemble(await db.read_all(_ONE_CHAIN, (digests[0],), small=True))
    return assemble(await db.read_in(CHAIN_IN, digests))


def encode(ops: Iterable[Op]) -> bytes:
    """The delta of these runs, in order (adjacent copies and bytes are joined)."""
    flat: list[Any] = []
    for op in ops:
        if isinstance(op, tuple):
            offset, length = op
            last = flat[-1] if flat else None
            if type(last) is int and (last >> _LENGTH_BITS) + (last & _LENGTH) == offset:
                flat[-1] = last + length  # continues the copy before it
            elif length:
                flat.append(offset << _LENGTH_BITS | length)
        elif flat and type(flat[-1]) is bytes:
            flat[-1] += op
        elif op:
            flat.append(bytes(op))
    return _packer.pack(flat)  # type: ignore[no-any-return]


def apply(base: bytes, delta: bytes) -> bytes:
    """The piece ``delta`` makes of ``base``; CorruptObjectError if it does not decode.
    A copy from outside the base gives wrong bytes, which the piece's digest catches,
    as it catches any damage (a read checks every piece it rebuilds)."""
    try:
        ops = msgpack.unpackb(delta, raw=True, use_list=True)
        if type(ops) is not list:
            raise TypeError("a delta is an array")
        return b"".join(
            [
                op
                if type(op) is bytes
                else base[op >> _LENGTH_BITS : (op >> _LENGTH_BITS) + (op & _LENGTH)]
                for op in ops
            ]
        )
    except Exception as e:  # msgpack's own exception types; an op of another type
        raise CorruptObjectError(f"undecodable delta: {e}") from e


ChainRow = Sequence[Any]
"""A row of :func:`store.sqlite.schema.chain_of`: (digest asked for, stored data, 1 if
that data is a delta, depth: 0 for the piece asked for, 1 for its base, ..., and the
digest of the row's own piece)."""


def assemble(rows: Iterable[ChainRow], broken: set[bytes] | None = None) -> dict[bytes, bytes]:
    """Each piece asked for, rebuilt from its chain's rows (its data as stored when it
    is whole). A chain that does not end at a whole piece (a base missing, or deeper
    than any stored chain can be), or a delta that does not apply, raises
    CorruptObjectError; with ``broken``, that piece's digest goes there instead (for
    the integrity check, which reports it)."""
    chains: dict[bytes, list[tuple[int, bytes, int]]] = {}
    for asked, data, is_delta, depth, _ in rows:
        chains.setdefault(bytes(asked), []).append((int(depth), data, int(is_delta)))
    out: dict[bytes, bytes] = {}
    for asked, chain in chains.items():
        if not any(is_delta for _, _, is_delta in chain):  # whole (rows of a digest
            out[asked] = chain[0][1]  # stored twice are alike: the check reports them)
            continue
        try:
            out[asked] = _rebuild(asked, chain)
        except CorruptObjectError:
            if broken is None:
                raise
            broken.add(asked)
    return out


def _rebuild(asked: bytes, chain: list[tuple[int, bytes, int]]) -> bytes:
    if any(type(data) is not bytes for _, data, _ in chain):
        raise CorruptObjectError(f"stored object {asked.hex()[:16]} is not a blob")
    chain.sort(key=lambda row: -row[0])
    depth, piece, is_delta = chain[0]
    if is_delta or [d for d, _, _ in chain] != list(range(depth, -1, -1)):
        raise CorruptObjectError(
            f"stored object {asked.hex()[:16]} is a delta whose chain does not end"
        )
    for _, data, _ in chain[1:]:
        piece = apply(piece, data)
    return piece
