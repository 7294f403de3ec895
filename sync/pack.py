"""Packs: the one object an upload round writes, whatever the number of pages.

This module owns the pack format: writing packs, reading their sections back; it
does no I/O. The header's types and parsing are :mod:`sync.packheader`'s,
compressing the parts within bounds :mod:`sync.compress`'s.

Format 3 (``LDGPACK3``, bucket layout 4)::

    b"LDGPACK3" | u32 header length | header (msgpack) | EAGER sections | LAZY pieces

The header is the pack's index: the device, its sequence number and feed time,
and per page its ledger and page names, where its EAGER section lies
(``[offset, stored length, raw length, codec]``), where each of its LAZY pieces
lies (``[digest, offset, stored length, raw length, codec]``; offsets count from
the end of the header) and the page's *delta* fields: ``since`` and ``upto`` (the
range of the writer's clock its writes cover) and ``ctx``, the writer's context
(``docs/convergence.md``). A page's EAGER section is
``msgpack([entries, [[digest, bytes], ...]])``: its entries, each
``[key, value digest, priority, dot(, siblings)]`` in key order, and the EAGER
pieces of the values the writer wrote, compressed as one zstd frame when that makes
it smaller (codec 1; 0 is raw). A checkpoint's section is *bare*: its pieces'
digests are left out (the reader computes them). LAZY pieces are compressed one by
one, under the same rule, so that each can be fetched alone. Digests are over the
uncompressed bytes. Every EAGER section comes before every LAZY piece, so a reader
fetches the header and the sections of the pages it holds with one or two ranged
GETs (``head_end`` and ``eager_end`` are in the pack's name) and LAZY pieces later,
each with a ranged GET of its bytes.

Encrypted (``LDGPACKE``, in an encrypted bucket: :mod:`sync.crypto`)::

    b"LDGPACKE" | sealed header | sealed EAGER sections | sealed LAZY pieces

The same layout with every part sealed on its own by the bucket's
:class:`~sync.crypto.Codec` after compression (so ranged GETs still fetch one
part): the header (a codec byte and the plain header, bound to the whole name),
each EAGER section (bound to the pack and its index) and each LAZY piece (bound to
the pack and its digest). Offsets and stored lengths in the header count sealed
bytes; the real digests are inside the sealed header only.

Parsing checks every length, offset and type and bounds every decompression;
digests are verified, and entries checked, by the store on import.
"""

from __future__ import annotations

import operator
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import msgpack

from ledgerd.store import OFF_LOOP_BYTES as OFF_LOOP_BYTES  # sections over it: on a thread
from ledgerd.store import off_loop
from ledgerd.store.pieces import digest as dg
from ledgerd.sync import crypto
from ledgerd.sync.compress import MAX_SECTION, RAW, ZSTD, squeeze, unsqueeze
from ledgerd.sync.crypto import Codec, Context, KeyNotHereError, TamperedError
from ledgerd.sync.errors import CorruptPackError, PackKeyMissingError
from ledgerd.sync.packheader import (
    HEADER_CONTAINER,
    HEADER_MAP,
    LEN,
    MAGIC3,
    MAGICE,
    MAX_HEAD_END,
    MAX_HEADER,
    MAX_PIECE,
    PREFIX,
    Header,
    PageIndex,
    Part,
    check_head_end,
    decode_header,
    valid_digest,
)

__all__ = [  # with the header's, the codecs' and the errors' names, as callers import them here
    "HEADER_CONTAINER",
    "HEADER_MAP",
    "MAGIC3",
    "MAGICE",
    "MAX_HEADER",
    "MAX_HEAD_END",
    "MAX_PIECE",
    "MAX_SECTION",
    "MIN_ITEM",
    "OFF_LOOP_BYTES",
    "PREFIX",
    "RAW",
    "ZSTD",
    "CorruptPackError",
    "Header",
    "PackKeyMissingError",
    "PageIndex",
    "Part",
    "Section",
    "check_head_end",
    "decode_all",
    "decode_header",
    "decode_section",
    "decode_section_async",
    "encode",
    "encode_async",
    "open_piece",
    "squeeze",
    "unseal",
    "unsqueeze",
]


_FIRST, _SECOND = operator.itemgetter(0), operator.itemgetter(1)
ENTRY_OVERHEAD = 24
"""Bytes an entry takes in a section beside its key and its value's digest: its dot, its
priority and msgpack's headers (siblings aside)."""


def entries_size(entries: Sequence[Sequence[Any]]) -> int:
    """About the bytes ``entries`` take in a section: their keys, their values' digests
    (a value of up to 128 bytes is its digest) and ``ENTRY_OVERHEAD`` each."""
    keys = sum(map(len, map(_FIRST, entries)))
    return keys + sum(map(len, map(_SECOND, entries))) + ENTRY_OVERHEAD * len(entries)


