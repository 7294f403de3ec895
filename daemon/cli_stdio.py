"""``ledgerctl``'s blocking reads and writes of standard input and output (and of
files), run off the event loop on one daemon thread of its own.

Not ``asyncio.to_thread``: its threads are joined when the interpreter exits, so on
Ctrl-C a read of a terminal or pipe that waited for more kept ``ledgerctl`` from
exiting until a line or the end came. Reads and writes go through ``os.read`` and
``os.write`` where they can: a call left waiting at exit then holds no lock of
``sys.stdin``'s or ``sys.stdout``'s that the interpreter takes as it ends.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import queue
import threading
from collections.abc import Callable
from typing import Any, TypeVar

T = TypeVar("T")


class _IoThread:
    """Blocking calls, one at a time, on a daemon thread of their own (see the module
    docstring for why not ``asyncio.to_thread``)."""

    def __init__(self) -> None:
        self.calls: queue.SimpleQueue[tuple[Callable[[], None]]] = queue.SimpleQueue()
        self.thread: threading.Thread | None = None

    def _work(self) -> None:
        while True:
            (call,) = self.calls.get()
            call()

    async def run(self, fn: Callable[..., T], *args: Any) -> T:
        loop = asyncio.get_running_loop()
        fut: asyncio.Future[T] = loop.create_future()

        def settle(result: Any, error: BaseException | None) -> None:
            if fut.done():
                return
            if error is not None:
                fut.set_exception(error)
            else:
                fut.set_result(result)

        def call() -> None:
            try:
                result, error = fn(*args), None
            except BaseException as e:  # handed to the awaiting task
                result, error = None, e
            with contextlib.suppress(RuntimeError):  # the loop is gone: nobody waits
                loop.call_soon_threadsafe(settle, result, error)

        if self.thread is None:
            self.thread = threading.Thread(target=self._work, name="ledgerctl-io", daemon=True)
            self.thread.start()
        self.calls.put((call,))
        return await fut


def write_all(fd: int, data: bytes) -> None:
    """``os.write`` until every byte is written (no lock of sys.stdout's is held meanwhile)."""
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view) :]


blocking = _IoThread()
"""Runs a blocking read or write of a terminal, pipe or file; see :class:`_IoThread`."""
