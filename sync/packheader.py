"""A pack's header: the index of what the pack holds, and its strict parsing.

This module owns the types a header lists (:class:`Header`, a :class:`PageIndex` per
page, a :class:`Part` per section or LAZY piece), the bounds a reader holds a header
to (:data:`MAX_HEADER`, :data:`MAX_HEAD_END`, :data:`MAX_PIECE`,
:data:`HEADER_CONTAINER`) and :func:`decode_header`, which checks every length,
offset and type. The format, and everything else about packs, is :mod:`sync.pack`'s.
"""

from __future__ import annotations

import struct
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import msgpack
import zstandard

from ledgerd.store import NAME_LIMIT
from ledgerd.store.pieces import digest as dg
from ledgerd.sync import crypto
from ledgerd.sync.compress import MAX_SECTION, RAW, ZSTD, inflate
from ledgerd.sync.crypto import Codec, Context, KeyNotHereError, TamperedError
from ledgerd.sync.errors import CorruptPackError, PackKeyMissingError

MAGIC3 = b"LDGPACK3"
MAGICE = b"LDGPACKE"
LEN = struct.Struct(">I")
PREFIX = len(MAGIC3) + LEN.size
MAX_PIECE = 1024 * 1024
"""Largest raw LAZY piece a reader accepts: a pack index declaring one larger (or
stored larger than its raw bytes need) is refused. Values are split into
pieces of at most 64 KiB (``store.pieces.split.MAX_CHUNK``; an index piece holds at most
1,024 children, about 45 KiB), so none is near it. A LAZY piece is fetched whole on
first read: before, a hostile index could declare one as long as its object, and a
read fetched all of it into memory before its digest check failed."""
MAX_HEADER = 64 * 1024 * 1024
"""Largest header a reader accepts (a round of tens of thousands of pages fits)."""
MAX_HEAD_END = len(MAGICE) + crypto.sealed_size(1 + MAX_HEADER)
"""Where a pack's header ends at the latest, sealed or not. A name saying later is
refused (:func:`check_head_end`) before anything is read: a hostile name over a huge
object would otherwise have a device read all of it as a header."""


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
        header = _plain_header(data, head_end)
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
        out = _page_indexes(pages, head_end, eager_end, seal) if ok else []
    except CorruptPackError:
        raise
    except Exception as e:  # msgpack, KeyError, TypeError, ValueError alike
        raise CorruptPackError(f"pack header is unreadable: {e}") from e
    if not ok:
        raise CorruptPackError("pack header has malformed fields")
    known = {"device", "seq", "time", "pages"}
    return Header(device, seq, time, out, {k: v for k, v in h.items() if k not in known})


def _plain_header(data: bytes, head_end: int) -> bytes:
    """The header of a plain pack's ``[0, head_end)``."""
    if len(data) != head_end or len(data) < PREFIX or data[: len(MAGIC3)] != MAGIC3:
        raise CorruptPackError("pack is truncated or not a ledgerd pack of format 3")
    (hlen,) = LEN.unpack_from(data, len(MAGIC3))
    if PREFIX + hlen != head_end:
        raise CorruptPackError("pack header does not end where its name says")
    if hlen > MAX_HEADER:
        raise CorruptPackError(f"pack header is over {MAX_HEADER} bytes")
    return data[PREFIX:]


def _page_indexes(
    pages: list[Any], head_end: int, eager_end: int, seal: tuple[Codec, str] | None
) -> list[PageIndex]:
    """The header's page entries (ValueError, or CorruptPackError, if one is malformed)."""
    out: list[PageIndex] = []
    for p in pages:
        ledger, page, e, lazy, delta = p
        if not (_name_ok(ledger) and _name_ok(page) and isinstance(lazy, list)):
            raise ValueError("bad page entry")
        since, upto, ctx = _delta(delta)
        eager = _part(e, head_end, head_end, eager_end, seal, "eager", LEN.pack(len(out)))
        pieces = [_lazy_piece(x, head_end, eager_end, seal) for x in lazy]
        out.append(PageIndex(ledger, page, eager, pieces, since, upto, ctx))
    return out


def _lazy_piece(
    x: Any, head_end: int, eager_end: int, seal: tuple[Codec, str] | None
) -> tuple[bytes, Part]:
    """A page entry's LAZY piece: its digest and where it lies."""
    d = valid_digest(x[0])
    pt = _part(x[1:], head_end, eager_end, None, seal, "lazy", d)
    most = crypto.sealed_size(pt.raw) if seal else pt.raw
    if pt.raw > MAX_PIECE or pt.stored > most:
        raise CorruptPackError(
            f"a LAZY piece declares {pt.raw} bytes ({pt.stored} stored), "
            f"more than the {MAX_PIECE} accepted or than it needs"
        )
    return d, pt


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
        return inflate(zstandard.ZstdDecompressor(), plain[1:], MAX_HEADER)
    except zstandard.ZstdError as e:
        raise CorruptPackError(f"pack header is unreadable: {e}") from e


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


def valid_digest(x: object) -> bytes:
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
