"""Matching a request's method and raw path against a table of routes.

This module owns :class:`Route` (methods, a path pattern under ``/v1/``, a handler) and
:class:`Router`, the index that finds a request's route in a few steps. The table
itself is :data:`ledgerd.daemon.routes.ROUTES`; what a handler is, is
:mod:`daemon.api`'s (this module only carries it).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Generic, TypeVar

H = TypeVar("H")


@dataclass(frozen=True)
class Route(Generic[H]):
    """Methods, a path under ``/v1/`` and the handler serving them. In the path,
    ``{name}`` is one segment and ``{name*}`` the rest of the path (keys may hold
    ``/``)."""

    methods: frozenset[str]
    path: tuple[str, ...]
    handler: H
    counted: bool = True
    """Whether a request takes one of ``max_concurrent_requests`` (``Api.take_slot``)."""
    template: str = field(init=False)
    """The path as ``/v1/...`` with ``{name}`` for every parameter (the metrics' label)."""
    _literals: tuple[tuple[int, str], ...] = field(init=False, repr=False)
    _params: tuple[tuple[int, str], ...] = field(init=False, repr=False)
    _tail: str | None = field(init=False, repr=False)

    def __post_init__(self) -> None:
        tail = self.path[-1][1:-2] if self.path[-1].endswith("*}") else None
        fixed = self.path[:-1] if tail is not None else self.path
        if any(s.endswith("*}") for s in fixed):
            raise ValueError(f"only the last segment may be a {{name*}} tail: {self.path}")
        set_ = object.__setattr__  # computed once: the dataclass is frozen
        set_(self, "template", "/v1/" + "/".join(s.replace("*}", "}") for s in self.path))
        set_(self, "_literals", tuple((i, s) for i, s in enumerate(fixed) if s[:1] != "{"))
        set_(self, "_params", tuple((i, s[1:-1]) for i, s in enumerate(fixed) if s[:1] == "{"))
        set_(self, "_tail", tail)

    def fits(self, length: int) -> bool:
        """A path of ``length`` segments may match (a tail takes one or more)."""
        return length >= len(self.path) if self._tail is not None else length == len(self.path)

    def match(self, parts: list[str]) -> dict[str, str] | None:
        """The path's parameters (still percent-encoded) if ``parts`` match."""
        if not self.fits(len(parts)):
            return None
        for i, literal in self._literals:
            if parts[i] != literal:
                return None
        found = {name: parts[i] for i, name in self._params}
        if self._tail is not None:
            found[self._tail] = "/".join(parts[len(self.path) - 1 :])
        return found


def route(methods: str, path: str, handler: H, *, counted: bool = True) -> Route[H]:
    """A route from its methods (``"GET HEAD"``) and path (``"ledgers/{ledger}"``)."""
    return Route(frozenset(methods.split()), tuple(path.split("/")), handler, counted)


class Router(Generic[H]):
    """Routes indexed by method, first segment and number of segments.

    A request's route is the first of ``routes``, in their order, whose path and
    method match; the index only leaves out the routes that cannot (another method,
    another first segment, too few or too many segments), so the answer is the one
    of trying every route in order, in a few steps rather than forty."""

    def __init__(self, routes: list[Route[H]]) -> None:
        self.longest = max(len(r.path) for r in routes)
        self.firsts = {r.path[0] for r in routes if r.path[0][:1] != "{"}
        self.methods = methods = {m for r in routes for m in r.methods}
        self.index: dict[tuple[str, str | None, int], tuple[Route[H], ...]] = {}
        for method in methods:
            for first in [*self.firsts, None]:
                for length in range(1, self.longest + 2):
                    found = tuple(
                        r
                        for r in routes
                        if method in r.methods
                        and (r.path[0] == first or r.path[0][:1] == "{")
                        and r.fits(length)
                    )
                    if found:
                        self.index[method, first, length] = found

    def allowed(self, parts: list[str]) -> list[str]:
        """The methods some route serves on the path ``parts`` (after ``v1``)."""
        return sorted(m for m in self.methods if self.find(m, parts) is not None)

    def find(self, method: str, parts: list[str]) -> tuple[Route[H], dict[str, str]] | None:
        """The route serving ``method`` on the path ``parts`` (after ``v1``), and its
        parameters; None if there is none."""
        if not parts:
            return None
        first = parts[0] if parts[0] in self.firsts else None
        for r in self.index.get((method, first, min(len(parts), self.longest + 1)), ()):
            found = r.match(parts)
            if found is not None:
                return r, found
        return None
