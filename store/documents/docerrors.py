"""The document layer's errors.

This module owns the exceptions the document layer raises, each with a stable
``code`` (the HTTP API's error code). What raises them is in the other modules of
:mod:`store.documents`; callers import them from :mod:`ledgerd.store`.
"""

from __future__ import annotations

from typing import ClassVar

from ledgerd.store.errors import CorruptObjectError, InvalidArgumentError, StoreError


class DocumentError(StoreError):
    """The document layer refused the request."""

    code: ClassVar[str] = "bad_request"


class InvalidDocumentError(DocumentError, InvalidArgumentError):
    """The document is not valid (not JSON, or it uses a reserved name)."""

    code = "invalid_document"


class DocumentTooLargeError(InvalidDocumentError):
    """The document is over the size limit."""

    code = "too_large"


class MalformedRecordError(CorruptObjectError):
    """A document's stored body is not a document record, or an index's stored
    definition not an index definition (the HTTP API's ``corrupt``): the page's keys
    can be written through the key API, and a peer's through sync."""


class UnsupportedLayoutError(DocumentError):
    """A document's stored record is of a layout this ledgerd does not know (a newer
    ledgerd wrote it, on another device): it can be neither read nor changed here,
    so that this device never overwrites or tombstones what it cannot read."""

    code = "unsupported_layout"


class InvalidIdError(DocumentError, InvalidArgumentError):
    """Not a ULID (26 characters of Crockford's base 32), or not a document id a
    client may choose (1-512 bytes of UTF-8, no NUL, no leading ``_``)."""

    code = "invalid_id"


class InvalidNameError(DocumentError, InvalidArgumentError):
    """Not a valid collection or index name."""

    code = "invalid_name"


class DocumentNotFoundError(DocumentError, KeyError):
    """No such document (or it is deleted)."""

    code = "document_not_found"

    def __str__(self) -> str:
        return str(self.args[0])


class AttachmentNotFoundError(DocumentNotFoundError):
    """The document has no such attachment."""

    code = "attachment_not_found"


class IndexNotFoundError(DocumentError, KeyError):
    """No such index on the collection."""

    code = "index_not_found"

    def __str__(self) -> str:
        return str(self.args[0])


class DocumentConflictError(DocumentError):
    """The document's current revision is not the one expected."""

    code = "conflict"


class RevisionInPastError(DocumentConflictError):
    """The revision supplied is not after the document's current one."""


class RevisionInFutureError(DocumentError, InvalidArgumentError):
    """The revision supplied is too far ahead of this device's clock."""

    code = "rev_in_future"
