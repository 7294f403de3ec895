"""The document layer's part of a page's integrity check: reading its records.

This module owns :data:`DOCUMENT_CHECK`, the :class:`store.page.check.ContentCheck` that
finds the document records and index definitions among a tree's entries and tells
whether each decodes (``ledgerd.store`` sets it when it is imported). Walking trees,
reading pieces and reporting are :mod:`store.page.check`'s.
"""

from __future__ import annotations

from ledgerd.store.documents import doclayout
from ledgerd.store.documents.docmodel import id_text, ulid_text
from ledgerd.store.page.check import (
    DAMAGED_DOCUMENT,
    DAMAGED_INDEX_DEFINITION,
    UNSUPPORTED_LAYOUT,
    ContentRecord,
)
from ledgerd.store.pieces import digest as dg


class DocumentCheck:
    """The :class:`store.page.check.ContentCheck` of documents: a body or a kept
    conflict is a record, an index definition is one too; a body counts as a document
    (a kept conflict is no document)."""

    def record_of(self, key: bytes, value: bytes) -> ContentRecord | None:
        k = doclayout.parse_doc_key(key)
        kept = k is not None and k.conflict is not None and value != dg.TOMBSTONE
        if k is not None and (k.part == doclayout.BODY or kept):
            doc = (  # (a body key the key API wrote may hold any id)
                id_text(k.doc_id)
                if isinstance(k.doc_id, str) or len(k.doc_id) == doclayout.ULID_SIZE
                else f"id {k.doc_id.hex()} (not a ULID)"
            )
            where = f"document {doc} in {k.collection!r}"
            if k.conflict is not None:
                rev = ulid_text(k.conflict[: doclayout.ULID_SIZE])
                where = f"kept conflict {rev} of {where}"
            return ContentRecord(where, _is_body(key))
        if (x := doclayout.parse_index_key(key)) is not None and value != dg.TOMBSTONE:
            return ContentRecord(f"index {x[1]!r} on {x[0]!r}", False)
        return None

    def problem_of(self, key: bytes, data: bytes) -> tuple[str, str] | None:
        definition = doclayout.parse_doc_key(key) is None
        try:
            if definition:
                doclayout.decode_definition(data)
            else:
                doclayout.decode_record(data)
        except doclayout.FutureLayoutError as e:
            return UNSUPPORTED_LAYOUT, f"cannot be read by this ledgerd: {e}"
        except ValueError as e:
            return DAMAGED_INDEX_DEFINITION if definition else DAMAGED_DOCUMENT, f"is damaged: {e}"
        odd = None if definition else _odd_id(key)
        if odd is None:
            return None
        return DAMAGED_DOCUMENT, f"is damaged: its id is {odd} bytes, not 16"


def _is_body(key: bytes) -> bool:
    k = doclayout.parse_doc_key(key)
    return k is not None and k.part == doclayout.BODY


def _odd_id(key: bytes) -> int | None:
    """The length of a document key's id that is not a ULID's 16 bytes (the key API
    may write one: the documents API names its body damaged too); else None."""
    k = doclayout.parse_doc_key(key)
    if k is None or isinstance(k.doc_id, str) or len(k.doc_id) == doclayout.ULID_SIZE:
        return None
    return len(k.doc_id)


DOCUMENT_CHECK = DocumentCheck()
