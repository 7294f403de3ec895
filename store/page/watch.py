"""Watchers: one notification per commit that changes a page, in commit order.

This module owns what a watcher is told and how much it may fall behind. A
notification is computed from the tree diff between the page's state before and
after a commit (or a merge, or an import), restricted to the watcher's prefix,
with small values inline. It never reaches the network: a LAZY value this device
has not fetched is announced with ``value`` None (and its size None when even
that is unknown here), so watchers work offline and never make an import wait
for the bucket.

Each watcher's queue is bounded (``max_queue`` notifications, and ``max_bytes`` of
their keys and values): a watcher that falls that far
behind is ended, its iteration stops after what was queued, and
:attr:`Watcher.ended_reason` says why.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable
from dataclasses import dataclass

from ledgerd.store.errors import StoreError
from ledgerd.store.page.view import live
from ledgerd.store.pieces.objects import ObjectStore
from ledgerd.store.tree import btree
from ledgerd.store.tree.btree import NodeStore, Priority

WATCH_VALUE_LIMIT = 64 * 1024
"""Notifications carry values up to this size; larger ones carry None."""

MAX_WATCH_QUEUE = 1024
"""Notifications a watcher may have waiting before it is ended as too slow."""

MAX_WATCH_QUEUE_BYTES = 64 * 1024 * 1024
"""The keys and values a watcher's waiting notifications may hold before it is ended as
too slow (more than one notification always may: a single commit may be larger), by
default."""


@dataclass(frozen=True, slots=True)
class ChangedEntry:
    key: bytes
    value: bytes | None  # None when large or not on this device: read it at the commit
    priority: Priority
    size: int | None  # None when the value is not on this device (LAZY, not fetched)


@dataclass(frozen=True, slots=True)
class Notification:
    """What one commit changed in the page (restricted to the watcher's prefix)."""

    commit: bytes
    changed: list[ChangedEntry]
    deleted: list[bytes]


def _held(note: Notification) -> int:
    """The bytes of keys and values that a waiting notification holds."""
    return sum(len(c.key) + len(c.value or b"") for c in note.changed) + sum(
        len(k) for k in note.deleted
    )


class Watcher:
    """An async iterator of notifications, one per commit, in commit order."""

    def __init__(
        self,
        prefix: bytes,
        max_queue: int,
        on_close: Callable[[Watcher], None],
        max_bytes: int = MAX_WATCH_QUEUE_BYTES,
    ) -> None:
        self.prefix = prefix
        self.max_queue = max_queue
        self.max_bytes = max_bytes
        self.queue: asyncio.Queue[tuple[Notification, int] | None] = asyncio.Queue()
        """Notifications waiting, each with the bytes it holds; None: the end."""
        self.closed = False
        self.queued_bytes = 0
        """The keys and values of the notifications waiting (at most ``max_bytes``)."""
        self.ended_reason: str | None = None
        """Why the watcher ended by itself (it fell too far behind), or None."""
        self._on_close = on_close

    def __aiter__(self) -> Watcher:
        return self

    async def __anext__(self) -> Notification:
        if self.closed and self.queue.empty():
            raise StopAsyncIteration
        item = await self.queue.get()
        if item is None:
            self.closed = True
            raise StopAsyncIteration
        self.queued_bytes -= item[1]
        return item[0]

    async def wake(self) -> None:
        """Wait for a notification (or the end), then take every one waiting: for a
        reader that reads the page itself and only needs to know that it changed."""
        item = await self.queue.get()
        while item is not None:
            self.queued_bytes -= item[1]
            if self.queue.empty():
                return
            item = self.queue.get_nowait()

    def deliver(self, note: Notification) -> None:
        """Queue ``note``; end the watcher if it has fallen too far behind."""
        if self.closed:
            return
        held = _held(note)
        behind = None
        if self.queue.qsize() >= self.max_queue:
            behind = f"{self.max_queue} notifications"
        elif self.queue.qsize() and self.queued_bytes + held > self.max_bytes:
            behind = f"{self.queued_bytes} bytes of notifications"
        if behind is not None:
            self.ended_reason = (
                f"the watcher fell {behind} behind and was ended; "
                "read the page again and watch anew"
            )
            self.close()
            return
        self.queued_bytes += held
        self.queue.put_nowait((note, held))

    def close(self) -> None:
        if not self.closed:
            self.closed = True  # what is queued is still delivered, then the end
            self.queue.put_nowait(None)
            self._on_close(self)

    async def __aenter__(self) -> Watcher:
        return self

    async def __aexit__(self, *exc: object) -> None:
        self.close()


class Watchers:
    """The watchers of one page, and the notifications they are owed."""

    def __init__(
        self,
        nodes: NodeStore,
        objects: ObjectStore,
        touched: Callable[[], None],
        max_queue: int = MAX_WATCH_QUEUE,
        max_bytes: int = MAX_WATCH_QUEUE_BYTES,
    ) -> None:
        self._nodes = nodes
        self._objects = objects.local_only()
        self._touched = touched
        self.max_queue = max_queue
        self.max_bytes = max_bytes
        self._live: set[Watcher] = set()

    def __bool__(self) -> bool:
        return bool(self._live)

    def __len__(self) -> int:
        return len(self._live)

    def add(self, prefix: bytes) -> Watcher:
        w = Watcher(prefix, self.max_queue, self._closed, self.max_bytes)
        self._live.add(w)
        return w

    def _closed(self, w: Watcher) -> None:
        self._live.discard(w)
        self._touched()

    def close_all(self) -> None:
        for w in list(self._live):
            w.close()

    async def notify(self, cid: bytes, old_root: bytes, new_root: bytes) -> None:
        """Tell every watcher what changed between two states of the page."""
        if not self._live or old_root == new_root:
            return
        changes = [ch async for ch in btree.diff(self._nodes, old_root, new_root)]
        described: dict[bytes, ChangedEntry] = {}
        for w in list(self._live):
            changed: list[ChangedEntry] = []
            deleted: list[bytes] = []
            for ch in changes:
                if not ch.key.startswith(w.prefix):
                    continue
                old, new = live(ch.old), live(ch.new)
                if new is None:
                    if old is not None:  # a tombstone replacing nothing is no change
                        deleted.append(ch.key)
                    continue
                if old is not None and (old[1], old[2]) == (new[1], new[2]):
                    continue  # what reads see is the same (a newer dot, siblings)
                entry = described.get(ch.key)
                if entry is None:
                    entry = described[ch.key] = await self._describe(ch.key, new)
                changed.append(entry)
            if changed or deleted:
                w.deliver(Notification(cid, changed, deleted))

    async def _describe(self, key: bytes, e: btree.Entry) -> ChangedEntry:
        """The entry with its value when it is small and on this device (never fetched)."""
        size: int | None = None
        value = None
        with contextlib.suppress(StoreError):
            size = await self._objects.size(e.value)
            if size <= WATCH_VALUE_LIMIT:
                value = await self._objects.read_all(e.value)
        return ChangedEntry(key, value, e.priority, size)
