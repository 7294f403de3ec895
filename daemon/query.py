"""What a request asks for beside its path: its query string and its byte range.

This module owns :class:`Query`, the one parser of query strings every route uses
(parameters as percent-decoded bytes, or as strict UTF-8 text for the document routes),
and the ``Range`` / ``If-Range`` headers (and ``?offset=&length=``) of ranged reads.
What the parameters mean is each route's; their error codes are :mod:`daemon.errors`'.
"""

from __future__ import annotations

import base64
import builtins
import math
import re
from collections.abc import Mapping
from typing import Any
from urllib.parse import parse_qsl

from aiohttp import hdrs, web

from ledgerd.daemon import errors as ae
from ledgerd.daemon.codec import (
    flag_param,
    integer_param,
    number_param,
    parse_json,
    repeated_param,
    token_param,
)

MIN_SECONDS = 0.001
"""The smallest timeout a query takes (``POST /v1/sync?timeout=``): a millisecond, below
which nothing could finish (5e-324 is a number, not a timeout)."""

_KEY = "ledgerd.query"
"""Where a request keeps its parsed query (:meth:`Query.of`)."""


class Query:
    """A request's query parameters, parsed once from the query string as sent.

    :meth:`bytes` and the readers over it take each value as raw bytes (percent-decoded,
    not UTF-8-decoded: names and keys may hold any byte). :meth:`utf8` and its readers,
    those of the document routes, take the whole query string as strict UTF-8 (aiohttp's
    ``request.query`` turns bytes that are not UTF-8 into U+FFFD, so a value would
    silently name something the client never sent). A name given more than once is 400
    when it is read (each takes one value: the first or the last winning would act on
    what the client may not have meant)."""

    __slots__ = ("raw", "_params", "_repeated", "_texts")

    @classmethod
    def of(cls, request: web.BaseRequest) -> Query:
        """The request's parameters, from its query string as sent (still
        percent-encoded: aiohttp's ``query_string`` is decoded as UTF-8 already)."""
        raw = request.rel_url.raw_query_string
        if not raw:
            return _NO_QUERY
        found: Query | None = request.get(_KEY)
        if found is None:
            found = request[_KEY] = cls(raw)
        return found

    def __init__(self, raw: str) -> None:
        self.raw = raw
        self._params: dict[str, bytes] | None = None
        self._repeated: dict[str, None] = {}
        """Names given more than once, in the order they came."""
        self._texts: dict[str, str | None] | None = None

    # -- values as bytes -----------------------------------------------------------

    @property
    def params(self) -> dict[str, bytes]:
        """Every parameter's first value, as bytes."""
        if self._params is None:
            self._params = {}
            for k, v in parse_qsl(self.raw, keep_blank_values=True, encoding="latin-1"):
                if k in self._params:
                    self._repeated[k] = None
                self._params.setdefault(k, v.encode("latin-1"))
        return self._params

    def distinct(self) -> None:
        """400 when any parameter, read or not, is given more than once."""
        if self.params and self._repeated:
            raise repeated_param(next(iter(self._repeated)))

    def bytes(self, name: str) -> bytes | None:
        params = self.params
        if name in self._repeated:
            raise repeated_param(name)
        return params.get(name)

    def text(self, name: str) -> str | None:
        v = self.bytes(name)
        if v is None:
            return None
        try:
            return v.decode()
        except UnicodeDecodeError:
            raise ae.BadRequest(f"query parameter {name} is not UTF-8") from None

    def int(self, name: str, default: int | None = None, lo: int = 0) -> int | None:
        v = self.text(name)
        if v is None or v == "":
            return default
        n = integer_param(name, v)
        if n < lo:
            raise ae.BadRequest(f"query parameter {name} must be at least {lo}")
        return n

    def seconds(self, name: str, default: float) -> float:
        """A finite number of seconds, at least :data:`MIN_SECONDS` (``default`` when
        absent); anything else is 400 ``invalid_timeout``."""
        v = self.text(name)
        if v is None or v == "":
            return default
        n = number_param(name, v)
        if not math.isfinite(n) or n < MIN_SECONDS:
            raise ae.InvalidTimeout(
                f"query parameter {name} must be a number of seconds, at least {MIN_SECONDS}"
                f" (not {v[:40]})"
            )
        return n

    def flag(self, name: str, default: bool) -> bool:
        """A flag (:func:`codec.flag_param`: 1, true, yes; 0, false, no or empty)."""
        v = self.text(name)
        if v is None:
            return default
        return flag_param(name, v)

    # -- values as UTF-8 text (the document routes) ----------------------------------

    @property
    def texts(self) -> dict[str, str | None]:
        """Every parameter as strict UTF-8 text; a name given more than once has
        ``None`` for its value (:meth:`utf8` refuses it). 400 when any of the query
        string is not UTF-8."""
        if self._texts is None:
            try:
                pairs = parse_qsl(self.raw, keep_blank_values=True, errors="strict")
            except UnicodeDecodeError:
                raise ae.BadRequest("query parameters must be percent-encoded UTF-8") from None
            found: dict[str, str | None] = {}
            for k, v in pairs:
                found[k] = None if k in found else v
            self._texts = found
        return self._texts

    def utf8(self, name: str) -> str | None:
        """The parameter ``name`` as text (None when absent)."""
        texts = self.texts
        v = texts.get(name)
        if v is None and name in texts:
            raise repeated_param(name)
        return v

    def utf8_flag(self, name: str) -> bool:
        """A flag (:func:`codec.flag_param`); false when absent."""
        v = self.utf8(name)
        return v is not None and flag_param(name, v)

    def utf8_int(
        self, name: str, default: builtins.int, lo: builtins.int, hi: builtins.int
    ) -> builtins.int:
        v = self.utf8(name)
        if v is None or v == "":
            return default
        n = integer_param(name, v)
        if not lo <= n <= hi:
            raise ae.BadRequest(f"query parameter {name} must be {lo}-{hi}")
        return n

    def utf8_seconds(self, name: str, default: float, lo: float) -> float:
        v = self.utf8(name)
        if v is None or v == "":
            return default
        n = number_param(name, v)
        if not math.isfinite(n) or n < lo:
            raise ae.BadRequest(
                f"query parameter {name} must be a number of seconds, at least {lo:g}"
            )
        return n

    def json(self, name: str) -> Any:
        """A JSON value (None when absent)."""
        v = self.utf8(name)
        what = f"query parameter {name} (JSON: a string is quoted, {name}=%22Oslo%22)"
        return None if v is None else parse_json(v, what)

    def bound(self, name: str) -> Any:
        """``start`` or ``end`` of a query's sort range (JSON), None when left out.
        ``null`` and an empty value are 400: null is a sort value (the lowest), so
        ``end=null`` read as "no bound" would answer documents the range excludes, and
        read as a value would answer none; an open range leaves the parameter out."""
        v = self.utf8(name)
        if v is None:
            return None
        if v.strip() == "":
            raise ae.BadRequest(f"query parameter {name} is empty: leave it out for an open range")
        value = self.json(name)
        if value is None:
            raise ae.BadRequest(
                f"query parameter {name} is null: leave it out for an open range"
                " (null is the lowest sort value, not a bound)"
            )
        return value

    def url_token(self) -> builtins.bytes | None:
        """``?token=``: the ``next`` of the page before, URL-safe base64 without padding
        (a token in standard base64, as ledgerd sent them before, is read too)."""
        t = self.utf8("token")
        if not t:
            return None
        t = t.replace("-", "+").replace("_", "/")
        return token_param(t + "=" * (-len(t) % 4))


