"""SQLite connections that run on one bounded thread pool shared by every database.

This module owns how work leaves the event loop: the store's SQLite work,
CPU-bound work over many bytes (:func:`off_loop`), and blocking calls that may
never return (:class:`BlockingCalls`: S3's, and ``ledgerctl``'s reads of a terminal). Each open
page has a writer and a reader connection; with a thread per connection (as
aiosqlite gives) a daemon with a thousand open pages runs two thousand threads,
each with its own stack and, under glibc, its own malloc arena, and memory freed
by closed pages is not given back. Here every connection runs its calls on one
:class:`~concurrent.futures.ThreadPoolExecutor` of at most ``SQLITE_THREADS``
threads (configurable: :func:`set_threads`), one call of a connection at a time.

Written here rather than taken from a library because aiosqlite, the maintained
asyncio binding, hard-wires one thread per connection; what is needed on top of
the standard library is small: an executor, and a lock per connection that is
held until the thread's work ends, even when the awaiting task is cancelled (so
that a connection is never used by two threads at once).
"""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import ctypes.util
import queue
import signal
import sqlite3
import threading
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any, ParamSpec, TypeVar

from ledgerd.store.errors import ClosedError

T = TypeVar("T")
P = ParamSpec("P")

OFF_LOOP_BYTES = 256 * 1024
"""CPU-bound work over more bytes than this (hashing, splitting, decoding, checking)
runs on a thread, not on the event loop; less costs less than the hand-off."""


async def off_loop(big: bool, fn: Callable[P, T], *args: P.args, **kwargs: P.kwargs) -> T:
    """``fn(*args, **kwargs)``: on a thread when ``big`` (the caller's measure against
    :data:`OFF_LOOP_BYTES`, or a count), else inline."""
    if big:
        return await asyncio.to_thread(fn, *args, **kwargs)
    return fn(*args, **kwargs)


_MAIN_THREAD_SIGNALS = {signal.SIGINT, signal.SIGTERM, signal.SIGHUP}
"""Signals that the threads of :class:`BlockingCalls` block, leaving them to the main one."""


class BlockingCalls:
    """Blocking calls, run on at most ``workers`` daemon threads (started as needed and
    kept). Not a ``ThreadPoolExecutor`` nor ``asyncio.to_thread``: the interpreter joins
    their threads as it exits, so a call that never returns (a boto3 read from an
    endpoint that does not answer, a read of a terminal) kept a stopped process alive.
    A call whose awaiting task was cancelled before a thread took it is not run; one
    already running runs on, and its result is dropped. After :meth:`close`, calls not
    yet started raise ``closed()`` and the threads end as they finish theirs."""

    def __init__(
        self, workers: int, name: str, closed: Callable[[], BaseException] = ClosedError
    ) -> None:
        self.workers = workers
        self.name = name
        self._closed_error = closed
        self._calls: queue.SimpleQueue[Callable[[], None] | None] = queue.SimpleQueue()
        self._lock = threading.Lock()
        self._threads = 0
        self._idle = 0  # threads waiting for a call, not yet promised one
        self._closed = False

    def _work(self) -> None:
        # Signals go to the main thread, whose handler (asyncio's, for Ctrl-C) runs
        # only there: one that reached this thread, blocked in a read, would leave the
        # event loop asleep, unaware of it.
        signal.pthread_sigmask(signal.SIG_BLOCK, _MAIN_THREAD_SIGNALS)
        while (call := self._calls.get()) is not None:
            call()
            with self._lock:
                self._idle += 1

    async def run(self, fn: Callable[..., T], *args: Any) -> T:
        if self._closed:
            raise self._closed_error()
        loop = asyncio.get_running_loop()
        fut: asyncio.Future[T] = loop.create_future()

        def settle(result: Any, error: BaseException | None) -> None:
            if fut.done():  # the awaiting task was cancelled
                return
            if error is not None:
                fut.set_exception(error)
            else:
                fut.set_result(result)

        def call() -> None:
            if fut.cancelled():
                return
            result: T | None = None
            error: BaseException | None = None
            if self._closed:
                error = self._closed_error()
            else:
                try:
                    result = fn(*args)
                except BaseException as e:  # handed to the awaiting task
                    error = e
            with contextlib.suppress(RuntimeError):  # the loop is closed: nobody waits
                loop.call_soon_threadsafe(settle, result, error)

        with self._lock:
            if self._idle:
                self._idle -= 1
            elif self._threads < self.workers:
                self._threads += 1
                threading.Thread(
                    target=self._work, name=f"{self.name}-{self._threads}", daemon=True
                ).start()
        self._calls.put(call)
        return await fut

    def close(self) -> None:
        """Drop the calls not started; each thread ends after the call it is in."""
        self._closed = True
        for _ in range(self._threads):
            self._calls.put(None)


