"""Object digests: the names of immutable, content-addressed pieces.

This module owns the digest format and nothing else (no storage, no splitting).

A digest is one *type byte* followed by a body:

* if the content is at most :data:`INLINE_LIMIT` bytes (a value) or
  :data:`TREE_INLINE_LIMIT` (a tree node) the body is the content itself (the piece is
  *inlined* and never stored as a row);
* otherwise the body is ``SHA-256(u64_be(len(content)) || content)``.

The type byte is a bit field:

=====  =======================================================
bit 0  1 = inline (body is the content), 0 = body is a SHA-256
bit 1  1 = index piece (lists child digests), 0 = data chunk
bit 2  1 = part of a tree node, 0 = part of a value
bit 3  1 = a tombstone: exactly :data:`TOMBSTONE` (0x09, no body)
=====  =======================================================

A *tombstone* is the value of a key deleted by a commit whose base did not have
it: an inline, empty value with bit 3 set. It keeps such a delete in the tree so
that merges weigh it like a put (see :mod:`store.page.view`, which reads it as absent).
Being inline, it is never stored, uploaded or fetched.

Identical content of the same kind therefore has an identical digest on every
device, which is what makes dedup and sync work.
"""

from __future__ import annotations

import enum
import hashlib
import struct

from ledgerd.store.errors import InvalidDigestError

INLINE_LIMIT = 128
"""A value of at most this many bytes is carried inside its digest, in the tree's
leaves, rather than stored as a piece of its own (page format 3; 32 before). A piece
costs its row, its entry in the digest index, its row in ``unsynced``, a read of its
own and its 33-byte digest in the leaf, about 100 bytes and a random index insert
beyond its content: a value this small costs less carried by the leaves, which are
stored as deltas (``docs/storage.md``). Loading 100,000 random 100-byte values took
about a tenth less time, and inserting 100,000 small documents less than half."""

TREE_INLINE_LIMIT = 32
"""A tree node of at most this many bytes is carried inside its digest (a commit's root
digest holds a tiny page's whole tree: kept small, so that such a page's deleted bytes
outlive a purge only there, ``docs/operations.md``)."""

HASH_SIZE = 32

_INLINE = 0x01
_INDEX = 0x02
_TREE = 0x04
_DELETED = 0x08
_KNOWN_BITS = _INLINE | _INDEX | _TREE | _DELETED

TOMBSTONE = bytes((_DELETED | _INLINE,))
"""The value digest of a deleted key kept in the tree (see above)."""

_U64 = struct.Struct(">Q")


class Kind(enum.IntEnum):
    """What an object is: a user value or a page tree node."""

    VALUE = 0
    TREE = _TREE


def inline_limit(kind: Kind) -> int:
    """The most bytes a piece of ``kind`` carries inside its digest."""
    return TREE_INLINE_LIMIT if kind is Kind.TREE else INLINE_LIMIT


def _type_byte(kind: Kind, *, index: bool, inline: bool) -> int:
    return int(kind) | (_INDEX if index else 0) | (_INLINE if inline else 0)


def content_hash(content: bytes | memoryview) -> bytes:
    """SHA-256 over ``u64(len) || content`` (the length prefix defeats extension games)."""
    h = hashlib.sha256(_U64.pack(len(content)))
    h.update(content)
    return h.digest()


def chunk_digest(kind: Kind, content: bytes | memoryview) -> bytes:
    """Digest of a data chunk (a leaf piece)."""
    if len(content) <= inline_limit(kind):
        return bytes((_type_byte(kind, index=False, inline=True),)) + bytes(content)
    return bytes((_type_byte(kind, index=False, inline=False),)) + content_hash(content)


VALUE_CHUNK = bytes((_type_byte(Kind.VALUE, index=False, inline=False),))
"""The type byte of a value of one hashed piece."""
VALUE_INLINE = bytes((_type_byte(Kind.VALUE, index=False, inline=True),))
"""The type byte of a value carried in its digest."""
TREE_CHUNK = bytes((_type_byte(Kind.TREE, index=False, inline=False),))
"""The type byte of a tree node of one hashed piece."""
_sha256 = hashlib.sha256


def value_chunk_digest(content: bytes) -> bytes:
    """``chunk_digest(Kind.VALUE, content)`` for bytes, on the hot path of small writes."""
    if len(content) <= INLINE_LIMIT:
        return VALUE_INLINE + content
    return VALUE_CHUNK + _sha256(_U64.pack(len(content)) + content).digest()


def index_digest(kind: Kind, content: bytes | memoryview) -> bytes:
    """Digest of an index piece. Index content is never inlined."""
    return bytes((_type_byte(kind, index=True, inline=False),)) + content_hash(content)


def validate(digest: bytes) -> bytes:
    """Return ``digest`` if it is well formed, else raise :class:`InvalidDigestError`."""
    if not digest:
        raise InvalidDigestError("empty digest")
    t = digest[0]
    if t & ~_KNOWN_BITS:
        raise InvalidDigestError(f"unknown digest type byte 0x{t:02x}")
    if t & _DELETED and digest != TOMBSTONE:
        raise InvalidDigestError("a tombstone digest is the single byte 0x09")
    if t & _INLINE:
        if t & _INDEX:
            raise InvalidDigestError("index pieces are never inline")
        limit = inline_limit(kind_of(digest))
        if len(digest) - 1 > limit:
            raise InvalidDigestError(f"inline digest longer than {limit} bytes")
    elif len(digest) != 1 + HASH_SIZE:
        raise InvalidDigestError(f"hashed digest must be {1 + HASH_SIZE} bytes, got {len(digest)}")
    return digest


def is_valid_hashed_type(t: int) -> bool:
    """Whether ``t`` is the type byte of a well-formed hashed (not inline) digest."""
    return not t & ~_KNOWN_BITS and not t & (_INLINE | _DELETED)


def is_inline(digest: bytes) -> bool:
    return bool(digest[0] & _INLINE)


def is_index(digest: bytes) -> bool:
    return bool(digest[0] & _INDEX)


def kind_of(digest: bytes) -> Kind:
    return Kind.TREE if digest[0] & _TREE else Kind.VALUE


def inline_content(digest: bytes) -> bytes:
    """The content carried by an inline digest."""
    assert is_inline(digest)
    return digest[1:]


def verify(digest: bytes, content: bytes | memoryview) -> bool:
    """True if ``content`` is exactly what ``digest`` names."""
    if is_inline(digest):
        return bytes(content) == digest[1:]
    if len(content) <= inline_limit(kind_of(digest)) and not is_index(digest):
        return False  # (its digest is the content: there is one name for each piece)
    return content_hash(content) == digest[1:]


def short(digest: bytes) -> str:
    """A short printable form for logs and errors."""
    return f"{digest[:1].hex()}:{digest[1:9].hex()}"
