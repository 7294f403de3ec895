"""When background sync rounds run: adaptive polling, and rounds started by commits.

This module owns :class:`Poller`. Polling adapts: every ``poll_interval`` while this
device or the devices it hears from are active (for ``active_for`` seconds after a
round moved anything), then doubling up to ``poll_interval_max``; a local commit
starts a round at once (at most one per ``debounce``). What a round does is
:mod:`sync.rounds`.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Awaitable, Callable

from ledgerd.sync.rounds import Stats
from ledgerd.sync.status import describe

log = logging.getLogger(__name__)


class Poller:
    """The background loop's schedule: the interval to the next poll, and whether a
    local commit is waiting for a round."""

    def __init__(
        self, poll_interval: float, poll_interval_max: float, active_for: float, debounce: float
    ) -> None:
        self.poll_interval = poll_interval
        self.poll_interval_max = max(poll_interval, poll_interval_max)
        self.active_for = active_for
        self.debounce = debounce
        self.interval = poll_interval  # seconds to the next background poll
        self._dirty = False
        self._active_until = 0.0
        self._wake = asyncio.Event()

    def changed(self) -> None:
        """A local commit: a round at once (within ``debounce`` of the last such one)."""
        self._dirty = True
        self._wake.set()

    def active(self) -> None:
        """Poll fast for ``active_for`` seconds from now."""
        self._active_until = time.monotonic() + self.active_for
        self.interval = self.poll_interval

    def poke(self) -> None:
        """Poll at once, and fast for a while."""
        self.active()
        self._wake.set()

    async def run(
        self, run_round: Callable[[], Awaitable[Stats]], after: Callable[[], Awaitable[None]]
    ) -> None:
        """Run ``run_round`` then ``after`` when due, until cancelled; a round that fails
        is logged (its error is in status) and the loop goes on."""
        next_poll = 0.0
        last_push = -self.debounce  # the last round started by a local commit
        while True:
            try:
                if not self._dirty:
                    with contextlib.suppress(TimeoutError):
                        await asyncio.wait_for(
                            self._wake.wait(), max(0.0, next_poll - time.monotonic())
                        )
                if self._dirty:  # a local commit: at once, but one such round per debounce
                    await asyncio.sleep(max(0.0, last_push + self.debounce - time.monotonic()))
                    self._active_until = time.monotonic() + self.active_for
                    last_push = time.monotonic()
                self._dirty = False
                self._wake.clear()
                stats = await run_round()
                if stats.uploaded_packs or stats.downloaded_packs:
                    self._active_until = time.monotonic() + self.active_for
                await after()
                self.interval = self._next_interval()
                next_poll = time.monotonic() + self.interval
            except asyncio.CancelledError:
                raise
            except Exception as e:  # keep syncing; the error is in status
                log.warning("sync round failed: %s", describe(e))
                self.interval = self._next_interval()
                next_poll = time.monotonic() + self.interval

    def _next_interval(self) -> float:
        """``poll_interval`` while active; then doubling up to ``poll_interval_max``."""
        if time.monotonic() < self._active_until:
            return self.poll_interval
        return min(self.poll_interval_max, max(self.poll_interval, self.interval * 2))
