"""Pages held open for as long as a request (or a session's op) is served.

This module owns :func:`page_leases`, the block around one request or op, and
:func:`hold`, by which :meth:`daemon.api.Api.page` leases each page it hands out
until that block ends. A lease only counts users (``Page.lease``): the repository
closes no page that is leased.
"""

from __future__ import annotations

import contextlib
import contextvars

from ledgerd.store import Page


class _Leases:
    """The page leases of one request or session op (see :func:`page_leases`)."""

    __slots__ = ("held", "_token")

    def __init__(self) -> None:
        self.held: list[contextlib.AbstractContextManager[Page]] = []

    def hold(self, page: Page) -> None:
        lease = page.lease()
        lease.__enter__()
        self.held.append(lease)

    def __enter__(self) -> _Leases:
        self._token = _leases.set(self)
        return self

    def __exit__(self, *exc: object) -> None:
        _leases.reset(self._token)
        while self.held:  # each ends however the block ended: a lease only counts users
            self.held.pop().__exit__(None, None, None)


_leases: contextvars.ContextVar[_Leases] = contextvars.ContextVar("leases")
"""The page leases of the request (or session op) being served."""


def page_leases() -> _Leases:
    """Pages that :meth:`Api.page` hands out inside the block stay leased (open)
    until it ends: one block per request, and one per op of a session (a session's
    transactions and watchers keep their pages open by themselves)."""
    return _Leases()


def hold(page: Page) -> None:
    """Lease ``page`` until the :func:`page_leases` block being run ends (outside any
    block, nothing is held)."""
    leases = _leases.get(None)
    if leases is not None:
        leases.hold(page)
