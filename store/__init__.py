"""Local page storage: content-addressed objects in SQLite, and the embedded API.

``store`` has no network code and can be used on its own (embedded mode)::

    from ledgerd.store import Repository

    async with await Repository.open(path) as repo:
        page = await repo.ledger("notes").page("inbox")
        await page.put(b"k", b"v")
        async with page.transaction() as txn:
            await txn.put(b"a", b"1")
"""

from ledgerd.store.btree import Entry, Priority
from ledgerd.store.commit import Commit
from ledgerd.store.digest import Kind
from ledgerd.store.errors import (
    ClosedError,
    CommitNotFoundError,
    CorruptObjectError,
    InvalidArgumentError,
    KeyNotFoundError,
    KeyTooLargeError,
    NameTooLargeError,
    ObjectNotFoundError,
    RangeError,
    RepositoryLockedError,
    StoreError,
    TransactionClosedError,
    TransientStoreError,
)
from ledgerd.store.merge import Choice, Conflict, MergeRequest, Policy, Resolver
from ledgerd.store.objects import ObjectStore, ValueRef
from ledgerd.store.page import ChangedEntry, Notification, Page, Snapshot, Transaction, Watcher
from ledgerd.store.repository import Ledger, Repository
from ledgerd.store.view import KeyValue, RangeResult

__all__ = [
    "ChangedEntry",
    "Choice",
    "Conflict",
    "MergeRequest",
    "Policy",
    "Resolver",
    "ClosedError",
    "Commit",
    "CommitNotFoundError",
    "CorruptObjectError",
    "Entry",
    "InvalidArgumentError",
    "KeyNotFoundError",
    "KeyTooLargeError",
    "KeyValue",
    "Kind",
    "Ledger",
    "NameTooLargeError",
    "Notification",
    "ObjectNotFoundError",
    "ObjectStore",
    "Page",
    "Priority",
    "RangeError",
    "RangeResult",
    "Repository",
    "RepositoryLockedError",
    "Snapshot",
    "StoreError",
    "Transaction",
    "TransactionClosedError",
    "TransientStoreError",
    "ValueRef",
    "Watcher",
]
