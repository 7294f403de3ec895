"""The changes feed: the documents changed between two commits of a page, in
batches that resume from a commit (or a token, for one batch at a time), followed
live as the head moves. The cost follows the change (a tree diff). Reading one
document is :mod:`store.documents.docreads`'s.
"""

from __future__ import annotations

from collections.abc import AsyncGenerator
from dataclasses import dataclass, field

from ledgerd.store.documents import docconflicts, doclayout, doctoken
from ledgerd.store.documents.doccore import Damaged, DocCore, check_limit, odd_id
from ledgerd.store.documents.doclayout import DocId, Record, State
from ledgerd.store.documents.docmodel import (
    Document,
    MalformedRecordError,
    UnsupportedLayoutError,
    check_collection,
)
from ledgerd.store.errors import InvalidArgumentError
from ledgerd.store.page.view import View
from ledgerd.store.tree import btree, commit
from ledgerd.store.tree.commit import Commit


@dataclass(frozen=True, slots=True)
class Changes:
    """Documents changed between two commits: resume the feed from ``commit``.

    ``token`` is set on a batch cut from a longer change: ``commit`` is then where
    that change started (see :meth:`DocumentStore.changes`). ``damaged``: changed
    documents whose bodies cannot be read (:class:`Damaged`)."""

    commit: bytes
    documents: list[Document]
    token: bytes | None = None
    damaged: list[Damaged] = field(default_factory=list)


async def changes(
    core: DocCore,
    since: bytes | None,
    collection: str | None,
    follow: bool,
    batch: int,
    conflicts: bool,
) -> AsyncGenerator[Changes, None]:
    """:meth:`DocumentStore.changes <store.documents.documents.DocumentStore.changes>`."""
    check_limit(batch)
    page = core.page
    prefix = _prefix(collection)
    watcher = page.watch(prefix) if follow else None
    try:
        resume = commit.FIRST.id if since is None else since
        root = (await page.load_commit(resume)).root
        while True:
            head = page.head
            start: bytes | None = prefix
            while head.root != root and start is not None:
                got, start = await changed(
                    core, resume, root, head, prefix, start, batch, conflicts
                )
                if got.documents or got.damaged:
                    yield got
            if head.root != root:
                resume, root = head.id, head.root
            if watcher is None:
                return
            if watcher.closed and watcher.queue.empty():
                if page.closed:
                    return
                watcher = page.watch(prefix)  # it fell behind: the diff catches up
                continue
            await watcher.wake()
    finally:
        if watcher is not None:
            watcher.close()


async def changes_page(
    core: DocCore,
    since: bytes | None,
    collection: str | None,
    limit: int,
    token: bytes | None,
    conflicts: bool,
) -> Changes:
    """:meth:`DocumentStore.changes_page
    <store.documents.documents.DocumentStore.changes_page>`."""
    check_limit(limit)
    prefix = _prefix(collection)
    resume = commit.FIRST.id if since is None else since
    root = (await core.page.load_commit(resume)).root
    if token is None:
        head, start = core.page.head, prefix
    else:
        bound = core.binding("changes", resume, prefix)
        head_id, start = doctoken.decode(token, doctoken.CHANGES, bound, 2)
        if not isinstance(head_id, bytes) or not isinstance(start, bytes):
            raise doctoken.TokenError("malformed continuation token")  # made up
        if not start.startswith(prefix):
            raise InvalidArgumentError("the continuation token is for another collection")
        head = await core.page.load_commit(head_id)
    got, _ = await changed(core, resume, root, head, prefix, start, limit, conflicts)
    return got


def _prefix(collection: str | None) -> bytes:
    """The keys the feed covers: one collection's, or every one's."""
    if collection is None:
        return doclayout.DOCS
    check_collection(collection)
    return doclayout.collection_prefix(collection)


