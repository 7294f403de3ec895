"""Exceptions raised by the store layer.

Every error the store raises derives from :class:`StoreError`. A subclass's
docstring is its message when it is raised without arguments. Errors that may
go away on retry derive from :class:`TransientStoreError`; everything else is
permanent. SQLite's and the file system's errors are translated where the store
meets them (:func:`from_sqlite`, :func:`from_os`), by their codes, so callers
never see ``sqlite3`` or ``OSError`` from the store.
"""

from __future__ import annotations

import errno
import sqlite3


def named(data: bytes | str) -> str:
    """A ledger name, page id or key as a message shows it: its text when it is
    printable UTF-8 (and does not itself start ``hex:``), else ``hex:`` and its hex,
    as ``ledgerctl`` prints names (not Python's ``b'...'``)."""
    if isinstance(data, str):
        return data
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError:
        text = ""
    if text and text.isprintable() and not text.startswith("hex:"):
        return text
    return "hex:" + data.hex()


def counted(n: int, noun: str) -> str:
    """``n`` and ``noun``, plural unless ``n`` is 1: "1 page", "2 pages", "0 rounds"."""
    return f"{n} {noun}" if n == 1 else f"{n} {noun}s"


class StoreError(Exception):
    """The store failed."""

    def __init__(self, message: str | None = None) -> None:
        super().__init__(message or (self.__doc__ or self.__class__.__name__).strip())


class TransientStoreError(StoreError):
    """A temporary failure; the same call may succeed later."""


class InvalidArgumentError(StoreError, ValueError):
    """An argument is malformed or out of range."""


class KeyTooLargeError(InvalidArgumentError):
    """Key is longer than the 4 KiB limit."""


class NameTooLargeError(InvalidArgumentError):
    """Ledger name or page id is longer than the 128-byte limit."""


class InvalidDigestError(InvalidArgumentError):
    """Malformed object digest."""


class ObjectNotFoundError(StoreError, KeyError):
    """The object is not stored on this device."""

    def __str__(self) -> str:  # KeyError quotes its message; don't.
        return str(self.args[0])


class ObjectKeyMissingError(ObjectNotFoundError):
    """The object is in the cloud, sealed with an encryption key this device does not
    have. Nothing is damaged: it is fetched once the key file that has the key is
    copied here and ledgerd restarted (a fetcher raises it; the message names the key)."""


class CorruptObjectError(StoreError):
    """A stored object no longer matches its digest."""


class RangeError(InvalidArgumentError):
    """Requested byte range is outside the value."""


class ClosedError(StoreError):
    """The page or repository is closed."""


class KeyNotFoundError(StoreError, KeyError):
    """The key is not in the page."""

    def __str__(self) -> str:
        return str(self.args[0])


class CommitNotFoundError(StoreError, KeyError):
    """No such commit in this page."""

    def __str__(self) -> str:
        return str(self.args[0])


class AmbiguousCommitError(InvalidArgumentError):
    """A commit id prefix that more than one commit of the page starts with."""


class LedgerNotFoundError(StoreError, KeyError):
    """No such ledger on this device (or every page of it is deleted)."""

    def __str__(self) -> str:
        return str(self.args[0])


class PageNotFoundError(StoreError, KeyError):
    """No such page in the ledger on this device (or it is deleted)."""

    def __str__(self) -> str:
        return str(self.args[0])


class TransactionClosedError(StoreError):
    """The transaction was already committed or rolled back."""


class TooManyOpenPagesError(TransientStoreError):
    """Every open page is busy and no more may be opened; try again."""


class SchemaError(StoreError):
    """The database was written by a newer ledgerd."""


class StorageError(StoreError):
    """The page's files could not be read or written."""


class StorageFullError(StorageError):
    """The disk is full: free some space (the write was not stored)."""


class CorruptDatabaseError(StorageError):
    """A database file is damaged (SQLite reports it corrupt or not a database)."""


class BusyError(TransientStoreError, StorageError):
    """The database is locked by another process; try again."""


_FULL = {sqlite3.SQLITE_FULL}
_CORRUPT = {sqlite3.SQLITE_CORRUPT, sqlite3.SQLITE_NOTADB}
_BUSY = {sqlite3.SQLITE_BUSY, sqlite3.SQLITE_LOCKED}
_STORAGE = {
    sqlite3.SQLITE_IOERR,
    sqlite3.SQLITE_CANTOPEN,
    sqlite3.SQLITE_READONLY,
    sqlite3.SQLITE_PERM,
    sqlite3.SQLITE_PROTOCOL,
}


def from_sqlite(e: sqlite3.Error, where: object) -> StoreError | None:
    """The store's error for an SQLite error on ``where`` (a path), by its primary
    result code; None for errors that are bugs (SQL, constraints), left as they are."""
    code = getattr(e, "sqlite_errorcode", None)
    if code is None:
        return None
    primary = code & 0xFF
    if primary in _FULL:
        return StorageFullError(f"the disk is full: {where} could not be written ({e})")
    if primary in _CORRUPT:
        return CorruptDatabaseError(f"{where} is damaged: {e}")
    if primary in _BUSY:
        return BusyError(f"{where} is locked by another process: {e}")
    if primary in _STORAGE:
        return StorageError(f"{where}: {e}")
    return None


def from_os(e: OSError, where: object) -> StoreError:
    """The store's error for a file-system error on ``where``."""
    if e.errno in (errno.ENOSPC, errno.EDQUOT):
        return StorageFullError(f"the disk is full: {where} could not be written ({e.strerror})")
    return StorageError(f"{where}: {e.strerror or e}")


class RepositoryLockedError(StoreError):
    """The data directory is in use by another process (a running ledgerd?)."""


class HistoryPrunedError(StoreError):
    """The commit is older than the page's history retention: its contents are no
    longer kept on this device."""


class PageUnavailableError(TransientStoreError):
    """The page cannot be used right now: it was evicted from this device and cannot
    be brought back, or the connections a failed close of it left open are not closed."""


class NotEvictableError(StoreError):
    """The page cannot be evicted now (open and in use, or not fully synced)."""


class NotInConflictError(StoreError):
    """The key holds no conflict: its versions (if any) hold one value."""


class SiblingsChangedError(StoreError):
    """The key's siblings changed since they were listed (a write or a sync came):
    nothing was resolved; list the conflicts again."""


class AmbiguousTakeError(StoreError):
    """``theirs`` names more than one sibling: take ``ours`` or a value instead."""


class NotResolvableError(StoreError):
    """The page's conflicts are not resolved key by key (a document page: the higher
    ``_rev`` wins each document whole)."""
