"""Continuation tokens of the document layer: where a listing, a query or a page of
the changes feed goes on, bound to what it continues.

This module owns the tokens' bytes (opaque to callers; the HTTP API sends them as
URL-safe base64). A token holds its kind, a digest of what it continues (the
*binding*: collection, index and its definition, partition and sort bounds,
``since``, whether deleted documents are included, ...), the position, and a
check of all that. A token given to another listing (another collection, index,
``eq`` value, range or ``deleted`` flag) is refused, as is one that is garbled or
made up: continuing from its position would answer documents of a query nobody
asked for. It does not own the positions' meaning (:mod:`store.documents.documents`).

Tokens of ledgerd before this format (a bare document id, or a msgpack pair) are
refused with a message saying to start the listing again.
"""

from __future__ import annotations

import hashlib
from typing import Any

import msgpack

from ledgerd.store.errors import InvalidArgumentError

VERSION = b"\xd7"
"""The tokens' first byte (not one a token of an earlier ledgerd began with: theirs
were a ULID, whose first byte is 0x00-0x07 for two thousand years, or msgpack's
0x92 pair)."""

LIST, FIND, CHANGES = b"L", b"F", b"C"
"""Kinds of token: a collection's listing, an index query, the changes feed."""

_BINDING = 8
_CHECK = 4
_PERSON = b"ledgerd.doctoken"


class TokenError(InvalidArgumentError):
    """The continuation token is not one of this listing's."""


def _digest(data: bytes, size: int) -> bytes:
    return hashlib.blake2b(data, digest_size=size, person=_PERSON).digest()


def binding(*parts: Any) -> bytes:
    """The digest of what a token continues (scalars, bytes, lists of them)."""
    return _digest(msgpack.packb(list(parts), use_bin_type=True), _BINDING)


def encode(kind: bytes, bound: bytes, position: list[bytes | str]) -> bytes:
    """A token of ``kind`` bound to ``bound`` (:func:`binding`) at ``position``."""
    packed: bytes = msgpack.packb(position, use_bin_type=True)
    body = VERSION + kind + bound + packed
    return body + _digest(body, _CHECK)


def decode(token: bytes, kind: bytes, bound: bytes, size: int) -> list[Any]:
    """The position (``size`` byte strings, or text: a chosen document id) of a token
    of ``kind`` bound to ``bound``; TokenError if it is garbled, of an older ledgerd,
    or of another listing."""
    if not isinstance(token, bytes) or len(token) < 2 + _BINDING + _CHECK or token[:1] != VERSION:
        if isinstance(token, bytes) and (len(token) == 16 or token[:1] == b"\x92"):
            raise TokenError(
                "the continuation token is of an older ledgerd: start the listing again"
            )
        raise TokenError("malformed continuation token")
    body, check = token[:-_CHECK], token[-_CHECK:]
    if _digest(body, _CHECK) != check:
        raise TokenError("malformed continuation token")
    if body[1:2] != kind or body[2 : 2 + _BINDING] != bound:
        raise TokenError(
            "the continuation token is of another listing (another collection, index, "
            "eq value, range, since or deleted flag): send it with the request it came from"
        )
    try:
        position = msgpack.unpackb(body[2 + _BINDING :], raw=False)
    except (ValueError, TypeError, msgpack.UnpackException):
        raise TokenError("malformed continuation token") from None
    if (
        not isinstance(position, list)
        or len(position) != size
        or not all(isinstance(p, bytes | str) for p in position)
    ):
        raise TokenError("malformed continuation token")
    return position
