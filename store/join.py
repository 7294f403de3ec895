"""Joining states: how a page takes in writes from elsewhere (and its own transactions).

This module owns the join of a page's tree with a *delta* (another state restricted to
some keys, whole documents on a document page: :func:`join_delta`) and with a whole
*state* (a checkpoint: :func:`join_state`), each with that state's context. Both return
the changes to apply to the local tree; they read trees and write nothing. The rule for
one key is :func:`store.tree.dots.join_versions`; a document's keys join as a set of revisions,
the winner's keys taken whole and the others kept as conflicts (:func:`join_group`). Why
this converges is in ``docs/convergence.md``.
"""

from __future__ import annotations

import asyncio
from collections.abc import Mapping, Sequence
from typing import NamedTuple

from ledgerd.store.documents import doclayout
from ledgerd.store.pieces.digest import TOMBSTONE
from ledgerd.store.tree import btree, dots
from ledgerd.store.tree.btree import EMPTY, Builder, NodeLoader, RawEntry, Version

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


def _group_of(key: bytes) -> bytes:
    g = doclayout.group_of(key)
    assert g is not None
    return g


class _Revision(NamedTuple):
    """One revision a document's group holds: its winner (the head, body and
    attachments) or a kept conflict. ``order`` ranks it (:func:`store.documents.doclayout.rank`,
    then its dot); ``kept`` is the entry that keeps it as a conflict (None: it cannot be
    kept, a winner without a readable head or body)."""

    order: tuple[bytes, bytes, bytes]
    dot: bytes
    kept: RawEntry | None


class _Split(NamedTuple):
    """A document's group taken apart: the winner's keys (kept conflicts' tombstones,
    written by the resolution that removed them, among them), the winner, and the kept
    conflicts by dot."""

    main: dict[bytes, RawEntry]
    winner: _Revision | None
    conflicts: dict[bytes, _Revision]


def _split(group_prefix: bytes, group: Mapping[bytes, RawEntry]) -> _Split:
    kept_prefix = doclayout.conflicts_of_group(group_prefix)
    main: dict[bytes, RawEntry] = {}
    conflicts: dict[bytes, _Revision] = {}
    for k, e in group.items():
        if k.startswith(kept_prefix) and e[1] != TOMBSTONE:
            parsed = doclayout.parse_doc_key(k)
            if parsed is not None and parsed.conflict is not None:
                cid = parsed.conflict
                order = (cid[: doclayout.ULID_SIZE], doclayout.conflict_head(cid), e[3])
                conflicts[e[3]] = _Revision(order, e[3], e)
                continue
        main[k] = e
    if not main:
        return _Split(main, None, conflicts)
    head = main.get(doclayout.head_key_of_group(group_prefix))
    dot = head[3] if head is not None else max(e[3] for e in main.values())
    head_entry = None if head is None else btree.new_entry(head)
    rev, value = doclayout.rank(head_entry)
    kept = None
    h = doclayout.head_of(head_entry)
    body = main.get(doclayout.body_key_of_group(group_prefix))
    if h is not None and body is not None and body[1] != TOMBSTONE:
        key = doclayout.conflict_key_in(group_prefix, doclayout.conflict_id(h[0], h[1], dot))
        kept = (key, body[1], int(body[2]), dot)
    return _Split(main, _Revision((rev, value, dot), dot, kept), conflicts)


