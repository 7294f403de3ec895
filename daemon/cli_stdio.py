"""``ledgerctl``'s blocking reads and writes of standard input and output (and of
files), run off the event loop on one daemon thread of its own
(:class:`store.sqlite.threads.BlockingCalls`).

Not ``asyncio.to_thread``: its threads are joined when the interpreter exits, so on
Ctrl-C a read of a terminal or pipe that waited for more kept ``ledgerctl`` from
exiting until a line or the end came. Reads and writes go through ``os.read`` and
``os.write`` where they can: a call left waiting at exit then holds no lock of
``sys.stdin``'s or ``sys.stdout``'s that the interpreter takes as it ends.
"""

from __future__ import annotations

import os

from ledgerd.store import BlockingCalls


def write_all(fd: int, data: bytes) -> None:
    """``os.write`` until every byte is written (no lock of sys.stdout's is held meanwhile)."""
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view) :]


blocking = BlockingCalls(1, "ledgerctl-io")
"""Runs a blocking read or write of a terminal, pipe or file, one at a time, on a
daemon thread of its own (:class:`store.sqlite.threads.BlockingCalls`)."""
