"""The blocking client: :class:`Client` and its sessions, watches and transactions.

This module owns the blocking classes, each its async counterpart through
:mod:`ledgerd.daemon.client_bridge` (:class:`Client` is
:class:`~ledgerd.daemon.client_async.AsyncClient`; :class:`BlockingSession`,
:class:`BlockingWatch` and :class:`BlockingTransaction` are
:mod:`ledgerd.daemon.client_session`'s classes): a method is the async one made blocking
by :func:`~ledgerd.daemon.client_bridge.blocking`, with its parameters and types; what
is written out here is what differs for blocking code (context managers, iteration,
resolvers run on worker threads). It talks to nothing itself: what goes over the socket
is the async classes' business.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from pathlib import Path
from types import TracebackType

from ledgerd.daemon.client_async import AsyncClient, TxnContext
from ledgerd.daemon.client_bridge import Bridge, blocking, blocking_iter, bridged, then
from ledgerd.daemon.client_docs import AsyncDocuments
from ledgerd.daemon.client_session import AsyncTransaction, Session, Watch
from ledgerd.daemon.client_types import (
    Answer,
    Change,
    LedgerError,
    Name,
    ResolverCallback,
    ResolveRequest,
)

__all__ = [
    "BlockingResolver",
    "BlockingSession",
    "BlockingTransaction",
    "BlockingWatch",
    "Bridge",
    "Client",
    "Documents",
]

BlockingResolver = Callable[[ResolveRequest], Answer]
"""A resolver for blocking code: it runs on a worker thread, not on the client's loop."""


def _on_thread(callback: BlockingResolver) -> ResolverCallback:
    async def resolve(request: ResolveRequest) -> Answer:
        return await asyncio.to_thread(callback, request)

    return resolve


class BlockingWatch:
    """A :class:`Watch` for blocking code: an iterator of :class:`Change`; close it."""

    def __init__(self, bridge: Bridge, watch: Watch) -> None:
        self._bridge = bridge
        self._call = bridge.call
        self.aio = watch

    def __iter__(self) -> BlockingWatch:
        return self

    def __next__(self) -> Change:
        try:
            return self._call(self.aio.__anext__())
        except StopAsyncIteration:
            raise StopIteration from None

    def __enter__(self) -> BlockingWatch:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    close = blocking(Watch.close)


class BlockingTransaction:
    """An :class:`AsyncTransaction` for blocking code. From :meth:`Client.transaction` it
    is a context manager that opens its own session (commit on a clean exit, rollback
    on an exception); from :meth:`BlockingSession.begin` it is already open."""

    def __init__(self, bridge: Bridge, txn: AsyncTransaction | TxnContext) -> None:
        self._bridge = bridge
        self._call = bridge.call
        self._ctx = txn if isinstance(txn, TxnContext) else None
        self._txn = txn if isinstance(txn, AsyncTransaction) else None

    def __enter__(self) -> BlockingTransaction:
        if self._ctx is not None:
            self._txn = self._call(self._ctx.__aenter__())
        return self

    def __exit__(
        self, et: type[BaseException] | None, e: BaseException | None, tb: TracebackType | None
    ) -> None:
        if self._ctx is not None:
            self._call(self._ctx.__aexit__(et, e, tb))
        elif et is None:
            self.commit()
        else:
            self.rollback()

    @property
    def aio(self) -> AsyncTransaction:
        if self._txn is None:
            raise LedgerError("closed", "the transaction is not open: use it in a with block")
        return self._txn

    @property
    def id(self) -> str:
        return self.aio.id

    @property
    def base(self) -> str:
        return self.aio.base

    @property
    def commit_id(self) -> str | None:
        return self._txn.commit_id if self._txn is not None else None

    @property
    def versionstamp(self) -> bytes | None:
        return self._txn.versionstamp if self._txn is not None else None

    @property
    def versionstamped_keys(self) -> list[bytes]:
        return self._txn.versionstamped_keys if self._txn is not None else []

    get = blocking(AsyncTransaction.get)
    put = blocking(AsyncTransaction.put)
    set_versionstamped_key = blocking(AsyncTransaction.set_versionstamped_key)
    set_versionstamped_value = blocking(AsyncTransaction.set_versionstamped_value)
    delete = blocking(AsyncTransaction.delete)
    clear = blocking(AsyncTransaction.clear)
    entries = blocking(AsyncTransaction.entries)
    commit = blocking(AsyncTransaction.commit)
    rollback = blocking(AsyncTransaction.rollback)


class BlockingSession:
    """A :class:`Session` for blocking code (from :meth:`Client.open_session`)."""

    def __init__(self, bridge: Bridge, session: Session) -> None:
        self._bridge = bridge
        self._call = bridge.call
        self.aio = session

    def __enter__(self) -> BlockingSession:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    call = blocking(Session.call)
    close = blocking(Session.close)
    begin = bridged(Session.begin, then(BlockingTransaction))
    subscribe = bridged(Session.subscribe, then(BlockingWatch))
    watch = blocking_iter(Session.watch)

    def register_resolver(self, ledger: Name, callback: BlockingResolver) -> None:
        """Answer the ledger's conflicts with ``callback`` (run on a worker thread)
        while this session is open."""
        self._call(self.aio.register_resolver(ledger, _on_thread(callback)))