@dataclass
class Section:
    """One page's part of a pack, as written: entries, EAGER pieces, LAZY pieces, and
    the delta's fields (``since``, ``upto``, ``ctx``; see the module docstring)."""

    ledger: bytes
    page: bytes
    entries: list[Any] = field(default_factory=list)
    eager: list[tuple[bytes, bytes]] = field(default_factory=list)
    lazy: list[tuple[bytes, bytes]] = field(default_factory=list)
    since: int = -1
    upto: int = -1
    ctx: dict[bytes, int] = field(default_factory=dict)
    bare: bool = False
    """EAGER pieces without their digests (the reader computes them): a checkpoint."""

    def size(self) -> int:
        return entries_size(self.entries) + sum(len(v) for _, v in (*self.eager, *self.lazy))


def encode(
    device: bytes,
    seq: int,
    time: int,
    sections: list[Section],
    extra: dict[str, Any] | None = None,
    seal: tuple[Codec, str] | None = None,
) -> tuple[bytes, int, int]:
    """The pack's bytes, ``head_end`` and ``eager_end`` (CPU-bound: call off the loop
    for large packs). ``extra`` fields go into the header (readers ignore fields
    they do not know). ``seal``: the bucket's codec and the pack's identity
    (:attr:`sync.layout.PackName.ident`): an encrypted pack."""
    body: list[bytes] = []
    eager_parts = _encode_eager(sections, seal, body)
    eager_len = sum(len(b) for b in body)
    lazy_parts = _encode_lazy(sections, seal, body, eager_len)
    header = msgpack.packb(
        {
            **(extra or {}),
            "device": device,
            "seq": seq,
            "time": time,
            "pages": [
                [s.ledger, s.page, e, lz, {"since": s.since, "upto": s.upto, "ctx": s.ctx}]
                for s, e, lz in zip(sections, eager_parts, lazy_parts, strict=True)
            ],
        },
        use_bin_type=True,
    )
    if seal is not None:
        stored, codec = squeeze(header)
        plain = bytes([codec]) + stored
        head_end = len(MAGICE) + crypto.sealed_size(len(plain))
        ctx = Context(seal[1], "header", f"{head_end}.{head_end + eager_len}".encode())
        sealed = seal[0].seal(plain, ctx)
        assert len(MAGICE) + len(sealed) == head_end
        return b"".join([MAGICE, sealed, *body]), head_end, head_end + eager_len
    head_end = len(MAGIC3) + LEN.size + len(header)
    data = b"".join([MAGIC3, LEN.pack(len(header)), header, *body])
    return data, head_end, head_end + eager_len


def _encode_eager(
    sections: list[Section], seal: tuple[Codec, str] | None, body: list[bytes]
) -> list[list[int]]:
    """Each section's EAGER part, stored into ``body`` (empty: they come first), and
    where each lies (``[offset, stored length, raw length, codec]``)."""
    at = 0
    eager_parts: list[list[int]] = []
    for i, s in enumerate(sections):
        if s.bare:
            types = bytes(d[0] for d, _ in s.eager)
            raw = msgpack.packb([s.entries, types, [v for _, v in s.eager]], use_bin_type=True)
        else:
            raw = msgpack.packb([s.entries, [[d, v] for d, v in s.eager]], use_bin_type=True)
        stored, codec = squeeze(raw)
        if seal is not None:
            stored = seal[0].seal(stored, Context(seal[1], "eager", LEN.pack(i)))
        eager_parts.append([at, len(stored), len(raw), codec])
        body.append(stored)
        at += len(stored)
    return eager_parts


def _encode_lazy(
    sections: list[Section], seal: tuple[Codec, str] | None, body: list[bytes], at: int
) -> list[list[list[object]]]:
    """Each section's LAZY pieces, stored into ``body`` from offset ``at``, and where
    each lies (``[digest, offset, stored length, raw length, codec]``)."""
    lazy_parts: list[list[list[object]]] = []
    for s in sections:
        parts: list[list[object]] = []
        for d, v in s.lazy:
            stored, codec = squeeze(v)
            if seal is not None:
                stored = seal[0].seal(stored, Context(seal[1], "lazy", d))
            parts.append([d, at, len(stored), len(v), codec])
            body.append(stored)
            at += len(stored)
        lazy_parts.append(parts)
    return lazy_parts


