"""Joining states: how a page takes in writes from elsewhere (and its own transactions).

This module owns the join of a page's tree with a *delta* (another state restricted to
some keys, whole documents on a document page: :func:`join_delta`) and with a whole
*state* (a checkpoint: :func:`join_state`), each with that state's context. Both return
the changes to apply to the local tree; they read trees and write nothing. The rule for
one key is :func:`store.tree.dots.join_versions`; the keys of a group (a document's) join
by the :class:`GroupRule` of the layer that owns them, the document layer's
(:mod:`store.documents.docjoin`), which ``ledgerd.store`` sets when it is imported, so that
every device joins with it. Why this converges is in ``docs/convergence.md``.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Mapping, Sequence
from typing import Protocol, TypeVar

from ledgerd.store.pieces.digest import TOMBSTONE
from ledgerd.store.tree import btree, dots
from ledgerd.store.tree.btree import EMPTY, NodeLoader, RawEntry, Version
from ledgerd.store.tree.builder import Builder

TURN_KEYS = 1024
"""Keys (or documents) a join handles between two turns it gives the event loop."""

T = TypeVar("T")


async def in_turns(items: Sequence[T], size: int) -> AsyncIterator[Sequence[T]]:
    """``items`` in slices of ``size``, the event loop given a turn between two (a
    first sync or a big batch brings hundreds of thousands of entries)."""
    for start in range(0, len(items), size):
        if start:
            await asyncio.sleep(0)
        yield items[start : start + size]


Changes = list[tuple[bytes, RawEntry | None]]


class GroupRule(Protocol):
    """How a join treats the keys that belong together on a page that holds the marker
    (a document's keys: :class:`store.documents.docjoin.DocumentRule`)."""

    @property
    def marker(self) -> bytes:
        """The key whose presence makes a page one whose keys join by groups."""
        ...

    def owns(self, key: bytes) -> bool:
        """Whether ``key`` is one the rule's layer keeps (the marker among them): on such
        a page those merge whole and are never resolved by key."""
        ...

    def group_of(self, key: bytes) -> bytes | None:
        """The group (a key prefix) ``key`` joins with, or None: it joins alone."""
        ...

    def group_end(self, group: bytes) -> bytes:
        """The end (exclusive) of ``group``'s keys."""
        ...

    def join_group(
        self,
        local: Mapping[bytes, RawEntry],
        remote: Mapping[bytes, RawEntry],
        local_saw: dots.Seen,
        remote_saw: dots.Seen,
    ) -> Mapping[bytes, RawEntry]:
        """A group's entries after the join (``local`` itself when it does not change)."""
        ...


_rule: list[GroupRule] = []


def set_group_rule(rule: GroupRule) -> None:
    """Make ``rule`` the one a join uses for groups. ``ledgerd.store`` sets the document
    layer's when it is imported (before any module of it can run): a second, different
    rule is refused, since devices joining by different rules would not converge."""
    if _rule and _rule[0] is not rule:
        raise ValueError("the join's group rule is set already")
    _rule[:] = [rule]


def group_rule() -> GroupRule:
    """The rule set by :func:`set_group_rule`."""
    if not _rule:
        raise RuntimeError("no group rule: ledgerd.store sets it when it is imported")
    return _rule[0]


async def is_document_page(nodes: NodeLoader, root: bytes, more: Sequence[RawEntry] = ()) -> bool:
    """Whether a join treats the page as a document page: the tree, or the entries
    coming in, hold the marker (the same answer on every device)."""
    marker = group_rule().marker
    if any(e[0] == marker for e in more):
        return True
    return await btree.lookup(nodes, root, marker) is not None


def _marker_rule(key: bytes, vs: list[Version]) -> list[Version]:
    """The document marker stays while any version of it is live: a page deleted on one
    device while another wrote documents in it (and so the marker again) stays a
    document page. Every other key keeps its versions as joined."""
    if key != group_rule().marker:
        return vs
    live = [v for v in vs if v[0] != TOMBSTONE]
    return live or vs


async def join_delta(
    nodes: NodeLoader,
    root: bytes,
    remote: Sequence[RawEntry],
    local_saw: dots.Seen,
    remote_saw: dots.Seen,
) -> Changes:
    """The changes that join ``remote`` (a state restricted to its keys, in key order;
    on a document page, whole documents) into the tree at ``root``. ``local_saw`` and
    ``remote_saw`` tell which writes each state has seen (:func:`store.tree.dots.seen_by` of
    its context). A transaction commits through it too: its writes are a
    delta whose context is what it saw (its base's, and its own dot), so versions it
    had not seen stay beside its own as siblings."""
    doc_page = await is_document_page(nodes, root, remote)
    rule = group_rule()
    changes: Changes = []
    groups: dict[bytes, dict[bytes, RawEntry]] = {}
    for i, e in enumerate(remote):
        if i % TURN_KEYS == TURN_KEYS - 1:
            await asyncio.sleep(0)
        key = e[0]
        group = rule.group_of(key) if doc_page else None
        if group is not None:
            groups.setdefault(group, {})[key] = e
            continue
        local = await btree.lookup(nodes, root, key)
        vs = dots.join_versions(dots.versions(local), dots.versions(e), local_saw, remote_saw)
        joined = dots.entry(key, _marker_rule(key, vs))
        if joined != (None if local is None else btree.raw(local)):
            changes.append((key, joined))
    for i, (group, rgroup) in enumerate(groups.items()):
        if i % TURN_KEYS == TURN_KEYS - 1:
            await asyncio.sleep(0)
        lgroup = {
            e[0]: btree.raw(e)
            async for e in btree.iterate(nodes, root, group, rule.group_end(group))
        }
        merged = rule.join_group(lgroup, rgroup, local_saw, remote_saw)
        changes.extend(_group_changes(lgroup, merged))
    changes.sort(key=lambda c: c[0])
    return changes


def _group_changes(old: Mapping[bytes, RawEntry], new: Mapping[bytes, RawEntry]) -> Changes:
    if new is old:
        return []
    out: Changes = [(k, None) for k in old if k not in new]
    out.extend((k, e) for k, e in new.items() if old.get(k) != e)
    return out


async def join_state(
    builder: Builder,
    root: bytes,
    remote_root: bytes,
    local_saw: dots.Seen,
    remote_saw: dots.Seen,
) -> Changes:
    """The changes that join the whole state at ``remote_root`` (built in ``builder``:
    a checkpoint's entries) into the tree at ``root`` (``*_saw`` as for
    :func:`join_delta`). Only the keys where the trees differ are looked at (the diff skips equal
    subtrees), so a checkpoint of a state close to this one costs little."""
    doc_page = await is_document_page(builder, root) or await is_document_page(builder, remote_root)
    rule = group_rule()
    changes: Changes = []
    groups: dict[bytes, None] = {}
    n = 0
    async for c in btree.diff(builder, root, remote_root):
        n += 1
        if n % TURN_KEYS == 0:
            await asyncio.sleep(0)
        group = rule.group_of(c.key) if doc_page else None
        if group is not None:
            groups[group] = None
            continue
        vs = dots.join_versions(dots.versions(c.old), dots.versions(c.new), local_saw, remote_saw)
        joined = dots.entry(c.key, _marker_rule(c.key, vs))
        if joined != (None if c.old is None else btree.raw(c.old)):
            changes.append((c.key, joined))
    for group in groups:
        end = rule.group_end(group)
        lgroup = {e[0]: btree.raw(e) async for e in btree.iterate(builder, root, group, end)}
        rgroup = {e[0]: btree.raw(e) async for e in btree.iterate(builder, remote_root, group, end)}
        merged = rule.join_group(lgroup, rgroup, local_saw, remote_saw)
        changes.extend(_group_changes(lgroup, merged))
    changes.sort(key=lambda c: c[0])
    return changes


async def state_tree(builder: Builder, entries: Sequence[RawEntry]) -> bytes:
    """The tree of a whole state given as its entries (a checkpoint's), in ``builder``."""
    return await builder.apply(EMPTY, [(e[0], btree.new_entry(e)) for e in entries])
