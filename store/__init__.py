"""Local page storage: content-addressed objects in SQLite, and the embedded API.

``store`` has no network code and can be used on its own (embedded mode)::

    from ledgerd.store import Repository

    async with await Repository.open(path) as repo:
        page = await repo.ledger("notes").page("inbox")
        await page.put(b"k", b"v")
        async with page.transaction() as txn:
            await txn.put(b"a", b"1")

Structured keys: ``tuple`` (FoundationDB's tuple layer), :class:`Subspace`, and
versionstamped keys (:class:`Versionstamp`, ``Page.set_versionstamped_key``)::

    from ledgerd.store import Subspace, Versionstamp, tuple

    log = Subspace(("log",))
    key = await page.set_versionstamped_key(
        log.pack_with_versionstamp((Versionstamp.incomplete(),)), tuple.pack(("hello",))
    )

Documents after Yoda (:class:`DocumentStore`, one per page)::

    docs = await DocumentStore.open(page)
    doc = await docs.create("notes", {"title": "hello"})
    doc = await docs.replace("notes", doc.id, {"title": "hi"}, expected_rev=doc.rev)
"""

from ledgerd.store.documents import doccheck as _doccheck
from ledgerd.store.documents import docjoin as _docjoin
from ledgerd.store.documents.docbulk import BulkResult, BulkWrite
from ledgerd.store.documents.docchanges import Changes
from ledgerd.store.documents.doccore import Damaged, DocumentRange
from ledgerd.store.documents.docfind import FindResult, InvalidSelectorError
from ledgerd.store.documents.docindex import HeldBudget
from ledgerd.store.documents.docmodel import (
    LOCAL_LEDGER,
    Attachment,
    AttachmentNotFoundError,
    Document,
    DocumentConflictError,
    DocumentError,
    DocumentNotFoundError,
    DocumentTooLargeError,
    IndexInfo,
    IndexNotFoundError,
    InvalidDocumentError,
    InvalidIdError,
    InvalidNameError,
    RevisionInFutureError,
    RevisionInPastError,
    UnsupportedLayoutError,
)
from ledgerd.store.documents.documents import DocumentStore
from ledgerd.store.errors import (
    AmbiguousCommitError,
    AmbiguousTakeError,
    BusyError,
    ClosedError,
    CommitNotFoundError,
    CorruptDatabaseError,
    CorruptObjectError,
    HistoryPrunedError,
    InvalidArgumentError,
    KeyNotFoundError,
    KeyTooLargeError,
    LedgerNotFoundError,
    NameTooLargeError,
    NotEvictableError,
    NotInConflictError,
    NotResolvableError,
    ObjectKeyMissingError,
    ObjectNotFoundError,
    PageNotFoundError,
    PageUnavailableError,
    RangeError,
    RepositoryLockedError,
    SchemaError,
    SiblingsChangedError,
    StorageError,
    StorageFullError,
    StoreError,
    TooManyOpenPagesError,
    TransactionClosedError,
    TransientStoreError,
)
from ledgerd.store.keys import tuple
from ledgerd.store.keys.subspace import Subspace
from ledgerd.store.keys.tuple import SingleFloat, TupleError, Versionstamp
from ledgerd.store.page import check as _check
from ledgerd.store.page.conflicts import KeyConflict, Take, expect_of
from ledgerd.store.page.gc import HISTORY_RETENTION, GcResult
from ledgerd.store.page.hooks import (
    CommitListener,
    PageHooks,
    PageRestorer,
    PieceFetcher,
    ResolverSource,
)
from ledgerd.store.page.page import ChangedEntry, Notification, Page, Snapshot, Transaction, Watcher
from ledgerd.store.page.stamps import StampedKey, StampedValue, VersionstampError, stamp_time
from ledgerd.store.page.view import (
    KEY_LIMIT,
    KeyValue,
    RangeResult,
    View,
    check_key,
    collector_paused,
)
from ledgerd.store.pieces.digest import Kind
from ledgerd.store.pieces.objects import ObjectStore, ValueRef
from ledgerd.store.repo.repository import NAME_LIMIT, Ledger, Repository, decode_name, encode_name
from ledgerd.store.sqlite.threads import OFF_LOOP_BYTES, BlockingCalls, off_loop
from ledgerd.store.sqlite.threads import set_threads as set_sqlite_threads
from ledgerd.store.tree import join as _join
from ledgerd.store.tree.btree import Entry, Priority, RawEntry
from ledgerd.store.tree.commit import Commit
from ledgerd.store.tree.merge import Choice, Conflict, MergeRequest, NeedsResolver, Policy, Resolver