class Documents:
    """:class:`AsyncDocuments` for blocking code: its methods through the
    :class:`~ledgerd.daemon.client.Client`'s bridge."""

    def __init__(self, bridge: Bridge, aio: AsyncDocuments) -> None:
        self._bridge = bridge
        self.aio = aio

    create = blocking(AsyncDocuments.create)
    get = blocking(AsyncDocuments.get)
    replace = blocking(AsyncDocuments.replace)
    bulk_docs = blocking(AsyncDocuments.bulk_docs)
    select = blocking(AsyncDocuments.select)
    explain = blocking(AsyncDocuments.explain)
    delete = blocking(AsyncDocuments.delete)
    purge = blocking(AsyncDocuments.purge)
    list_documents = blocking_iter(AsyncDocuments.list_documents)
    put_attachment = blocking(AsyncDocuments.put_attachment)
    attachment_stream = blocking_iter(AsyncDocuments.attachment_stream)
    read_attachment = blocking(AsyncDocuments.read_attachment)
    attachment_to_file = blocking(AsyncDocuments.attachment_to_file)
    delete_attachment = blocking(AsyncDocuments.delete_attachment)
    declare_index = blocking(AsyncDocuments.declare_index)
    drop_index = blocking(AsyncDocuments.drop_index)
    rebuild_index = blocking(AsyncDocuments.rebuild_index)
    indexes = blocking(AsyncDocuments.indexes)
    find = blocking_iter(AsyncDocuments.find)
    changes = blocking(AsyncDocuments.changes)
    all_changes = blocking_iter(AsyncDocuments.all_changes)
    follow = blocking_iter(AsyncDocuments.follow)


class Client:
    """A blocking client: :class:`AsyncClient` through a :class:`Bridge` of its own
    (``tests/daemon/test_client.py`` checks that every public method has its
    counterpart with the same parameters)."""

    def __init__(self, socket: str | Path | None = None, timeout: float | None = None) -> None:
        self._bridge = Bridge()
        self._call = self._bridge.call
        self.aio = AsyncClient(socket, timeout)

    url = staticmethod(AsyncClient.url)
    page_path = staticmethod(AsyncClient.page_path)

    def close(self) -> None:
        if self._bridge.loop.is_running():
            self._call(self.aio.close())
            self._bridge.stop()

    def __enter__(self) -> Client:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- repository ----------------------------------------------------------------
    status = blocking(AsyncClient.status)
    ledgers = blocking(AsyncClient.ledgers)
    pages = blocking(AsyncClient.pages)

    # -- values --------------------------------------------------------------------
    get_stream = blocking_iter(AsyncClient.get_stream)
    get = blocking(AsyncClient.get)
    get_to_file = blocking(AsyncClient.get_to_file)
    put = blocking(AsyncClient.put)
    delete = blocking(AsyncClient.delete)
    clear = blocking(AsyncClient.clear)
    delete_page = blocking(AsyncClient.delete_page)
    delete_ledger = blocking(AsyncClient.delete_ledger)
    batch = blocking(AsyncClient.batch)
    set_versionstamped_key = blocking(AsyncClient.set_versionstamped_key)
    set_versionstamped_value = blocking(AsyncClient.set_versionstamped_value)
    entries = blocking_iter(AsyncClient.entries)
    sync = blocking(AsyncClient.sync)
    policy = blocking(AsyncClient.policy)
    conflicts = blocking(AsyncClient.conflicts)
    resolve = blocking(AsyncClient.resolve)
    heads = blocking(AsyncClient.heads)
    history = blocking(AsyncClient.history)

    def register_resolver(self, ledger: Name, callback: BlockingResolver) -> BlockingSession:
        """Resolve the ledger's conflicts with ``callback`` (run on a worker thread) until
        the returned session closes."""
        session = self._call(self.aio.register_resolver(ledger, _on_thread(callback)))
        return BlockingSession(self._bridge, session)

    # -- sessions --------------------------------------------------------------------
    open_session = bridged(AsyncClient.open_session, then(BlockingSession))
    transaction = bridged(AsyncClient.transaction, BlockingTransaction)
    subscribe = bridged(AsyncClient.subscribe, then(BlockingWatch))
    watch = blocking_iter(AsyncClient.watch)
    documents = bridged(AsyncClient.documents, Documents)

    # -- operations ------------------------------------------------------------------
    check = blocking(AsyncClient.check)
    gc = blocking(AsyncClient.gc)
    evict = blocking(AsyncClient.evict)
    du = blocking(AsyncClient.du)
    health = blocking(AsyncClient.health)
    metrics = blocking(AsyncClient.metrics)