async def changed(
    core: DocCore,
    resume: bytes,
    old_root: bytes,
    head: Commit,
    prefix: bytes,
    start: bytes,
    limit: int,
    conflicts: bool = False,
) -> tuple[Changes, bytes | None]:
    """The documents changed from ``old_root`` to ``head`` from key ``start`` on, at
    most ``limit``, and where the next batch starts (None: this one ends the change)."""
    found, nxt = await _changed_ids(core, old_root, head, prefix, start, limit)
    out: list[Document] = []
    damaged: list[Damaged] = []
    states = _States(core, await core.page.snapshot(head.id), resume, head)
    for coll, doc_id in found:
        if isinstance(doc_id, bytes) and len(doc_id) != doclayout.ULID_SIZE:  # key API's
            err = await states.odd(coll, doc_id)
            if err is not None:
                damaged.append(core.damaged(coll, doc_id, err))
            continue
        try:
            doc = await states.document(coll, doc_id, conflicts)
        except (MalformedRecordError, UnsupportedLayoutError) as e:
            damaged.append(core.damaged(coll, doc_id, e))
            continue
        if doc is not None:
            out.append(doc)
    if nxt is None:
        return Changes(head.id, out, None, damaged), None
    bound = core.binding("changes", resume, prefix)
    token = doctoken.encode(doctoken.CHANGES, bound, [head.id, nxt])
    return Changes(resume, out, token, damaged), nxt


async def _changed_ids(
    core: DocCore, old_root: bytes, head: Commit, prefix: bytes, start: bytes, limit: int
) -> tuple[dict[tuple[str, DocId], None], bytes | None]:
    """The (collection, id) of at most ``limit`` documents whose keys changed from
    ``old_root`` to ``head``, from key ``start`` on, in key order; and the key the next
    batch starts from (None: none left)."""
    found: dict[tuple[str, DocId], None] = {}
    end = doclayout.elements_end(prefix)
    async for c in btree.diff(core.page.nodes, old_root, head.root, start):
        if c.key >= end:
            break
        k = doclayout.parse_doc_key(c.key)
        if k is None or (k.collection, k.doc_id) in found:
            continue
        if len(found) == limit:
            return found, doclayout.doc_prefix(k.collection, k.doc_id)
        found[(k.collection, k.doc_id)] = None
    return found, None


class _States:
    """A changed document as the feed reports it: as it is at ``head``, or as it
    was at the feed's start (``resume``, read once and only when needed)."""

    def __init__(self, core: DocCore, snap: View, resume: bytes, head: Commit) -> None:
        self.core = core
        self.snap = snap
        self.resume = resume
        self.head = head
        self._old: View | None = None

    async def old(self) -> View:
        if self._old is None:
            self._old = await self.core.page.snapshot(self.resume)
        return self._old

    async def document(self, coll: str, doc_id: DocId, conflicts: bool) -> Document | None:
        """The document of a ULID's id to report (None: nothing to report);
        MalformedRecordError or UnsupportedLayoutError for one to report as damaged."""
        r = await self.core.record(self.snap, coll, doc_id)
        if r is None:  # its keys left without a revision: reported once as purged
            r = _gone(await self.core.record(await self.old(), coll, doc_id), self.head)
        if r is None:
            return None
        doc = Document.of(coll, doc_id, r)
        if conflicts:
            kept = await docconflicts.kept(self.snap, coll, doc_id)
            doc = doc.with_conflicts(k.rev for k in kept)
        return doc

    async def odd(self, coll: str, doc_id: bytes) -> MalformedRecordError | None:
        """The error to report for a body key whose id is not a ULID's (None: none)."""
        body = doclayout.body_key(coll, doc_id)
        if await self.snap.get_entry(body) is not None:
            return odd_id(coll, doc_id)
        # Its body deleted since the feed's start (through the key API): named
        # once more, as a ULID's document is reported purged, so that a follower
        # that was told of it learns it is gone.
        if await (await self.old()).get_entry(body) is not None:
            return odd_id(coll, doc_id, deleted=True)
        return None


def _gone(last: Record | None, head: Commit) -> Record | None:
    """What the changes feed reports for a document whose keys are no longer in the
    page at ``head`` though no revision removed them (the page was deleted or
    cleared, or its keys deleted through the key API): its ``last`` record, purged at
    the head's time; None if it had none at the feed's start either."""
    if last is None or last.state is State.PURGED:
        return last
    at = head.timestamp // 1000
    deleted = last.deleted if last.deleted is not None else at
    return last._replace(state=State.PURGED, deleted=deleted, purged=at, data=None, attachments=())
