"""Packs: the one object an upload round writes, whatever the number of pages.

This module owns the pack format and its parsing; it does no I/O.

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

import struct
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import msgpack
import zstandard

from ledgerd.store import NAME_LIMIT, off_loop
from ledgerd.store import OFF_LOOP_BYTES as OFF_LOOP_BYTES  # sections over it: on a thread
from ledgerd.store.pieces import digest as dg
from ledgerd.sync import crypto
from ledgerd.sync.crypto import Codec, Context, KeyNotHereError, TamperedError
from ledgerd.sync.errors import SyncError

MAGIC3 = b"LDGPACK3"
MAGICE = b"LDGPACKE"
_LEN = struct.Struct(">I")
PREFIX = len(MAGIC3) + _LEN.size
RAW, ZSTD = 0, 1
"""Codecs: as is; zstd."""
MAX_SECTION = 4 * 1024 * 1024 * 1024
"""Largest raw (uncompressed) section or piece a reader accepts: a pack index
declaring more is refused, and a compressed part is inflated a step at a time and
refused as soon as it passes what its index declares, so that a small part that
inflates to gigabytes (a decompression bomb) costs no more than its declaration.
Not lower: a section holds up to ``max_pack`` bytes of values plus *all* of one
page's changed entries, which the uploader does not split (a delta is applied
whole), and a checkpoint all of a page's entries. A bound a writer can pass would
refuse that page on every other device for good."""
MAX_PIECE = 1024 * 1024
"""Largest raw LAZY piece a reader accepts: a pack index declaring one larger (or
stored larger than its raw bytes need) is refused. Values are split into
pieces of at most 64 KiB (``store.pieces.split.MAX_CHUNK``; an index piece holds at most
1,024 children, about 45 KiB), so none is near it. A LAZY piece is fetched whole on
first read: before, a hostile index could declare one as long as its object, and a
read fetched all of it into memory before its digest check failed."""
INFLATE_STEP = 1024 * 1024
"""Bytes inflated at a time."""
MAX_HEADER = 64 * 1024 * 1024
"""Largest header a reader accepts (a round of tens of thousands of pages fits)."""
MAX_HEAD_END = len(MAGICE) + crypto.sealed_size(1 + MAX_HEADER)
"""Where a pack's header ends at the latest, sealed or not. A name saying later is
refused (:func:`check_head_end`) before anything is read: a hostile name over a huge
object would otherwise have a device read all of it as a header."""
ZSTD_LEVEL = 3


class CorruptPackError(SyncError):
    """A pack is malformed or truncated; it was refused and nothing was stored."""


class PackKeyMissingError(CorruptPackError):
    """A pack is sealed with an encryption key this device does not have. It is not
    damaged: it opens once the key file that has the key is copied here and ledgerd
    restarted. (A CorruptPackError as well, so that every reader holds it unread, as
    it does a pack it cannot read; its state says which it is.)"""


# -- compression -------------------------------------------------------------------


def squeeze(raw: bytes) -> tuple[bytes, int]:
    """``raw`` zstd-compressed with codec ZSTD if that is smaller, else as is (RAW)."""
    if len(raw) < 64:
        return raw, RAW
    packed = zstandard.ZstdCompressor(level=ZSTD_LEVEL, write_checksum=True).compress(raw)
    return (packed, ZSTD) if len(packed) < len(raw) else (raw, RAW)


def unsqueeze(stored: bytes, codec: int, raw_len: int) -> bytes:
    """The raw bytes of a stored section or piece; CorruptPackError if they are not.
    Never holds more than ``raw_len`` (at most :data:`MAX_SECTION`) inflated bytes,
    whatever the compressed part holds."""
    if raw_len > MAX_SECTION:
        raise CorruptPackError(
            f"a part of a pack declares {raw_len} bytes, more than the {MAX_SECTION} accepted"
        )
    if codec == RAW:
        out = stored
    else:
        try:
            out = _inflate(zstandard.ZstdDecompressor(), stored, raw_len)
        except zstandard.ZstdError as e:
            raise CorruptPackError(f"a compressed part of a pack is unreadable: {e}") from e
    if len(out) != raw_len:
        raise CorruptPackError("a part of a pack has another length than its index says")
    return out


def _inflate(d: zstandard.ZstdDecompressor, stored: bytes, most: int) -> bytes:
    """The first frame of ``stored`` inflated, never past ``most`` bytes
    (CorruptPackError). ``decompress`` sizes its output by the frame's own claim
    before reading a byte: a frame that claims at most ``most`` (ours always say their
    size) is inflated in one call, into one buffer; one that claims more is refused
    unread; one that does not say is inflated :data:`INFLATE_STEP` bytes at a time and
    refused as soon as it passes ``most``."""
    claimed = zstandard.frame_content_size(stored)
    if claimed > most:
        raise CorruptPackError(f"a compressed part of a pack claims {claimed} bytes, over {most}")
    if claimed >= 0:
        out: bytes = d.decompress(stored, max_output_size=most)
        return out
    parts: list[bytes] = []
    total = 0
    reader = d.stream_reader(stored)
    while True:
        chunk = reader.read(min(INFLATE_STEP, most - total + 1))
        if not chunk:
            break
        total += len(chunk)
        if total > most:
            raise CorruptPackError(f"a compressed part of a pack inflates past {most} bytes")
        parts.append(chunk)
    return parts[0] if len(parts) == 1 else b"".join(parts)


# -- format 3 ----------------------------------------------------------------------


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
        return 64 * len(self.entries) + sum(len(v) for _, v in (*self.eager, *self.lazy))


@dataclass(frozen=True)
class Part:
    """Where a section or a piece lies in a pack: absolute offset, stored and raw size."""

    offset: int
    stored: int
    raw: int
    codec: int
    sealed: Context | None = None
    """What the part is sealed for, in an encrypted pack."""

    @property
    def end(self) -> int:
        return self.offset + self.stored

    def location(self, name: str) -> str:
        """The location a LAZY piece is recorded under (``name:offset:length[:zRAW]``)."""
        base = f"{name}:{self.offset}:{self.stored}"
        return base if self.codec == RAW else f"{base}:z{self.raw}"


@dataclass
class PageIndex:
    ledger: bytes
    page: bytes
    eager: Part
    lazy: list[tuple[bytes, Part]]
    since: int = -1
    upto: int = -1
    ctx: dict[bytes, int] = field(default_factory=dict)

    @property
    def key(self) -> tuple[bytes, bytes]:
        return (self.ledger, self.page)


@dataclass
class Header:
    device: bytes
    seq: int
    time: int
    pages: list[PageIndex]
    extra: dict[str, Any] = field(default_factory=dict)
    """Header fields beyond the index."""


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
            stored = seal[0].seal(stored, Context(seal[1], "eager", _LEN.pack(i)))
        eager_parts.append([at, len(stored), len(raw), codec])
        body.append(stored)
        at += len(stored)
    eager_len = at
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
    head_end = len(MAGIC3) + _LEN.size + len(header)
    data = b"".join([MAGIC3, _LEN.pack(len(header)), header, *body])
    return data, head_end, head_end + eager_len


def check_head_end(head_end: int) -> None:
    """CorruptPackError if a header ending at ``head_end`` would be over :data:`MAX_HEADER`
    (called before the header is fetched)."""
    if head_end > MAX_HEAD_END:
        raise CorruptPackError(
            f"pack header would end at byte {head_end}, past the {MAX_HEAD_END} a reader accepts"
        )


def decode_header(
    data: bytes, head_end: int, eager_end: int, seal: tuple[Codec, str] | None = None
) -> Header:
    """Parse a pack's ``[0, head_end)``; raises CorruptPackError on anything wrong.

    Every part it lists must lie in the pack: EAGER sections within
    ``[head_end, eager_end)``, LAZY pieces after ``eager_end``. ``seal``: the
    bucket's codec and the pack's identity (the pack is encrypted)."""
    if seal is not None:
        header = _open_header(data, head_end, eager_end, seal)
    else:
        if len(data) != head_end or len(data) < PREFIX or data[: len(MAGIC3)] != MAGIC3:
            raise CorruptPackError("pack is truncated or not a ledgerd pack of format 3")
        (hlen,) = _LEN.unpack_from(data, len(MAGIC3))
        if PREFIX + hlen != head_end:
            raise CorruptPackError("pack header does not end where its name says")
        if hlen > MAX_HEADER:
            raise CorruptPackError(f"pack header is over {MAX_HEADER} bytes")
        header = data[PREFIX:]
    try:
        h = _unpack_header(header)
        device, seq, time, pages = h["device"], h["seq"], h["time"], h["pages"]
        ok = (
            isinstance(device, bytes)
            and len(device) == 16
            and isinstance(seq, int)
            and isinstance(time, int)
            and isinstance(pages, list)
        )
        out: list[PageIndex] = []
        if ok:
            for p in pages:
                ledger, page, e, lazy, delta = p
                if not (_name_ok(ledger) and _name_ok(page) and isinstance(lazy, list)):
                    raise ValueError("bad page entry")
                since, upto, ctx = _delta(delta)
                eager = _part(e, head_end, head_end, eager_end, seal, "eager", _LEN.pack(len(out)))
                pieces = []
                for x in lazy:
                    d = _digest(x[0])
                    pt = _part(x[1:], head_end, eager_end, None, seal, "lazy", d)
                    most = crypto.sealed_size(pt.raw) if seal else pt.raw
                    if pt.raw > MAX_PIECE or pt.stored > most:
                        raise CorruptPackError(
                            f"a LAZY piece declares {pt.raw} bytes ({pt.stored} stored), "
                            f"more than the {MAX_PIECE} accepted or than it needs"
                        )
                    pieces.append((d, pt))
                out.append(PageIndex(ledger, page, eager, pieces, since, upto, ctx))
    except CorruptPackError:
        raise
    except Exception as e:  # msgpack, KeyError, TypeError, ValueError alike
        raise CorruptPackError(f"pack header is unreadable: {e}") from e
    if not ok:
        raise CorruptPackError("pack header has malformed fields")
    known = {"device", "seq", "time", "pages"}
    return Header(device, seq, time, out, {k: v for k, v in h.items() if k not in known})


HEADER_CONTAINER = 3
"""Fewest bytes a header takes per container (array) it holds: a page's entry holds
three arrays (itself, its EAGER part of four integers, its list of LAZY pieces) and two
maps (its delta fields and their context) in at least 30 bytes, a LAZY piece one
array in at least 40. A map counts as :data:`HEADER_MAP` containers."""
HEADER_MAP = 3


def _unpack_header(header: bytes) -> Any:
    """A header's msgpack, refused (ValueError) as soon as it holds more containers
    than :data:`HEADER_CONTAINER` allows for its size: an empty array is one byte and
    56 in memory (an empty map 64, a map of one 184), so a header of tiny containers
    cost 70 times its size (4.5 GiB for one of MAX_HEADER, which is a few KiB
    compressed); within the bound it costs at most about what a real header of many
    small pages does (about 18 times its size)."""
    budget = len(header) // HEADER_CONTAINER + 16

    def count(weight: int) -> Callable[[Any], Any]:
        def hook(x: Any) -> Any:
            nonlocal budget
            budget -= weight
            if budget < 0:
                raise ValueError(f"more containers than a header of {len(header)} bytes holds")
            return x

        return hook

    return msgpack.unpackb(header, raw=False, list_hook=count(1), object_hook=count(HEADER_MAP))


def _open_header(data: bytes, head_end: int, eager_end: int, seal: tuple[Codec, str]) -> bytes:
    if len(data) != head_end or data[: len(MAGICE)] != MAGICE:
        raise CorruptPackError("pack is truncated or not an encrypted ledgerd pack")
    ctx = Context(seal[1], "header", f"{head_end}.{eager_end}".encode())
    try:
        plain = seal[0].open(data[len(MAGICE) :], ctx)
    except KeyNotHereError as e:
        raise PackKeyMissingError(f"pack header: {e}") from e
    except TamperedError as e:
        raise CorruptPackError(f"pack header: {e}") from e
    if not plain:
        raise CorruptPackError("pack header is empty")
    if plain[0] == RAW:
        if len(plain) - 1 > MAX_HEADER:
            raise CorruptPackError(f"pack header is over {MAX_HEADER} bytes")
        return plain[1:]
    try:
        return _inflate(zstandard.ZstdDecompressor(), plain[1:], MAX_HEADER)
    except zstandard.ZstdError as e:
        raise CorruptPackError(f"pack header is unreadable: {e}") from e


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
                out[_digest(bytes((t,)) + dg.content_hash(v))] = v
        else:
            _, pieces = fields
            for d, v in pieces:
                if not isinstance(v, bytes):
                    raise ValueError("piece")
                out[_digest(d)] = v
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


def _delta(x: object) -> tuple[int, int, dict[bytes, int]]:
    """A page entry's delta fields: since, upto, ctx (ValueError if malformed)."""
    if not isinstance(x, dict):
        raise ValueError("a page's delta fields are a map")
    since, upto, ctx = x.get("since"), x.get("upto"), x.get("ctx")
    if type(since) is not int or type(upto) is not int or not -1 <= since <= upto:
        raise ValueError("a page's since and upto are malformed")
    if not isinstance(ctx, dict):
        raise ValueError("a page's context is malformed")
    out: dict[bytes, int] = {}
    for tag, t in ctx.items():
        if type(tag) is not bytes or len(tag) != 8 or type(t) is not int or t < 0:
            raise ValueError("a page's context is malformed")
        out[tag] = t
    return since, upto, out


