"""Selectors and the order they compare values in (pouchdb-find's and Mango's shape).

This module owns reading a selector into a condition on a document (its operators,
its field paths, the bounds on its size and nesting) and CouchDB's collation of JSON
values. It reads no documents: :mod:`store.documents.docfind` answers a find with it.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

from ledgerd.store.documents.docmodel import shown
from ledgerd.store.errors import InvalidArgumentError

MAX_DEPTH = 32
"""Nesting of a selector's objects and lists."""
MAX_TERMS = 1000
"""Operators, fields and listed values in a selector, ``fields`` and ``sort`` together."""

MISSING: Any = object()
"""The value of a path that leads nowhere (told from JSON's null)."""

COMPARISONS = ("$eq", "$ne", "$gt", "$gte", "$lt", "$lte")
OPERATORS = (*COMPARISONS, "$in", "$nin", "$exists", "$elemMatch", "$and", "$or", "$nor", "$not")


class InvalidSelectorError(InvalidArgumentError):
    """The find request is not one this store answers (400 ``bad_request``)."""


# -- collation --------------------------------------------------------------------


def _rank(v: Any) -> int:
    if v is None or v is MISSING:
        return 0
    if v is False:
        return 1
    if v is True:
        return 2
    if isinstance(v, int | float):
        return 3
    if isinstance(v, str):
        return 4
    if isinstance(v, list):
        return 5
    return 6


def cmp_text(a: str, b: str) -> int:
    """Strings as JavaScript orders them (by UTF-16 code units, as PouchDB compares
    them): code points give that order unless a character is past U+FFFF."""
    if a == b:
        return 0
    if a.isascii() and b.isascii():
        return -1 if a < b else 1
    x, y = a.encode("utf-16-be"), b.encode("utf-16-be")
    return -1 if x < y else 1


def collate(a: Any, b: Any) -> int:
    """CouchDB's order of JSON values (as pouchdb-collate has it): null < false < true <
    numbers < strings < arrays < objects; arrays element by element, then by length;
    objects key by key in their order, each key then its value, then by size. A missing
    value collates as null. Negative, zero or positive."""
    ra, rb = _rank(a), _rank(b)
    if ra != rb:
        return ra - rb
    if ra == 3:
        return -1 if a < b else (1 if a > b else 0)
    if ra == 4:
        return cmp_text(a, b)
    if ra == 5:
        for x, y in zip(a, b, strict=False):
            c = collate(x, y)
            if c:
                return c
        return (len(a) > len(b)) - (len(a) < len(b))
    if ra == 6:
        for (ka, va), (kb, vb) in zip(a.items(), b.items(), strict=False):
            c = cmp_text(ka, kb) or collate(va, vb)
            if c:
                return c
        return (len(a) > len(b)) - (len(a) < len(b))
    return 0


# -- selectors ----------------------------------------------------------------------

Cond = Callable[[Any], bool]
"""A compiled condition on a value (``MISSING`` for a path that leads nowhere)."""


def parse_field(name: str) -> tuple[str, ...]:
    """A field path: names split at dots, ``\\.`` a dot inside a name (as in pouchdb-find)."""
    parts, cur, i = [], [], 0
    while i < len(name):
        ch = name[i]
        if ch == "\\" and i + 1 < len(name) and name[i + 1] in ".$":
            cur.append(name[i + 1])
            i += 2
            continue
        if ch == ".":
            parts.append("".join(cur))
            cur = []
        else:
            cur.append(ch)
        i += 1
    parts.append("".join(cur))
    return tuple(parts)


def value_at(value: Any, path: tuple[str, ...]) -> Any:
    """The value at ``path`` in ``value``; :data:`MISSING` when a step is not a field of
    an object (a step into a list, a string or a number leads nowhere)."""
    for name in path:
        if not isinstance(value, dict):
            return MISSING
        value = value.get(name, MISSING)
        if value is MISSING:
            return MISSING
    return value


