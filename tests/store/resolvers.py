"""A resolver source for tests: one resolver (or none) for every ledger."""

from __future__ import annotations

from typing import cast

from ledgerd.store import Repository
from ledgerd.store.page.hooks import PageHooks
from ledgerd.store.tree.merge import Resolver


class OneResolver:
    def __init__(self) -> None:
        self.resolver: Resolver | None = None

    def resolver_for(self, ledger: bytes) -> Resolver | None:
        return self.resolver


def hooks() -> PageHooks:
    return PageHooks(resolvers=OneResolver())


def set_resolver(repo: Repository, resolver: Resolver | None) -> None:
    """Connect ``resolver`` for every ledger of ``repo`` (opened with :func:`hooks`)."""
    cast(OneResolver, repo.hooks.resolvers).resolver = resolver
