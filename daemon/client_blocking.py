"""The blocking client: :class:`Client` and its sessions, watches and transactions.

This module owns running the asyncio client from blocking code: :class:`Bridge`, a
private event loop on a background thread, is the one way through, and every class
here wraps its async counterpart method for method (:class:`Client` wraps
:class:`~ledgerd.daemon.client_async.AsyncClient`, :class:`BlockingSession`,
:class:`BlockingWatch` and :class:`BlockingTransaction` wrap
:mod:`ledgerd.daemon.client_session`'s classes). Blocking resolvers run on worker
threads. It talks to nothing itself:
what goes over the socket is the async classes' business.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import threading
from collections.abc import AsyncIterator, Callable, Coroutine, Generator, Iterable
from pathlib import Path
from types import TracebackType
from typing import TYPE_CHECKING, Any, TypeVar

from ledgerd.daemon.client_async import AsyncClient, TxnContext
from ledgerd.daemon.client_body import Content
from ledgerd.daemon.client_session import AsyncTransaction, Session, Watch
from ledgerd.daemon.client_types import (
    Answer,
    Change,
    Item,
    LedgerError,
    Name,
    Progress,
    ResolverCallback,
    ResolveRequest,
)

if TYPE_CHECKING:
    from ledgerd.daemon.client_docs import Documents

T = TypeVar("T")
BlockingResolver = Callable[[ResolveRequest], Answer]
"""A resolver for blocking code: it runs on a worker thread, not on the client's loop."""


async def _anext(ait: AsyncIterator[T]) -> T:
    return await ait.__anext__()


class Bridge:
    """The one way the blocking classes run the async ones: a private event loop on a
    background thread; :meth:`call` runs one coroutine there and returns its result (or
    raises its exception) in the calling thread, :meth:`iterate` does the same per item."""

    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        self._thread = threading.Thread(
            target=self.loop.run_forever, name="ledgerd-client", daemon=True
        )
        self._thread.start()
        self._lock = threading.Lock()
        self._closed = False

    def call(self, coro: Coroutine[Any, Any, T]) -> T:
        """``coro``'s result; LedgerError ``client_closed`` once :meth:`stop` began, and
        for a call in flight when it did (its task is cancelled, never left pending)."""
        with self._lock:
            if self._closed:
                coro.close()
                raise _closed()
            future = asyncio.run_coroutine_threadsafe(coro, self.loop)
        try:
            return future.result()
        except concurrent.futures.CancelledError:
            if self._closed:
                raise _closed() from None
            raise

    def iterate(self, ait: AsyncIterator[T]) -> Generator[T, None, None]:
        """Items of ``ait``; closing the blocking iterator (or leaving a for loop early
        and dropping it) closes the async one on the loop."""
        try:
            while True:
                try:
                    yield self.call(_anext(ait))
                except StopAsyncIteration:
                    return
        finally:
            aclose = getattr(ait, "aclose", None)
            if aclose is not None and not self._closed:
                try:
                    self.call(aclose())
                except LedgerError as e:
                    if e.code != "client_closed":  # closed meanwhile: nothing to close
                        raise

    def stop(self) -> None:
        """Cancel the calls in flight (their threads get ``client_closed``), then stop
        the loop. (Stopping it under a pending call left its thread waiting forever.)"""
        with self._lock:
            if self._closed:
                return
            self._closed = True
        if self.loop.is_running():
            asyncio.run_coroutine_threadsafe(_cancel_all(), self.loop).result()
            self.loop.call_soon_threadsafe(self.loop.stop)
            self._thread.join()
            self.loop.close()


async def _cancel_all() -> None:
    tasks = [t for t in asyncio.all_tasks() if t is not asyncio.current_task()]
    for t in tasks:
        t.cancel()
    await asyncio.gather(*tasks, return_exceptions=True)


def _closed() -> LedgerError:
    return LedgerError("client_closed", "the client is closed")


