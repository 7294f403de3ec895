"""The document layer's join rule: how a document's keys join on a document page.

This module owns :func:`join_group` (a document's revisions join as an observed-remove
set; the winner's keys taken whole, the others kept as conflicts: ``docs/documents.md``)
and :data:`DOCUMENT_RULE`, the :class:`store.tree.join.GroupRule` through which
:mod:`store.tree.join` applies it (``ledgerd.store`` sets it when it is imported). The
join of deltas and states, and of every other key, is :mod:`store.tree.join`'s.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import NamedTuple

from ledgerd.store.documents import doclayout
from ledgerd.store.pieces.digest import TOMBSTONE
from ledgerd.store.tree import btree, dots
from ledgerd.store.tree.btree import RawEntry


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


class DocumentRule:
    """The :class:`store.tree.join.GroupRule` of documents: a document's keys (head,
    body, attachments, kept conflicts) are its group."""

    @property
    def marker(self) -> bytes:
        return doclayout.MARKER

    def owns(self, key: bytes) -> bool:
        return key == doclayout.MARKER or key.startswith((doclayout.DOCS, doclayout.INDEXES))

    def group_of(self, key: bytes) -> bytes | None:
        return doclayout.group_of(key)

    def group_end(self, group: bytes) -> bytes:
        return doclayout.elements_end(group)

    def join_group(
        self,
        local: Mapping[bytes, RawEntry],
        remote: Mapping[bytes, RawEntry],
        local_saw: dots.Seen,
        remote_saw: dots.Seen,
    ) -> Mapping[bytes, RawEntry]:
        return join_group(local, remote, local_saw, remote_saw)


DOCUMENT_RULE = DocumentRule()