class Compiler:
    """Compiles a selector into nested :data:`Cond` closures, counting its terms."""

    def __init__(self) -> None:
        self.terms = 0

    def count(self, n: int = 1) -> None:
        self.terms += n
        if self.terms > MAX_TERMS:
            raise InvalidSelectorError(f"the request has over {MAX_TERMS} operators and values")

    def root(self, selector: Any) -> Cond:
        if not isinstance(selector, dict):
            raise InvalidSelectorError("selector must be a JSON object")
        for key in selector:
            if key.startswith("$") and key not in ("$and", "$or", "$nor", "$not"):
                raise InvalidSelectorError(
                    f"{shown(key)} at the top of a selector: only fields, $and, $or, $nor "
                    "and $not go there"
                )
        return self.cond(selector, 0)

    def cond(self, spec: Any, depth: int) -> Cond:
        """The condition an operator object (or a value: implicit ``$eq``) puts on a value."""
        if depth > MAX_DEPTH:
            raise InvalidSelectorError(f"the selector is nested over {MAX_DEPTH} levels")
        self.count()
        if not isinstance(spec, dict):
            _check_value(spec, depth)
            return _comparison("$eq", spec)
        conds = [self._one(key, arg, depth + 1) for key, arg in spec.items()]
        if len(conds) == 1:
            return conds[0]
        return lambda v: all(c(v) for c in conds)

    def _list(self, op: str, arg: Any, depth: int) -> list[Cond]:
        if not isinstance(arg, list) or not arg:
            raise InvalidSelectorError(f"{op} takes a non-empty list of selectors")
        return [self.cond(_selector(op, s), depth + 1) for s in arg]

    def _one(self, key: str, arg: Any, depth: int) -> Cond:
        if not key.startswith("$"):  # a field of the value
            path = parse_field(key)
            inner = self.cond(arg, depth)
            return lambda v: inner(value_at(v, path))
        if key in COMPARISONS:
            _check_value(arg, depth)
            self.count()
            return _comparison(key, arg)
        if key in ("$in", "$nin"):
            if not isinstance(arg, list):
                raise InvalidSelectorError(f"{key} takes a list of values")
            self.count(len(arg))
            _check_value(arg, depth)
            return _membership(arg, key == "$in")
        if key == "$exists":
            if not isinstance(arg, bool):
                raise InvalidSelectorError("$exists takes true or false")
            return lambda v: (v is not MISSING) is arg
        if key == "$elemMatch":
            inner = self.cond(_selector(key, arg), depth)
            return lambda v: isinstance(v, list) and any(inner(x) for x in v)
        if key == "$and":
            conds = self._list(key, arg, depth)
            return lambda v: all(c(v) for c in conds)
        if key == "$or":
            conds = self._list(key, arg, depth)
            return lambda v: any(c(v) for c in conds)
        if key == "$nor":
            conds = self._list(key, arg, depth)
            return lambda v: not any(c(v) for c in conds)
        if key == "$not":
            inner = self.cond(_selector(key, arg), depth)
            return lambda v: not inner(v)
        raise InvalidSelectorError(
            f"unknown or unsupported operator {shown(key)} (supported: {', '.join(OPERATORS)})"
        )


def _selector(op: str, arg: Any) -> dict[str, Any]:
    if not isinstance(arg, dict):
        raise InvalidSelectorError(f"{op} takes a selector (a JSON object)")
    return arg


def _check_value(v: Any, depth: int) -> None:
    """Refuse an operand that is not JSON or nests too deeply."""
    stack = [(v, depth)]
    while stack:
        x, d = stack.pop()
        if d > MAX_DEPTH:
            raise InvalidSelectorError(f"the selector is nested over {MAX_DEPTH} levels")
        if isinstance(x, float) and not math.isfinite(x):
            raise InvalidSelectorError("a selector's numbers must be finite")
        if isinstance(x, str) and not _is_text(x):
            raise InvalidSelectorError("a selector's strings must be UTF-8 text (a lone surrogate)")
        if isinstance(x, list):
            stack.extend((y, d + 1) for y in x)
        elif isinstance(x, dict):
            stack.extend((y, d + 1) for y in x.values())


def _is_text(s: str) -> bool:
    try:
        s.encode()
    except UnicodeEncodeError:
        return False
    return True


def _comparison(op: str, operand: Any) -> Cond:
    if op == "$eq":
        return lambda v: v is not MISSING and collate(v, operand) == 0
    if op == "$ne":
        return lambda v: collate(v, operand) != 0  # (a missing value collates as null)
    if op == "$gt":
        return lambda v: v is not MISSING and collate(v, operand) > 0
    if op == "$gte":
        return lambda v: v is not MISSING and collate(v, operand) >= 0
    if op == "$lt":
        return lambda v: v is not MISSING and collate(v, operand) < 0
    return lambda v: v is not MISSING and collate(v, operand) <= 0


def _membership(values: list[Any], inside: bool) -> Cond:
    """``$in`` (``inside``) or ``$nin``: a value that is present and not null, equal to
    one of ``values`` (a list: one of its elements equal to one of them) or not."""

    def cond(v: Any) -> bool:
        if v is MISSING or v is None:
            return False
        items = v if isinstance(v, list) else [v]
        found = any(collate(x, y) == 0 for y in values for x in items)
        return found is inside

    return cond


def compile_selector(selector: Any) -> Cond:
    """The condition a selector puts on a document (its data, with ``_id`` and
    ``_rev``); InvalidSelectorError for one this store does not answer."""
    return Compiler().root(selector)


# -- requests ----------------------------------------------------------------------