class Client:
    """A blocking client: :class:`AsyncClient` through :class:`Bridge`, method for method
    (``tests/daemon/test_client.py`` checks that every public method has its counterpart
    with the same parameters)."""

    def __init__(self, socket: str | Path | None = None, timeout: float | None = None) -> None:
        self._bridge = Bridge()
        self.aio = AsyncClient(socket, timeout)
        self._call = self._bridge.call

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

    def status(self) -> dict[str, Any]:
        return self._call(self.aio.status())

    def ledgers(self) -> list[bytes]:
        return self._call(self.aio.ledgers())

    def pages(self, ledger: Name) -> list[bytes]:
        return self._call(self.aio.pages(ledger))

    # -- values --------------------------------------------------------------------

    def get_stream(
        self,
        ledger: Name,
        page: Name,
        key: bytes,
        *,
        at: str | None = None,
        offset: int | None = None,
        length: int | None = None,
        progress: Progress | None = None,
    ) -> Generator[bytes, None, None]:
        return self._bridge.iterate(
            self.aio.get_stream(
                ledger, page, key, at=at, offset=offset, length=length, progress=progress
            )
        )

    def get(self, ledger: Name, page: Name, key: bytes, **kw: Any) -> bytes:
        return self._call(self.aio.get(ledger, page, key, **kw))

    def get_to_file(
        self,
        ledger: Name,
        page: Name,
        key: bytes,
        path: Path,
        progress: Progress | None = None,
        at: str | None = None,
    ) -> int:
        return self._call(self.aio.get_to_file(ledger, page, key, path, progress, at))

    def put(
        self,
        ledger: Name,
        page: Name,
        key: bytes,
        value: Content,
        *,
        lazy: bool = False,
        progress: Progress | None = None,
    ) -> None:
        self._call(self.aio.put(ledger, page, key, value, lazy=lazy, progress=progress))

    def delete(self, ledger: Name, page: Name, key: bytes) -> None:
        self._call(self.aio.delete(ledger, page, key))

    def clear(self, ledger: Name, page: Name) -> None:
        self._call(self.aio.clear(ledger, page))

    def delete_page(self, ledger: Name, page: Name) -> None:
        self._call(self.aio.delete_page(ledger, page))

    def delete_ledger(self, ledger: Name) -> None:
        self._call(self.aio.delete_ledger(ledger))

    def batch(
        self,
        ledger: Name,
        page: Name,
        puts: Iterable[tuple[bytes, bytes] | tuple[bytes, bytes, str]] = (),
        deletes: Iterable[bytes] = (),
    ) -> int:
        return self._call(self.aio.batch(ledger, page, list(puts), list(deletes)))

    def set_versionstamped_key(
        self, ledger: Name, page: Name, template: bytes, value: bytes, *, lazy: bool = False
    ) -> bytes:
        return self._call(self.aio.set_versionstamped_key(ledger, page, template, value, lazy=lazy))

    def set_versionstamped_value(
        self, ledger: Name, page: Name, key: bytes, template: bytes, *, lazy: bool = False
    ) -> bytes:
        return self._call(self.aio.set_versionstamped_value(ledger, page, key, template, lazy=lazy))

    def entries(
        self,
        ledger: Name,
        page: Name,
        *,
        start: bytes | None = None,
        end: bytes | None = None,
        prefix: bytes | None = None,
        limit: int | None = None,
        at: str | None = None,
        values: bool = True,
        page_size: int = 1000,
    ) -> Generator[Item, None, None]:
        return self._bridge.iterate(
            self.aio.entries(
                ledger,
                page,
                start=start,
                end=end,
                prefix=prefix,
                limit=limit,
                at=at,
                values=values,
                page_size=page_size,
            )
        )

    def sync(
        self, ledger: Name | None = None, page: Name | None = None, timeout: float = 60.0
    ) -> dict[str, Any]:
        return self._call(self.aio.sync(ledger, page, timeout))

    def policy(self, ledger: Name, page: Name, policy: str | None = None) -> dict[str, Any]:
        return self._call(self.aio.policy(ledger, page, policy))

    def register_resolver(self, ledger: Name, callback: BlockingResolver) -> BlockingSession:
        """Resolve the ledger's conflicts with ``callback`` (run on a worker thread) until
        the returned session closes."""
        return BlockingSession(
            self._bridge, self._call(self.aio.register_resolver(ledger, _on_thread(callback)))
        )

    def heads(self, ledger: Name, page: Name) -> list[dict[str, Any]]:
        return self._call(self.aio.heads(ledger, page))

    def history(self, ledger: Name, page: Name, limit: int = 100) -> list[dict[str, Any]]:
        return self._call(self.aio.history(ledger, page, limit))

    # -- sessions --------------------------------------------------------------------

    def open_session(self) -> BlockingSession:
        return BlockingSession(self._bridge, self._call(self.aio.open_session()))

    def transaction(self, ledger: Name, page: Name) -> BlockingTransaction:
        """``with client.transaction(l, p) as txn:`` commits on a clean exit, rolls back
        on an exception; ``txn.commit_id`` is the commit made."""
        return BlockingTransaction(self._bridge, TxnContext(self.aio, ledger, page))

    def subscribe(self, ledger: Name, page: Name, prefix: bytes = b"") -> BlockingWatch:
        return BlockingWatch(self._bridge, self._call(self.aio.subscribe(ledger, page, prefix)))

    def watch(self, ledger: Name, page: Name, prefix: bytes = b"") -> Generator[Change, None, None]:
        return self._bridge.iterate(self.aio.watch(ledger, page, prefix))

    def documents(self, ledger: Name, page: Name) -> Documents:
        """The page's documents (:mod:`daemon.client_docs`), blocking."""
        from ledgerd.daemon.client_docs import Documents

        return Documents(self._bridge, self.aio.documents(ledger, page))

    # -- operations (issue 19) -------------------------------------------------------

    def check(
        self,
        ledger: Name | None = None,
        page: Name | None = None,
        *,
        cloud: bool = False,
        repair: bool = False,
    ) -> dict[str, Any]:
        return self._call(self.aio.check(ledger, page, cloud=cloud, repair=repair))

    def health(self, sync: bool = False) -> dict[str, Any]:
        return self._call(self.aio.health(sync))

    def gc(self, ledger: Name | None = None, page: Name | None = None) -> dict[str, Any]:
        return self._call(self.aio.gc(ledger, page))

    def du(self, ledger: Name | None = None, page: Name | None = None) -> dict[str, Any]:
        return self._call(self.aio.du(ledger, page))

    def evict(self, ledger: Name, page: Name) -> dict[str, Any]:
        return self._call(self.aio.evict(ledger, page))

    def metrics(self) -> str:
        return self._call(self.aio.metrics())


