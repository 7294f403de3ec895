"""Exceptions raised by the store layer.

Every error the store raises derives from :class:`StoreError`. A subclass's
docstring is its message when it is raised without arguments. Errors that may
go away on retry derive from :class:`TransientStoreError`; everything else is
permanent.
"""

from __future__ import annotations


class StoreError(Exception):
    """The store failed."""

    def __init__(self, message: str | None = None) -> None:
        super().__init__(message or (self.__doc__ or self.__class__.__name__).strip())


class TransientStoreError(StoreError):
    """A temporary failure; the same call may succeed later."""


class StorageFullError(StoreError):
    """The disk is full."""


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


class TransactionClosedError(StoreError):
    """The transaction was already committed or rolled back."""
