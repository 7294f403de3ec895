"""API errors: a stable code, an HTTP status and a message, for every failure a client sees.

This module owns the mapping from store errors to API errors. Every error
response body is ``{"error": {"code": CODE, "message": TEXT}}``.
"""

from __future__ import annotations

import errno
import sqlite3

from ledgerd.store import DocumentError
from ledgerd.store import errors as se

MAX_MESSAGE = 1000
"""The most characters of an error message. Messages quote what the client sent
(names, keys, ops, paths, JSON, header values), which may be megabytes: past this, the
message keeps its start and its end (where it says what is wrong) and says how much
was cut (:func:`bounded`)."""
_HEAD, _TAIL = 700, 200


def bounded(message: str) -> str:
    """``message`` itself, or when over :data:`MAX_MESSAGE` characters its first and
    last characters around an ellipsis that tells how many were cut of how many."""
    if len(message) <= MAX_MESSAGE:
        return message
    cut = len(message) - _HEAD - _TAIL
    return f"{message[:_HEAD]}… [{cut} of {len(message)} characters cut] …{message[-_TAIL:]}"


class ApiError(Exception):
    """The request failed.

    Its message is :func:`bounded`: every error a client sees, over HTTP or in a
    session, and every log line that quotes one, is at most about
    :data:`MAX_MESSAGE` characters, whatever the request quoted in it."""

    status = 500
    code = "internal"

    def __init__(self, message: str | None = None, headers: dict[str, str] | None = None) -> None:
        super().__init__(bounded(message or (self.__doc__ or self.code).strip()))
        self.headers = headers or {}

    def body(self) -> dict[str, dict[str, str]]:
        return {"error": {"code": self.code, "message": str(self)}}


class BadRequest(ApiError):
    """The request is malformed."""

    status, code = 400, "bad_request"


class InvalidTimeout(BadRequest):
    """A timeout that is not a finite number of seconds, or below the minimum."""

    code = "invalid_timeout"


class AmbiguousCommit(BadRequest):
    """The commit id prefix names more than one commit of the page."""

    code = "ambiguous_commit"


class KeyTooLarge(BadRequest):
    """The key is over the 4 KiB limit."""

    code = "key_too_large"


class UriTooLong(KeyTooLarge):
    """The key in the path (or the request line) is over the 4 KiB key limit."""

    status = 414


class NotFound(ApiError):
    """Not found."""

    status, code = 404, "not_found"


class MethodNotAllowed(ApiError):
    """The endpoint exists, but not with this method (its ``Allow`` header lists those
    it has)."""

    status, code = 405, "method_not_allowed"


class KeyNotFound(NotFound):
    """The key is not in the page."""

    code = "key_not_found"


class PageNotFound(NotFound):
    """No such page."""

    code = "page_not_found"


class LedgerNotFound(NotFound):
    """No such ledger."""

    code = "ledger_not_found"


class CommitNotFound(NotFound):
    """No such commit in this page."""

    code = "commit_not_found"


class HistoryPruned(ApiError):
    """The commit is older than the page's history retention: its contents are no
    longer kept on this device."""

    status, code = 410, "history_pruned"


class RequestTimeout(ApiError):
    """The client stopped sending its request."""

    status, code = 408, "request_timeout"


class Conflict(ApiError):
    """The request conflicts with the current state."""

    status, code = 409, "conflict"


class NotEvictable(Conflict):
    """The page cannot be evicted now (in use, or not fully synced)."""

    code = "not_evictable"


class NoConflict(Conflict):
    """The key (or page) holds no conflict to resolve."""

    code = "no_conflict"


class SiblingsChanged(Conflict):
    """The conflict's siblings changed since they were listed: nothing was resolved."""

    code = "siblings_changed"


class AmbiguousTheirs(Conflict):
    """``theirs`` names more than one sibling: take ``ours`` or give a value."""

    code = "ambiguous_theirs"


class NotResolvable(Conflict):
    """The page's conflicts are not resolved key by key (a document page)."""

    code = "not_resolvable"


class TooLarge(ApiError):
    """The request is too large."""

    status, code = 413, "too_large"