def _on_thread(callback: BlockingResolver) -> ResolverCallback:
    async def resolve(request: ResolveRequest) -> Answer:
        return await asyncio.to_thread(callback, request)

    return resolve


class BlockingSession:
    """A :class:`Session` for blocking code (from :meth:`Client.open_session`)."""

    def __init__(self, bridge: Bridge, session: Session) -> None:
        self._bridge = bridge
        self.aio = session
        self._call = bridge.call

    def __enter__(self) -> BlockingSession:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def call(self, op: str, **args: Any) -> dict[str, Any]:
        return self._call(self.aio.call(op, **args))

    def close(self) -> None:
        self._call(self.aio.close())

    def begin(self, ledger: Name, page: Name) -> BlockingTransaction:
        """A transaction on this session: end it with ``commit`` or ``rollback``."""
        return BlockingTransaction(self._bridge, self._call(self.aio.begin(ledger, page)))

    def subscribe(self, ledger: Name, page: Name, prefix: bytes = b"") -> BlockingWatch:
        return BlockingWatch(self._bridge, self._call(self.aio.subscribe(ledger, page, prefix)))

    def watch(self, ledger: Name, page: Name, prefix: bytes = b"") -> Generator[Change, None, None]:
        return self._bridge.iterate(self.aio.watch(ledger, page, prefix))

    def register_resolver(self, ledger: Name, callback: BlockingResolver) -> None:
        self._call(self.aio.register_resolver(ledger, _on_thread(callback)))


class BlockingWatch:
    """A :class:`Watch` for blocking code: an iterator of :class:`Change`; close it."""

    def __init__(self, bridge: Bridge, watch: Watch) -> None:
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

    def close(self) -> None:
        self._call(self.aio.close())


class BlockingTransaction:
    """An :class:`AsyncTransaction` for blocking code. From :meth:`Client.transaction` it
    is a context manager that opens its own session (commit on a clean exit, rollback
    on an exception); from :meth:`BlockingSession.begin` it is already open."""

    def __init__(self, bridge: Bridge, txn: AsyncTransaction | TxnContext) -> None:
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

    def get(self, key: bytes) -> bytes | None:
        """The value as this transaction sees it, or None when the key is not set
        (:meth:`Client.get` raises NotFoundError instead)."""
        return self._call(self.aio.get(key))

    def put(self, key: bytes, value: bytes, *, lazy: bool = False) -> None:
        self._call(self.aio.put(key, value, lazy=lazy))

    def set_versionstamped_key(self, template: bytes, value: bytes, *, lazy: bool = False) -> None:
        self._call(self.aio.set_versionstamped_key(template, value, lazy=lazy))

    def set_versionstamped_value(self, key: bytes, template: bytes, *, lazy: bool = False) -> None:
        self._call(self.aio.set_versionstamped_value(key, template, lazy=lazy))

    def delete(self, key: bytes) -> None:
        self._call(self.aio.delete(key))

    def clear(self) -> None:
        self._call(self.aio.clear())

    def entries(self, prefix: bytes | None = None, limit: int = 1000) -> list[Item]:
        return self._call(self.aio.entries(prefix, limit))

    def commit(self) -> str | None:
        return self._call(self.aio.commit())

    def rollback(self) -> None:
        self._call(self.aio.rollback())
