"""The one way from blocking code to the asyncio clients: :class:`Bridge` and :func:`bridged`.

This module owns running the async clients' coroutines and async iterators from blocking
code: :class:`Bridge` is a private event loop on a background thread, and :func:`bridged`
(with :func:`blocking`, :func:`blocking_iter` and :func:`then`) makes a blocking method of
an async one, with its parameters and types. The blocking classes made of them are
:mod:`ledgerd.daemon.client_blocking`'s; what
goes over the socket is the async classes' business.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import functools
import inspect
import threading
from collections.abc import AsyncIterator, Callable, Coroutine, Generator
from typing import Any, Concatenate, ParamSpec, Protocol, TypeVar

from ledgerd.daemon.client_types import LedgerError

A = TypeVar("A")
A_co = TypeVar("A_co", covariant=True)
P = ParamSpec("P")
R = TypeVar("R")
T = TypeVar("T")
W = TypeVar("W")
X = TypeVar("X")
Y = TypeVar("Y")


async def _anext(ait: AsyncIterator[T]) -> T:
    return await ait.__anext__()


class Bridge:
    """A private event loop on a background thread: :meth:`call` runs one coroutine
    there and returns its result (or raises its exception) in the calling thread,
    :meth:`iterate` does the same per item of an async iterator."""

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


class Blocking(Protocol[A_co]):
    """A blocking class as the methods :func:`bridged` makes see it: the async object
    they call (``aio``) and the bridge they run on."""

    @property
    def aio(self) -> A_co: ...

    @property
    def _bridge(self) -> Bridge: ...


def bridged(
    method: Callable[Concatenate[A, P], X], run: Callable[[Bridge, X], Y]
) -> Callable[Concatenate[Blocking[A], P], Y]:
    """A blocking method: ``method`` of the instance's ``aio``, called with the same
    arguments in the calling thread, its result handed to ``run`` with the instance's
    bridge (:meth:`Bridge.call` for a coroutine, :meth:`Bridge.iterate` for an async
    iterator). Its name, docstring and parameters are ``method``'s."""

    def call(self: Blocking[A], /, *args: P.args, **kwargs: P.kwargs) -> Y:
        return run(self._bridge, method(self.aio, *args, **kwargs))

    functools.update_wrapper(call, method, ("__module__", "__name__", "__qualname__", "__doc__"))
    # What help() shows: method's parameters, not its (async) return type.
    call.__signature__ = inspect.signature(method).replace(  # type: ignore[attr-defined]
        return_annotation=inspect.Signature.empty
    )
    return call


def blocking(
    method: Callable[Concatenate[A, P], Coroutine[Any, Any, R]],
) -> Callable[Concatenate[Blocking[A], P], R]:
    """A blocking method that returns what the coroutine ``method`` returns."""
    return bridged(method, Bridge.call)


def blocking_iter(
    method: Callable[Concatenate[A, P], AsyncIterator[T]],
) -> Callable[Concatenate[Blocking[A], P], Generator[T, None, None]]:
    """A blocking method that returns a generator of the items of the async iterator
    ``method`` returns (closing the generator closes the async one)."""
    return bridged(method, Bridge.iterate)


def then(wrap: Callable[[Bridge, R], W]) -> Callable[[Bridge, Coroutine[Any, Any, R]], W]:
    """For :func:`bridged`: the coroutine's result, wrapped for blocking code (a
    :class:`~ledgerd.daemon.client_session.Watch` in its blocking class)."""

    def run(bridge: Bridge, coro: Coroutine[Any, Any, R]) -> W:
        return wrap(bridge, bridge.call(coro))

    return run