class Busy(ApiError):
    """Too many requests are waiting."""

    status, code = 429, "too_many_requests"


class WatcherBehind(ApiError):
    """The watcher fell too far behind (max_watch_queue) and was ended."""

    status, code = 409, "watcher_behind"


class UnsupportedEncoding(ApiError):
    """Request bodies are taken as sent: a Content-Encoding (gzip, deflate, ...) is not
    supported."""

    status, code = 415, "unsupported_encoding"


class ExpectationFailed(ApiError):
    """The request's Expect header asks for something other than 100-continue."""

    status, code = 417, "expectation_failed"


class RangeNotSatisfiable(ApiError):
    """The requested byte range is outside the value."""

    status, code = 416, "range_not_satisfiable"


class PeerRefused(ApiError):
    """This user may not use the daemon."""

    status, code = 403, "peer_refused"


class ShuttingDown(ApiError):
    """The daemon is shutting down."""

    status, code = 503, "shutting_down"


class Overloaded(ApiError):
    """The daemon is serving as many connections, requests or followed changes feeds
    as it is configured to (max_connections, max_concurrent_requests, max_followers):
    try again shortly."""

    status, code = 503, "overloaded"
    retry_after = 1
    """Seconds a client is told to wait (``Retry-After``) before it tries again."""

    def __init__(self, message: str | None = None) -> None:
        super().__init__(message, {"Retry-After": str(self.retry_after)})


class Unavailable(ApiError):
    """The data is not available on this device right now."""

    status, code = 503, "unavailable"


class EncryptionKeyMismatch(Unavailable):
    """None of this device's encryption keys opens the bucket."""

    code = "encryption_key_mismatch"


class EncryptionKeyMissing(Unavailable):
    """The bucket is encrypted and this device has no key; or (a read) the value is in
    the bucket sealed with a key this device's key file does not have."""

    code = "encryption_key_missing"


class BucketNotEncrypted(Unavailable):
    """The bucket is not encrypted and this device has a key."""

    code = "bucket_not_encrypted"


class BucketNotFound(Unavailable):
    """The bucket is not there (a folder moved away or unmounted, a bucket deleted)."""

    code = "bucket_not_found"


class BucketMarkerMissing(Unavailable):
    """A bucket this device synced with has lost its ledgerd marker (moved, emptied)."""

    code = "bucket_marker_missing"


class BucketIdentityMissing(Unavailable):
    """The bucket's marker or encryption descriptor is missing while it holds data (or
    this device synced with it): restore the object, or use a new cloud URL."""

    code = "bucket_identity_missing"


class BucketIdentityChanged(Unavailable):
    """The bucket's encryption descriptor (or whether it is encrypted) is not what this
    device synced with: the bucket was replaced or tampered with."""

    code = "bucket_identity_changed"


class BucketLayoutUnsupported(Unavailable):
    """The bucket's layout is a newer ledgerd's."""

    code = "bucket_layout_unsupported"


class BucketUnusable(Unavailable):
    """The bucket's ledgerd objects cannot be used (an unreadable descriptor)."""

    code = "bucket_unusable"


BUCKET_ERRORS: dict[str, type[Unavailable]] = {
    c.code: c
    for c in (
        EncryptionKeyMismatch,
        EncryptionKeyMissing,
        BucketNotEncrypted,
        BucketNotFound,
        BucketMarkerMissing,
        BucketIdentityMissing,
        BucketIdentityChanged,
        BucketLayoutUnsupported,
        BucketUnusable,
    )
}
"""Sync's bucket errors that have a code of their own (:mod:`ledgerd.sync.errors`,
:mod:`ledgerd.sync.crypto`)."""


class InsufficientStorage(ApiError):
    """The disk is full: nothing was written. Free some space and try again."""

    status, code = 507, "insufficient_storage"


class NotDocuments(Conflict):
    """The page holds no documents (write one to make it a document page)."""

    code = "not_a_document_page"


class InvalidDocument(BadRequest):
    """The document is not valid JSON, or uses a reserved name."""

    code = "invalid_document"


