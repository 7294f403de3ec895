"""What a repository's pages reach out to: the collaborators given when it opens.

A page needs things it cannot do itself, and gets them through these small
protocols when :meth:`store.repo.repository.Repository.open` is called (the
repository hands each page its parts), rather than having them patched onto it
afterwards:

* a :class:`PieceFetcher`, which brings pieces this device does not store (LAZY
  values, in the daemon the sync engine fetching them from the bucket);
* a :class:`CommitListener`, told of every commit a page stores (sync uses it to
  know which pages have something to upload);
* a :class:`ResolverSource` (defined in :mod:`store.tree.merge`, where the page's
  conflicts find it), asked for the conflict resolver of a ledger when a merge under
  a non-automatic policy needs an answer;
* a :class:`PageRestorer`, which brings back a page this device evicted (its
  local storage deleted because everything in it was in the bucket), on its next use.

Each is optional; the embedded API uses none. This module owns the protocols
only; what implements them lives above ``store``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

from ledgerd.store.page.page import Page
from ledgerd.store.tree.commit import Commit
from ledgerd.store.tree.merge import ResolverSource

__all__ = [
    "NO_HOOKS",
    "CommitListener",
    "PageHooks",
    "PageRestorer",
    "PieceFetcher",
    "ResolverSource",
]


class PieceFetcher(Protocol):
    async def fetch_pieces(self, page: Page, digests: list[bytes]) -> dict[bytes, bytes]:
        """The contents of ``digests`` that can be had (unverified: the page checks them)."""
        ...


class CommitListener(Protocol):
    def page_committed(self, page: Page, commit: Commit) -> None:
        """``commit`` is stored in ``page`` (called on the event loop; must not block)."""
        ...


class PageRestorer(Protocol):
    async def restore_page(self, page: Page) -> bool:
        """Fill ``page`` (created empty, not yet handed to anyone) with the evicted
        page's latest state from the bucket (in the daemon: the sync engine, from the
        latest checkpoint). True once done; False if the bucket has nothing for it.
        Raise when it cannot be reached: the use then fails as ``unavailable``."""
        ...


@dataclass(frozen=True, slots=True)
class PageHooks:
    """The collaborators of every page of a repository (all optional)."""

    fetcher: PieceFetcher | None = None
    listener: CommitListener | None = None
    resolvers: ResolverSource | None = None
    restorer: PageRestorer | None = None


NO_HOOKS = PageHooks()
