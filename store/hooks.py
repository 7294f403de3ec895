"""What a repository's pages reach out to: the collaborators given when it opens.

A page needs three things it cannot do itself, and gets them through these small
protocols when :meth:`store.repository.Repository.open` is called, rather than
having them patched onto it afterwards:

* a :class:`PieceFetcher`, which brings pieces this device does not store (LAZY
  values, in the daemon the sync engine fetching them from the bucket);
* a :class:`CommitListener`, told of every commit a page stores (sync uses it to
  know which pages have something to upload);
* a :class:`ResolverSource`, asked for the conflict resolver of a ledger when a
  merge under a non-automatic policy needs an answer.

Each is optional; the embedded API uses none. This module owns the protocols
only; what implements them lives above ``store``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol

if TYPE_CHECKING:
    from ledgerd.store.commit import Commit
    from ledgerd.store.merge import Resolver
    from ledgerd.store.page import Page


class PieceFetcher(Protocol):
    async def fetch_pieces(self, page: Page, digests: list[bytes]) -> dict[bytes, bytes]:
        """The contents of ``digests`` that can be had (unverified: the page checks them)."""
        ...


class CommitListener(Protocol):
    def page_committed(self, page: Page, commit: Commit) -> None:
        """``commit`` is stored in ``page`` (called on the event loop; must not block)."""
        ...


class ResolverSource(Protocol):
    def resolver_for(self, ledger: bytes) -> Resolver | None:
        """The conflict resolver connected for ``ledger``, or None."""
        ...


@dataclass(frozen=True, slots=True)
class PageHooks:
    """The collaborators of every page of a repository (all optional)."""

    fetcher: PieceFetcher | None = None
    listener: CommitListener | None = None
    resolvers: ResolverSource | None = None


NO_HOOKS = PageHooks()