def url_token_text(token: bytes) -> str:
    """A continuation token as ``next`` carries it (:meth:`Query.url_token`): URL-safe
    base64 without padding, so that it goes into a query string as it is."""
    return base64.urlsafe_b64encode(token).decode().rstrip("=")


_NO_QUERY = Query("")
"""The parameters of every request without a query string (most of them)."""


# -- byte ranges -----------------------------------------------------------------------

_RANGE_SPEC = re.compile(r"([0-9]*)-([0-9]*)", re.ASCII)


def _position(digits: str) -> int:
    """A byte position; one past any value's size when it is too long to be a size
    (and too long for ``int()``'s digit limit). Leading zeros are no part of its length
    (RFC 9110 allows them: ``bytes=000…0001-2`` is bytes 1-2)."""
    digits = digits.lstrip("0") or "0"
    return int(digits) if len(digits) <= 18 else 2**63


def requested_range(
    headers: Mapping[str, str], size: int, etag: str | None, q: Query
) -> tuple[int, int] | None:
    """The part of a ``size``-byte value that a request's ``Range`` asks for, as
    (offset, length), or None for the whole value (a 200): no ``Range``, or one to
    ignore (see :func:`parse_range`), or an ``If-Range`` that is not ``etag`` (the
    value changed since the client read its first part: RFC 9110 13.1.5; a date, or a
    value without an ETag, never matches). Without a ``Range``, the query's
    ``offset`` and ``length`` ask the same way (206, or 416 when no byte is selected)."""
    header = headers.get(hdrs.RANGE)
    if header is None:
        return _query_range(q, size)
    if_range = headers.get(hdrs.IF_RANGE)
    if if_range is not None and (etag is None or if_range.strip() != etag):
        return None
    return parse_range(header, size)


