"""Merge policies and the conflict resolver's interface.

This module owns the names a page's policy and a conflict resolver use: the policies,
what a resolver is asked (:class:`MergeRequest`, one :class:`Conflict` per key) and
what it answers (:data:`Choice`). How states join is :mod:`store.tree.join`'s (the same on
every device, whatever its policy); asking resolvers and storing their answers is
:mod:`store.page.conflicts`'.
"""

from __future__ import annotations

import enum
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Literal, Protocol

from ledgerd.store.errors import StoreError
from ledgerd.store.tree.btree import Entry
from ledgerd.store.tree.commit import Commit


class Policy(enum.Enum):
    """What a page does with concurrent writes of one key (remembered per page).

    Every device keeps the same state whatever its policy (``docs/convergence.md``):
    the policy decides what reads show and whether a resolver is asked."""

    LAST_ONE_WINS = "last_one_wins"
    """Reads show the later write (the larger dot); nobody is asked."""
    AUTOMATIC_WITH_FALLBACK = "automatic_with_fallback"
    """Concurrent writes of different values go to the ledger's resolver."""
    CUSTOM = "custom"
    """As AUTOMATIC_WITH_FALLBACK (kept for compatibility: a resolver sees every key
    written concurrently with different values)."""
    DOCUMENTS = "documents"
    """Per document, the revision with the higher ``_rev`` wins, whole. A page whose
    tree holds :data:`store.documents.doclayout.MARKER` merges so whatever its remembered
    policy."""


@dataclass(frozen=True, slots=True)
class Conflict:
    """One key for a resolver: two of its concurrent versions. ``left`` is the one
    reads show now (the larger dot), ``right`` the other; None is a delete. ``base``,
    the version both replaced, is not known (None)."""

    key: bytes
    base: Entry | None
    left: Entry | None
    right: Entry | None


@dataclass
class MergeRequest:
    """What a resolver decides: conflicts of a page at its current commit ``head``."""

    ledger: bytes
    page: bytes
    head: Commit
    policy: Policy
    conflicts: list[Conflict]

    @property
    def left(self) -> Commit:
        """The commit the conflicts were read at (``head``; one side's name kept from
        the interface where two heads were merged)."""
        return self.head

    @property
    def right(self) -> Commit:
        return self.head


Choice = Literal["left", "right"] | bytes | None
"""A resolver's answer for a key: take a side, a new value (bytes), or delete (None)."""

Resolver = Callable[[MergeRequest], Awaitable[dict[bytes, Choice]]]


class NeedsResolver(StoreError):
    """The page's policy needs a resolver and none gave an answer; nothing changed."""


def needs_resolver(policy: Policy) -> bool:
    return policy in (Policy.AUTOMATIC_WITH_FALLBACK, Policy.CUSTOM)


class ResolverSource(Protocol):
    """Where a page finds the resolver of its ledger (given by the repository's
    :class:`store.page.hooks.PageHooks`)."""

    def resolver_for(self, ledger: bytes) -> Resolver | None:
        """The conflict resolver connected for ``ledger``, or None."""
        ...
