"""Packs: the one object an upload round writes per page.

This module owns the pack format and its parsing; it does no I/O.

    b"LDGPACK1" | u32 header length | header (msgpack) | EAGER pieces | LAZY pieces

The header holds the ledger, page, device and sequence number, the commits
(their canonical encodings) and ``[digest, length]`` for every piece, EAGER ones
first. Everything a reader needs first (header, commits, EAGER pieces) is the
prefix ``[0, eager_end)``, and ``eager_end`` is part of the object's name, so
one ranged GET fetches it; LAZY pieces are fetched later, each with a ranged GET
of just its bytes. Parsing checks every length and type; digests and commit ids
are verified by the store on import.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass

import msgpack

from ledgerd.store import digest as dg
from ledgerd.store.errors import InvalidDigestError
from ledgerd.sync.errors import SyncError

MAGIC = b"LDGPACK1"
_LEN = struct.Struct(">I")
PREFIX = len(MAGIC) + _LEN.size


class CorruptPackError(SyncError):
    """A pack is malformed or truncated; it was refused and nothing was stored."""


@dataclass
class Pack:
    ledger: bytes
    page: bytes
    device: bytes
    seq: int
    commits: list[bytes]
    eager: list[tuple[bytes, bytes]]  # (digest, data)
    lazy: list[tuple[bytes, bytes]]


@dataclass
class PackPrefix:
    """What the first ranged GET of a pack yields."""

    ledger: bytes
    page: bytes
    device: bytes
    seq: int
    commits: list[bytes]
    eager: dict[bytes, bytes]
    lazy: list[tuple[bytes, int, int]]  # (digest, offset in the pack, length)


def encode(p: Pack) -> tuple[bytes, int]:
    """The pack's bytes and ``eager_end`` (length of the header + commits + EAGER prefix)."""
    header = msgpack.packb(
        {
            "ledger": p.ledger,
            "page": p.page,
            "device": p.device,
            "seq": p.seq,
            "commits": p.commits,
            "eager": [[d, len(v)] for d, v in p.eager],
            "lazy": [[d, len(v)] for d, v in p.lazy],
        },
        use_bin_type=True,
    )
    parts = [MAGIC, _LEN.pack(len(header)), header]
    parts.extend(v for _, v in p.eager)
    eager_end = sum(len(x) for x in parts)
    parts.extend(v for _, v in p.lazy)
    return b"".join(parts), eager_end


def decode_prefix(data: bytes, eager_end: int) -> PackPrefix:
    """Parse ``data[:eager_end]`` of a pack; raises CorruptPackError on anything wrong."""
    if len(data) != eager_end or len(data) < PREFIX or data[: len(MAGIC)] != MAGIC:
        raise CorruptPackError("pack is truncated or not a ledgerd pack")
    (hlen,) = _LEN.unpack_from(data, len(MAGIC))
    if PREFIX + hlen > len(data):
        raise CorruptPackError("pack header runs past the data")
    try:
        h = msgpack.unpackb(data[PREFIX : PREFIX + hlen], raw=False)
        ledger, page, device, seq = h["ledger"], h["page"], h["device"], h["seq"]
        commits, eager, lazy = h["commits"], h["eager"], h["lazy"]
        ok = (
            isinstance(ledger, bytes)
            and isinstance(page, bytes)
            and isinstance(device, bytes)
            and isinstance(seq, int)
            and isinstance(commits, list)
            and all(isinstance(c, bytes) for c in commits)
            and all(_piece_ok(x) for x in eager)
            and all(_piece_ok(x) for x in lazy)
        )
    except Exception as e:  # msgpack and KeyError and TypeError alike
        raise CorruptPackError(f"pack header is unreadable: {e}") from e
    if not ok:
        raise CorruptPackError("pack header has malformed fields")
    pos = PREFIX + hlen
    pieces: dict[bytes, bytes] = {}
    for d, n in eager:
        if pos + n > len(data):
            raise CorruptPackError("pack is shorter than its header says")
        pieces[d] = data[pos : pos + n]
        pos += n
    if pos != eager_end:
        raise CorruptPackError("pack's EAGER region does not end where its name says")
    lazy_at: list[tuple[bytes, int, int]] = []
    for d, n in lazy:
        lazy_at.append((d, pos, n))
        pos += n
    return PackPrefix(ledger, page, device, seq, commits, pieces, lazy_at)


def _piece_ok(x: object) -> bool:
    """``[digest, length]`` with a well-formed, hashed (never inline) digest."""
    if not (
        isinstance(x, list)
        and len(x) == 2
        and isinstance(x[0], bytes)
        and isinstance(x[1], int)
        and 0 <= x[1] <= 1 << 32
    ):
        return False
    try:
        dg.validate(x[0])
    except InvalidDigestError:
        return False
    return not dg.is_inline(x[0])
