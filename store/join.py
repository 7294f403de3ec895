"""Joining states: how a page takes in writes from elsewhere (and its own transactions).

This module owns the join of a page's tree with a *delta* (another state restricted to
some keys, whole documents on a document page: :func:`join_delta`) and with a whole
*state* (a checkpoint: :func:`join_state`), each with that state's context. Both return
the changes to apply to the local tree; they read trees and write nothing. The rule for
one key is :func:`store.dots.join_versions`; a document's keys are taken whole from one
revision (:func:`join_group`). Why this converges is in ``docs/convergence.md``.
"""

from __future__ import annotations

import asyncio
from collections.abc import Mapping, Sequence

from ledgerd.store import btree, doclayout, dots
from ledgerd.store.btree import EMPTY, Builder, NodeLoader, RawEntry, Version
from ledgerd.store.digest import TOMBSTONE

TURN_KEYS = 1024
"""Keys (or documents) a join handles between two turns it gives the event loop."""

Changes = list[tuple[bytes, RawEntry | None]]


async def is_document_page(nodes: NodeLoader, root: bytes, more: Sequence[RawEntry] = ()) -> bool:
    """Whether a join treats the page as a document page: the tree, or the entries
    coming in, hold the marker (the same answer on every device)."""
    if any(e[0] == doclayout.MARKER for e in more):
        return True
    return await btree.lookup(nodes, root, doclayout.MARKER) is not None


def _marker_rule(key: bytes, vs: list[Version]) -> list[Version]:
    """The document marker stays while any version of it is live: a page deleted on one
    device while another wrote documents in it (and so the marker again) stays a
    document page. Every other key keeps its versions as joined."""
    if key != doclayout.MARKER:
        return vs
    live = [v for v in vs if v[0] != TOMBSTONE]
    return live or vs


def _group_dot(group: Mapping[bytes, RawEntry]) -> bytes:
    """The dot of a document's version: its head's, else its newest entry's."""
    if not group:
        return b""
    head = group.get(doclayout.head_key_of_group(_group_of(next(iter(group)))))
    if head is not None:
        return head[3]
    return max(e[3] for e in group.values())


def _group_of(key: bytes) -> bytes:
    g = doclayout.group_of(key)
    assert g is not None
    return g


def join_group(
    local: Mapping[bytes, RawEntry],
    remote: Mapping[bytes, RawEntry],
    local_saw: dots.Seen,
    remote_saw: dots.Seen,
) -> Mapping[bytes, RawEntry]:
    """A document's entries after the join: the version a side holds goes when the other
    side has seen it without keeping it; of two concurrent versions, the one whose head
    ranks higher (:func:`store.doclayout.rank`: revision, then digest) is taken whole."""
    if not remote:
        return local
    ldot, rdot = _group_dot(local), _group_dot(remote)
    if ldot == rdot:
        return local
    keep_l = bool(local) and not remote_saw(ldot)
    keep_r = not local_saw(rdot)
    if keep_l == keep_r:  # concurrent (or, from a damaged peer, each superseding the other)
        if not local:
            return local
        group = _group_of(next(iter(local)))
        head = doclayout.head_key_of_group(group)
        lh, rh = local.get(head), remote.get(head)
        lrank = doclayout.rank(None if lh is None else btree.new_entry(lh))
        rrank = doclayout.rank(None if rh is None else btree.new_entry(rh))
        return remote if (rrank, rdot) > (lrank, ldot) else local
    return remote if keep_r else local


async def join_delta(
    nodes: NodeLoader,
    root: bytes,
    remote: Sequence[RawEntry],
    local_saw: dots.Seen,
    remote_saw: dots.Seen,
) -> Changes:
    """The changes that join ``remote`` (a state restricted to its keys, in key order;
    on a document page, whole documents) into the tree at ``root``. ``local_saw`` and
    ``remote_saw`` tell which writes each state has seen (:func:`store.dots.seen_by` of
    its context). A transaction commits through it too: its writes are a
    delta whose context is what it saw (its base's, and its own dot), so versions it
    had not seen stay beside its own as siblings."""
    doc_page = await is_document_page(nodes, root, remote)
    changes: Changes = []
    groups: dict[bytes, dict[bytes, RawEntry]] = {}
    for i, e in enumerate(remote):
        if i % TURN_KEYS == TURN_KEYS - 1:
            await asyncio.sleep(0)
        key = e[0]
        group = doclayout.group_of(key) if doc_page else None
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
            async for e in btree.iterate(nodes, root, group, doclayout.elements_end(group))
        }
        changes.extend(_group_changes(lgroup, join_group(lgroup, rgroup, local_saw, remote_saw)))
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
    changes: Changes = []
    groups: dict[bytes, None] = {}
    n = 0
    async for c in btree.diff(builder, root, remote_root):
        n += 1
        if n % TURN_KEYS == 0:
            await asyncio.sleep(0)
        group = doclayout.group_of(c.key) if doc_page else None
        if group is not None:
            groups[group] = None
            continue
        vs = dots.join_versions(dots.versions(c.old), dots.versions(c.new), local_saw, remote_saw)
        joined = dots.entry(c.key, _marker_rule(c.key, vs))
        if joined != (None if c.old is None else btree.raw(c.old)):
            changes.append((c.key, joined))
    for group in groups:
        end = doclayout.elements_end(group)
        lgroup = {e[0]: btree.raw(e) async for e in btree.iterate(builder, root, group, end)}
        rgroup = {e[0]: btree.raw(e) async for e in btree.iterate(builder, remote_root, group, end)}
        if not rgroup:  # the checkpoint lacks the document: kept unless it was seen
            if lgroup and remote_saw(_group_dot(lgroup)):
                changes.extend((k, None) for k in lgroup)
            continue
        changes.extend(_group_changes(lgroup, join_group(lgroup, rgroup, local_saw, remote_saw)))
    changes.sort(key=lambda c: c[0])
    return changes


async def state_tree(builder: Builder, entries: Sequence[RawEntry]) -> bytes:
    """The tree of a whole state given as its entries (a checkpoint's), in ``builder``."""
    return await builder.apply(EMPTY, [(e[0], btree.new_entry(e)) for e in entries])