def unseal(stored: bytes, part: Part, codec: Codec | None) -> bytes:
    """A part's stored bytes as they were before sealing (as they are, in a plain pack);
    CorruptPackError if a sealed part does not authenticate."""
    if part.sealed is None:
        return stored
    if codec is None:
        raise PackKeyMissingError("an encrypted pack needs the bucket's key")
    try:
        return codec.open(stored, part.sealed)
    except KeyNotHereError as e:
        raise PackKeyMissingError(str(e)) from e
    except TamperedError as e:
        raise CorruptPackError(str(e)) from e


def open_piece(
    stored: bytes, codec: Codec, ident: str, digest: bytes, zcodec: int, raw: int
) -> bytes:
    """A LAZY piece of an encrypted pack from its sealed bytes (``raw``: its length if
    ``zcodec`` is ZSTD); CorruptPackError if it does not authenticate."""
    part = Part(0, len(stored), raw, zcodec, Context(ident, "lazy", digest))
    plain = unseal(stored, part, codec)
    return unsqueeze(plain, zcodec, raw if zcodec == ZSTD else len(plain))


def decode_section(
    stored: bytes, part: Part, codec: Codec | None = None
) -> tuple[list[Any], dict[bytes, bytes]]:
    """A page's EAGER section: its entries (as received: the store checks them) and its
    EAGER pieces (not yet verified)."""
    raw = unsqueeze(unseal(stored, part, codec), part.codec, part.raw)
    try:
        # Every item of a section's arrays is at least MIN_ITEM bytes, so an array
        # claiming more items than that allows is refused before it is made: tiny items
        # (16 million empty strings in 32 MiB) would cost several times the section.
        fields = msgpack.unpackb(raw, raw=False, max_array_len=max(5, len(raw) // MIN_ITEM))
        entries = fields[0]
        if not isinstance(entries, list):
            raise ValueError("entries")
        out: dict[bytes, bytes] = {}
        if len(fields) == 3:  # bare: each piece's type byte; the digest is computed
            types, values = fields[1], fields[2]
            if not (isinstance(types, bytes) and len(types) == len(values)):
                raise ValueError("piece types")
            for t, v in zip(types, values, strict=True):
                if not (isinstance(v, bytes) and dg.is_valid_hashed_type(t)):
                    raise ValueError("piece")
                out[valid_digest(bytes((t,)) + dg.content_hash(v))] = v
        else:
            _, pieces = fields
            for d, v in pieces:
                if not isinstance(v, bytes):
                    raise ValueError("piece")
                out[valid_digest(d)] = v
    except Exception as e:
        raise CorruptPackError(f"a page's section of a pack is unreadable: {e}") from e
    return entries, out


MIN_ITEM = 20
"""Fewest bytes of an item of a section's long arrays: an entry holds a 16-byte dot and
more (at least 25 bytes), a sibling too (23), a ``[digest, piece]`` pair more than 32
bytes. An array claiming more items than its bytes can hold is refused before they
are made: tiny items (16 million empty strings in 32 MiB) would cost several times
the section."""


async def decode_section_async(
    stored: bytes, part: Part, codec: Codec | None = None
) -> tuple[list[Any], dict[bytes, bytes]]:
    """:func:`decode_section`, on a thread if the section holds more than
    :data:`OFF_LOOP_BYTES` (decoding a section of 100,000 pieces, decompressing,
    unpacking and hashing every piece of a bare one, held the loop 0.1 s)."""
    return await off_loop(part.raw > OFF_LOOP_BYTES, decode_section, stored, part, codec)


async def encode_async(
    device: bytes,
    seq: int,
    time: int,
    sections: list[Section],
    extra: dict[str, Any] | None = None,
    seal: tuple[Codec, str] | None = None,
) -> tuple[bytes, int, int]:
    """:func:`encode`, on a thread if the sections hold more than :data:`OFF_LOOP_BYTES`
    (encoding a checkpoint of 100,000 pieces held the loop 0.1 s)."""
    big = sum(s.size() for s in sections) > OFF_LOOP_BYTES
    return await off_loop(big, encode, device, seq, time, sections, extra, seal)


def decode_all(
    data: bytes, head_end: int, eager_end: int, seal: tuple[Codec, str] | None = None
) -> list[Section]:
    """A whole pack back as the sections it was made of (key rotation seals them again)."""
    header = decode_header(data[:head_end], head_end, eager_end, seal)
    codec = seal[0] if seal else None
    out = []
    for p in header.pages:
        entries, eager = decode_section(data[p.eager.offset : p.eager.end], p.eager, codec)
        lazy = []
        for d, part in p.lazy:
            raw = unseal(data[part.offset : part.end], part, codec)
            lazy.append((d, unsqueeze(raw, part.codec, part.raw if part.codec else len(raw))))
        out.append(
            Section(p.ledger, p.page, entries, list(eager.items()), lazy, p.since, p.upto, p.ctx)
        )
    return out
