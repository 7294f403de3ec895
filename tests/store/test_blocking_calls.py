"""The threads of :class:`store.sqlite.threads.BlockingCalls` leave signals to the main thread."""

from __future__ import annotations

import signal

from ledgerd.store import BlockingCalls


async def test_a_blocking_call_runs_with_ctrl_c_blocked() -> None:
    """A Ctrl-C that the kernel gave to a thread blocked in a read of a terminal was
    handled by nobody: Python runs handlers on the main thread only, whose event loop
    slept on, so ``ledgerctl rm`` at its question could ignore Ctrl-C."""
    calls = BlockingCalls(1, "test")
    try:
        mask = await calls.run(signal.pthread_sigmask, signal.SIG_BLOCK, set())
    finally:
        calls.close()
    assert {signal.SIGINT, signal.SIGTERM, signal.SIGHUP} <= mask
    assert signal.SIGINT not in signal.pthread_sigmask(signal.SIG_BLOCK, set())