def _name_ok(x: object) -> bool:
    return isinstance(x, bytes) and 1 <= len(x) <= NAME_LIMIT


def _digest(x: object) -> bytes:
    if not isinstance(x, bytes):
        raise ValueError("digest is not bytes")
    dg.validate(x)
    if dg.is_inline(x):
        raise ValueError("an inline digest is never stored")
    return x


def _part(
    x: object,
    base: int,
    lo: int,
    hi: int | None,
    seal: tuple[Codec, str] | None = None,
    role: str = "",
    item: bytes = b"",
) -> Part:
    if not (isinstance(x, list) and len(x) == 4 and all(type(v) is int for v in x)):
        raise ValueError("bad part")
    off, stored, raw, codec = x
    p = Part(base + off, stored, raw, codec, Context(seal[1], role, item) if seal else None)
    if codec not in (RAW, ZSTD) or raw < 0 or stored < 0:
        raise ValueError("bad part")
    if raw > MAX_SECTION:
        raise ValueError(f"a part declares {raw} bytes, more than the {MAX_SECTION} accepted")
    if codec == RAW and stored != raw and seal is None:
        raise ValueError("a raw part's lengths differ")
    if p.offset < lo or (hi is not None and p.end > hi):
        raise ValueError("a part lies outside its region")
    return p
