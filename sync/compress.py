"""Compressing a pack's parts, and inflating them within the bounds their index declares.

This module owns the codecs of a stored part (:data:`RAW`, :data:`ZSTD`),
:func:`squeeze` (compress when that makes it smaller) and :func:`unsqueeze`, which
never inflates more than a part declares, so that a small part that inflates to
gigabytes (a decompression bomb) costs no more than its declaration. The pack
format is :mod:`sync.pack`'s.
"""

from __future__ import annotations

import zstandard

from ledgerd.sync.errors import CorruptPackError

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
INFLATE_STEP = 1024 * 1024
"""Bytes inflated at a time."""
ZSTD_LEVEL = 3


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
            out = inflate(zstandard.ZstdDecompressor(), stored, raw_len)
        except zstandard.ZstdError as e:
            raise CorruptPackError(f"a compressed part of a pack is unreadable: {e}") from e
    if len(out) != raw_len:
        raise CorruptPackError("a part of a pack has another length than its index says")
    return out


def inflate(d: zstandard.ZstdDecompressor, stored: bytes, most: int) -> bytes:
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