def join_group(
    local: Mapping[bytes, RawEntry],
    remote: Mapping[bytes, RawEntry],
    local_saw: dots.Seen,
    remote_saw: dots.Seen,
) -> Mapping[bytes, RawEntry]:
    """A document's entries after the join. Each side holds a set of revisions (its
    winner and its kept conflicts); they join as an observed-remove set: a revision one
    side holds goes when the other side has seen it without keeping it. Of the
    revisions left, the one that ranks highest (:func:`store.documents.doclayout.rank`:
    revision, then digest, then dot) is the winner, its keys taken whole from the side
    that holds it; the others are kept conflicts (``docs/documents.md``)."""
    if not remote and not local:
        return local
    group = _group_of(next(iter(local or remote)))
    kept_prefix = doclayout.conflicts_of_group(group)
    if not _holds_kept(local, kept_prefix) and not _holds_kept(remote, kept_prefix):
        one = _one_side(group, local, remote, local_saw, remote_saw)
        if one is not None:
            return one
    ls, rs = _split(group, local), _split(group, remote)
    if (
        ls.winner is not None
        and rs.winner is not None
        and ls.winner.dot == rs.winner.dot
        and ls.conflicts.keys() == rs.conflicts.keys()
    ):
        return local  # the same revisions (the same write of each)
    lrevs = dict(ls.conflicts)
    if ls.winner is not None:
        lrevs[ls.winner.dot] = ls.winner
    rrevs = dict(rs.conflicts)
    if rs.winner is not None:
        rrevs[rs.winner.dot] = rs.winner
    joined = {d: r for d, r in lrevs.items() if d in rrevs or not remote_saw(d)}
    joined.update((d, r) for d, r in rrevs.items() if d not in lrevs and not local_saw(d))
    if not joined:
        if ls.winner is None or rs.winner is None:
            return {}
        # (from a damaged peer: each side has seen the other's winner without keeping
        # it; the higher-ranked one stays, as before revisions were kept)
        return ls.main if ls.winner.order > rs.winner.order else rs.main
    winner = max(joined.values(), key=_order)
    if ls.winner is not None and winner.dot == ls.winner.dot:
        out = dict(ls.main)
    elif rs.winner is not None and winner.dot == rs.winner.dot:
        out = dict(rs.main)
    else:  # only ever a kept conflict (a damaged peer's): its head and body
        out = _promoted(group, winner)
    for r in joined.values():
        if r is not winner and r.kept is not None and r.dot != winner.dot:
            out[r.kept[0]] = r.kept
    return local if out == local else out


def _holds_kept(group: Mapping[bytes, RawEntry], kept_prefix: bytes) -> bool:
    return any(k.startswith(kept_prefix) and e[1] != TOMBSTONE for k, e in group.items())


def _one_side(
    group: bytes,
    local: Mapping[bytes, RawEntry],
    remote: Mapping[bytes, RawEntry],
    local_saw: dots.Seen,
    remote_saw: dots.Seen,
) -> Mapping[bytes, RawEntry] | None:
    """:func:`join_group` of two groups without kept conflicts when one side's winner is
    the result (the same write on both sides, or one that has seen the other's): that
    side, without taking them apart. None when both revisions stay (or neither)."""
    ldot, rdot = _winner_dot(group, local), _winner_dot(group, remote)
    if remote and ldot == rdot:
        return local
    keep_l = bool(local) and not remote_saw(ldot)
    keep_r = bool(remote) and not local_saw(rdot)
    if keep_l == keep_r:
        return None
    return local if keep_l else remote


def _winner_dot(group: bytes, entries: Mapping[bytes, RawEntry]) -> bytes:
    """The dot of a group's winner when it keeps no conflicts: its head's, else its
    newest entry's (as :func:`_split` finds it)."""
    head = entries.get(doclayout.head_key_of_group(group))
    if head is not None:
        return head[3]
    return max((e[3] for e in entries.values()), default=b"")


def _order(r: _Revision) -> tuple[bytes, bytes, bytes]:
    return r.order


def _promoted(group: bytes, r: _Revision) -> dict[bytes, RawEntry]:
    """The head and body of a kept conflict that wins (its attachments' contents are
    not kept)."""
    if r.kept is None:
        return {}
    cid = doclayout.parse_doc_key(r.kept[0])
    assert cid is not None and cid.conflict is not None
    head = doclayout.head_key_of_group(group)
    body = doclayout.body_key_of_group(group)
    value = doclayout.conflict_head(cid.conflict)
    return {head: (head, value, 0, r.dot), body: (body, r.kept[1], r.kept[2], r.dot)}


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
        changes.extend(_group_changes(lgroup, join_group(lgroup, rgroup, local_saw, remote_saw)))
    changes.sort(key=lambda c: c[0])
    return changes


async def state_tree(builder: Builder, entries: Sequence[RawEntry]) -> bytes:
    """The tree of a whole state given as its entries (a checkpoint's), in ``builder``."""
    return await builder.apply(EMPTY, [(e[0], btree.new_entry(e)) for e in entries])