# The document layer's rules for the layers below it, set when the package is imported
# (before any of its modules can run), so that every join on every device, those sync
# runs through store.page.exchange among them, keeps documents whole.
_join.set_group_rule(_docjoin.DOCUMENT_RULE)
_check.set_content_check(_doccheck.DOCUMENT_CHECK)

__all__ = [
    "KEY_LIMIT",
    "NAME_LIMIT",
    "LOCAL_LEDGER",
    "Attachment",
    "BlockingCalls",
    "AttachmentNotFoundError",
    "BulkResult",
    "BulkWrite",
    "Changes",
    "Damaged",
    "FindResult",
    "InvalidSelectorError",
    "DocumentRange",
    "Document",
    "DocumentConflictError",
    "DocumentError",
    "DocumentNotFoundError",
    "DocumentStore",
    "HeldBudget",
    "DocumentTooLargeError",
    "IndexInfo",
    "IndexNotFoundError",
    "InvalidDocumentError",
    "InvalidIdError",
    "InvalidNameError",
    "RevisionInFutureError",
    "RevisionInPastError",
    "UnsupportedLayoutError",
    "BusyError",
    "CommitListener",
    "CorruptDatabaseError",
    "NeedsResolver",
    "PageHooks",
    "PieceFetcher",
    "ResolverSource",
    "SchemaError",
    "StorageError",
    "StorageFullError",
    "ChangedEntry",
    "Choice",
    "Conflict",
    "MergeRequest",
    "Policy",
    "Resolver",
    "ClosedError",
    "Commit",
    "AmbiguousCommitError",
    "CommitNotFoundError",
    "CorruptObjectError",
    "GcResult",
    "HISTORY_RETENTION",
    "HistoryPrunedError",
    "PageUnavailableError",
    "NotEvictableError",
    "NotInConflictError",
    "NotResolvableError",
    "AmbiguousTakeError",
    "SiblingsChangedError",
    "KeyConflict",
    "Take",
    "expect_of",
    "PageRestorer",
    "Entry",
    "RawEntry",
    "InvalidArgumentError",
    "KeyNotFoundError",
    "KeyTooLargeError",
    "KeyValue",
    "Kind",
    "Ledger",
    "LedgerNotFoundError",
    "NameTooLargeError",
    "Notification",
    "ObjectKeyMissingError",
    "ObjectNotFoundError",
    "ObjectStore",
    "Page",
    "PageNotFoundError",
    "Priority",
    "RangeError",
    "RangeResult",
    "Repository",
    "SingleFloat",
    "RepositoryLockedError",
    "Snapshot",
    "StampedKey",
    "StampedValue",
    "StoreError",
    "Subspace",
    "Transaction",
    "TransactionClosedError",
    "TransientStoreError",
    "TooManyOpenPagesError",
    "TupleError",
    "ValueRef",
    "Versionstamp",
    "VersionstampError",
    "View",
    "Watcher",
    "decode_name",
    "off_loop",
    "collector_paused",
    "OFF_LOOP_BYTES",
    "set_sqlite_threads",
    "check_key",
    "encode_name",
    "stamp_time",
    "tuple",
]