SQLITE_THREADS = 8
"""Threads that run SQLite work for every database of the process, by default."""

_pool: ThreadPoolExecutor | None = None
_threads = SQLITE_THREADS
_pool_lock = threading.Lock()


def set_threads(n: int) -> None:
    """The number of threads for SQLite work (takes effect for a pool not started yet)."""
    global _threads
    if n < 1:
        raise ValueError("at least one SQLite thread is needed")
    _threads = n


def pool() -> ThreadPoolExecutor:
    """The shared pool, started on first use."""
    global _pool
    with _pool_lock:
        if _pool is None:
            _pool = ThreadPoolExecutor(_threads, thread_name_prefix="sqlite")
        return _pool


def _malloc_trim() -> Callable[[int], int] | None:
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        trim: Callable[[int], int] = libc.malloc_trim
    except (OSError, AttributeError):  # not glibc
        return None
    return trim


_trim = _malloc_trim()


def give_back_memory() -> None:
    """Return the heap's free memory to the system (glibc; elsewhere nothing).

    Closed pages free their SQLite caches, but glibc keeps the freed memory in the
    heaps of the threads that used it, so a daemon cycling through many pages grew
    with every cycle and never shrank (figures in bench/RESULTS.md)."""
    if _trim is not None:
        _trim(0)


class Connection:
    """A sqlite3 connection whose calls run on the shared pool, one at a time."""

    def __init__(self, conn: sqlite3.Connection) -> None:
        self.raw = conn
        self._lock = asyncio.Lock()

    @classmethod
    async def connect(cls, path: Path, **kwargs: Any) -> Connection:
        def open_() -> sqlite3.Connection:
            conn: sqlite3.Connection = sqlite3.connect(path, check_same_thread=False, **kwargs)
            return conn

        return cls(await asyncio.get_running_loop().run_in_executor(pool(), open_))

    async def call(self, fn: Callable[..., T], *args: Any) -> T:
        """``fn(*args)`` on a pool thread, after any call of this connection under way.

        If the caller is cancelled, the work still runs to its end and the
        connection stays taken until then."""
        await self._lock.acquire()
        try:
            fut = asyncio.get_running_loop().run_in_executor(pool(), fn, *args)
        except BaseException:
            self._lock.release()
            raise
        fut.add_done_callback(lambda _f: self._lock.release())
        return await asyncio.shield(fut)

    async def run(self, fn: Callable[[sqlite3.Connection], T]) -> T:
        """``fn(connection)`` on a pool thread."""
        return await self.call(fn, self.raw)

    async def execute(self, sql: str, params: Sequence[object] = ()) -> None:
        def work(conn: sqlite3.Connection) -> None:
            conn.execute(sql, params).close()

        await self.run(work)

    async def execute_fetchall(self, sql: str, params: Sequence[object] = ()) -> list[Any]:
        def work(conn: sqlite3.Connection) -> list[Any]:
            return conn.execute(sql, params).fetchall()

        return await self.run(work)

    @property
    def in_transaction(self) -> bool:
        return self.raw.in_transaction

    async def commit(self) -> None:
        await self.run(lambda conn: conn.commit())

    async def rollback(self) -> None:
        await self.run(lambda conn: conn.rollback())

    async def close(self) -> None:
        await self.run(lambda conn: conn.close())