class DocumentNotFound(NotFound):
    """No such document (or it is deleted)."""

    code = "document_not_found"


DOCUMENT_STATUS = {
    "invalid_document": 400,
    "invalid_id": 400,
    "invalid_name": 400,
    "rev_in_future": 400,
    "bad_request": 400,
    "document_not_found": 404,
    "attachment_not_found": 404,
    "index_not_found": 404,
    "conflict": 409,
    "unsupported_layout": 409,
    "too_large": 413,
}
"""The HTTP status of each code of the document layer's errors (``store.DocumentError``)."""


def from_document(e: se.StoreError, code: str) -> ApiError:
    """The API error for a document error: its own stable code, and its status."""
    err = ApiError(str(e))
    err.code = code
    err.status = DOCUMENT_STATUS.get(code, 400)
    return err


class Corrupt(ApiError):
    """Stored data is damaged; the daemon refused to return it."""

    status, code = 500, "corrupt"


class SchemaTooNew(ApiError):
    """A page file was written by a newer ledgerd: its schema is not one this one reads
    (the file is left as it is)."""

    status, code = 500, "schema_too_new"


def disk_full(e: BaseException) -> bool:
    """Whether ``e`` (or an exception it came from) says the disk is full: the store's
    StorageFullError, SQLite's SQLITE_FULL, or ENOSPC from the OS."""
    seen: set[int] = set()
    cur: BaseException | None = e
    while cur is not None and id(cur) not in seen:
        seen.add(id(cur))
        if isinstance(cur, se.StorageFullError):
            return True
        if isinstance(cur, sqlite3.Error) and cur.sqlite_errorcode & 0xFF == sqlite3.SQLITE_FULL:
            return True
        if isinstance(cur, OSError) and cur.errno == errno.ENOSPC:
            return True
        cur = cur.__cause__ or cur.__context__
    return False


def from_exception(e: Exception) -> ApiError | None:
    """The API error for an exception that is not an ApiError or a StoreError, if it
    has one (a full disk); None for a bug."""
    if disk_full(e):
        return InsufficientStorage()
    return None


_STORE_ERRORS: tuple[
    tuple[type[se.StoreError] | tuple[type[se.StoreError], ...], type[ApiError]], ...
] = (
    (se.KeyTooLargeError, KeyTooLarge),
    (se.NameTooLargeError, TooLarge),
    (se.RangeError, RangeNotSatisfiable),
    (se.AmbiguousCommitError, AmbiguousCommit),  # before InvalidArgumentError, its base
    (se.InvalidArgumentError, BadRequest),
    (se.KeyNotFoundError, KeyNotFound),
    (se.CommitNotFoundError, CommitNotFound),
    (se.PageNotFoundError, PageNotFound),
    (se.LedgerNotFoundError, LedgerNotFound),
    (se.HistoryPrunedError, HistoryPruned),
    (se.NotEvictableError, NotEvictable),
    (se.NotInConflictError, NoConflict),
    (se.SiblingsChangedError, SiblingsChanged),
    (se.AmbiguousTakeError, AmbiguousTheirs),
    (se.NotResolvableError, NotResolvable),
    (se.TransactionClosedError, Conflict),
    (se.ObjectKeyMissingError, EncryptionKeyMissing),  # before ObjectNotFoundError, its base
    (se.ObjectNotFoundError, Unavailable),
    ((se.CorruptObjectError, se.CorruptDatabaseError), Corrupt),
    (se.SchemaError, SchemaTooNew),
    (se.TransientStoreError, Unavailable),  # every open page busy; a locked database
    (se.ClosedError, ShuttingDown),
)
"""Store errors and the API errors they are, the first that matches winning."""


def from_store(e: se.StoreError) -> ApiError:
    """The API error for a store error (its message is kept)."""
    if disk_full(e):
        return InsufficientStorage()
    if isinstance(e, DocumentError):  # before InvalidArgumentError, which some subclass
        return from_document(e, e.code)
    for kind, error in _STORE_ERRORS:
        if isinstance(e, kind):
            return error(str(e))
    return ApiError(str(e))
