"""A document's kept conflicts, as the document store reads and writes them.

This module owns reading a document's kept conflicts from a page's view (:func:`kept`,
highest ranked first) and what a write of the document does with them (:func:`carry`:
keep them, but those it resolves and those past the bound). How they are made (the join
keeps the revisions that lost) is :func:`store.documents.docjoin.join_group`; their keys are
:mod:`store.documents.doclayout`'s; the API that shows and resolves them is
:class:`store.documents.documents.DocumentStore`. Why, and the bound: ``docs/documents.md``.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from ledgerd.store.documents import doclayout
from ledgerd.store.documents.doclayout import DocId
from ledgerd.store.documents.docmodel import DocumentConflictError, id_text, parse_ulid, ulid_text
from ledgerd.store.page.transaction import Transaction
from ledgerd.store.page.view import View


@dataclass(frozen=True, slots=True)
class Kept:
    """A kept conflict: a losing revision ``rev``, its record's digest ``value``,
    ``order`` its rank as the join ranks revisions (revision, head, dot)."""

    rev: bytes
    order: tuple[bytes, bytes, bytes]
    key: bytes
    value: bytes


async def kept(view: View, collection: str, raw: DocId) -> list[Kept]:
    """The kept conflicts of document ``raw`` in ``view``, highest ranked first."""
    out = []
    async for e in view.iter_entries(prefix=doclayout.conflict_prefix(collection, raw)):
        k = doclayout.parse_doc_key(e.key)
        if k is None or k.conflict is None:
            continue
        rev = k.conflict[: doclayout.ULID_SIZE]
        order = (rev, doclayout.conflict_head(k.conflict), e.dot)
        out.append(Kept(rev, order, e.key, e.value))
    out.sort(key=_order, reverse=True)
    return out


def _order(k: Kept) -> tuple[bytes, bytes, bytes]:
    return k.order


async def carry(
    txn: Transaction,
    collection: str,
    raw: DocId,
    resolves: Sequence[str] = (),
    *,
    drop_all: bool = False,
) -> None:
    """Carry the document's kept conflicts into the revision ``txn`` writes, but those
    whose revisions ``resolves`` names (DocumentConflictError, before anything is
    written, if one is not kept), the lowest-ranked past
    :data:`~store.documents.doclayout.MAX_CONFLICTS`, and with ``drop_all`` (a purge) every one:
    each removed one gets a tombstone, so that the write removes it everywhere."""
    names = {parse_ulid(r, "revision") for r in resolves}
    found = await kept(txn, collection, raw)
    missing = names - {k.rev for k in found}
    if missing:
        raise DocumentConflictError(
            f"document {id_text(raw)} in {collection!r} keeps no conflict of revision "
            f"{', '.join(sorted(ulid_text(m) for m in missing))}"
        )
    rest = [k for k in found if not drop_all and k.rev not in names]
    gone = [k for k in found if drop_all or k.rev in names] + rest[doclayout.MAX_CONFLICTS :]
    for k in gone:
        await txn.delete(k.key)