def _query_range(q: Query, size: int) -> tuple[int, int] | None:
    if q.text("offset") is None and q.text("length") is None:
        return None
    offset = q.int("offset", 0) or 0
    want = q.int("length", size - offset)
    length = max(0, min(size - offset, size if want is None else want))
    if offset >= size or length == 0:
        why = (
            f"offset {offset} is at or past the end"
            if offset >= size
            else f"length {want} selects no byte"
        )
        raise ae.RangeNotSatisfiable(
            f"{why} of the {size}-byte value", {"Content-Range": f"bytes */{size}"}
        )
    return offset, length


def _unsatisfiable(header: str, size: int, why: str) -> ae.RangeNotSatisfiable:
    return ae.RangeNotSatisfiable(
        f"range {header[:100]} {why} the {size}-byte value", {"Content-Range": f"bytes */{size}"}
    )


def _specs(header: str) -> list[re.Match[str]] | None:
    """The ranges of a ``Range`` header (400 when malformed); None for a unit other
    than bytes."""
    unit, eq, spec_list = header.strip().partition("=")
    if eq and unit.strip().lower() != "bytes":
        return None
    specs = [s.strip() for s in spec_list.split(",") if s.strip()]  # empty elements: RFC 9110 5.6.1
    parsed = [_RANGE_SPEC.fullmatch(s) for s in specs]
    found = [m for m in parsed if m is not None and not m.group(1) == m.group(2) == ""]
    if not eq or not specs or len(found) < len(parsed):
        raise ae.BadRequest(f"malformed Range header {header[:100]!r}: expected bytes=a-b")
    for m in found:
        if m.group(1) and m.group(2) and _position(m.group(2)) < _position(m.group(1)):
            raise ae.BadRequest(
                f"malformed Range header {header[:100]!r}: the end is before the start"
            )
    return found


def parse_range(header: str, size: int) -> tuple[int, int] | None:
    """A ``Range`` header as (offset, length) of a ``size``-byte value, as RFC 9110 14:
    ``bytes=a-b``, ``bytes=a-`` or ``bytes=-n`` (the unit in any case); a range that
    selects no byte (``bytes=-0``, a start at or past the end) is 416; a malformed one
    400. None (serve the whole value, 200) where the RFC lets a server ignore the
    header: a unit other than bytes (it must), several ranges (no multipart answers
    here), and a suffix range of an empty value (satisfiable: the whole, empty, value)."""
    parsed = _specs(header)
    if parsed is None or len(parsed) > 1:
        return None
    first, last = parsed[0].group(1), parsed[0].group(2)
    if first == "":  # a suffix: the last n bytes
        n = _position(last)
        if n == 0:
            raise _unsatisfiable(header, size, "selects no byte of")
        if size == 0:
            return None
        return size - min(n, size), min(n, size)
    a = _position(first)
    if a >= size:
        raise _unsatisfiable(header, size, "is outside")
    b = min(_position(last), size - 1) if last else size - 1
    return a, b - a + 1
