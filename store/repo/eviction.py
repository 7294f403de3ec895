"""Page eviction: deleting the local copy of a page whose contents the bucket holds.

This module owns when a closed page may be evicted, the order of the steps and
their recovery, and the policies that choose pages (least recently used under a
disk budget, and by age). The repository (:mod:`store.repo.repository`) calls it with
the page closed and its opening lock held, and restores an evicted page on its
next use through :class:`store.page.hooks.PageRestorer`.

Evictable
    A closed page is evictable when it is fully synced (no commit or piece waits
    for upload, no journal is open: every commit it has was uploaded or came from
    the bucket) or when it is empty (its only commit is the well-known first one,
    no journal). A page that never synced has every commit waiting for upload, so
    only an empty one qualifies. An evicted page looks the
    same to applications: it stays listed, and its next use brings it back from
    the bucket (an empty one too: other devices may have written it since; it starts
    empty when the bucket has nothing of it, or with no cloud configured); when the
    bucket cannot be reached that use fails with :class:`PageUnavailableError`,
    never an empty page.

Restored
    A restore must bring back every write this device made to the page: the page's
    context says which writes of each device it has seen by their latest time, and
    the next local write would claim every earlier one of this device as seen, so
    one missing then (a pack of its own whose GET failed) would never be imported.
    A restore short of ``written`` fails; the page stays evicted, and its next use
    tries again.

Steps (each survives a SIGKILL between it and the next)
    1. rename the page's directory to ``{page_b64}.evicting`` (atomic: the page is
       whole under its name, or not there at all): its storage is gone from where
       the page is read;
    2. record ``evicted`` in ``page_usage``, with the time of this device's last
       write to the page (``written``);
    3. delete the renamed directory.
    A ``*.evicting`` directory found when the repository opens is an eviction cut
    short after step 1 or 2: it is finished (its kind read from the database set
    aside, while that is whole).
"""

from __future__ import annotations

import contextlib
import logging
import os
import shutil
import sqlite3
from dataclasses import dataclass
from pathlib import Path

from ledgerd.store.errors import CorruptObjectError
from ledgerd.store.sqlite import metadata
from ledgerd.store.tree import dots
from ledgerd.store.tree.commit import FIRST

log = logging.getLogger(__name__)

SYNCED_EVICTED, EMPTY_EVICTED = 1, 2
"""``page_usage.evicted``: restored from the bucket; started empty again."""
SUFFIX = ".evicting"


@dataclass(frozen=True)
class Evictability:
    """Whether a closed page may be evicted, and why not."""

    kind: int
    """SYNCED_EVICTED or EMPTY_EVICTED when it may be; 0 when not."""
    reason: str = ""
    written: int = -1
    """The time of this device's last write to the page (-1: none)."""

    @property
    def ok(self) -> bool:
        return self.kind != 0


def evictability(path: Path, tag: bytes) -> Evictability:
    """Look at a closed page's database (blocking: run it on a thread); ``tag`` is this
    device's writer tag (:func:`store.tree.dots.tag_of_device`)."""
    if not path.exists():
        return Evictability(0, "the page is not stored here")
    state = metadata.read_sync_state(path)
    # (Pieces still "local" are those of values replaced before an upload read
    # them, which no upload carries; what matters is the writes.)
    counts = {"open journals": state.open_journals}
    heads = state.heads
    waiting = [f"{n} {k}" for k, n in counts.items() if n]
    try:
        ctx = state.context
        written = dots.decode_context(ctx).get(tag, -1) if ctx is not None else -1
    except CorruptObjectError:
        written = 1 << 62
    if written > (int(state.uploaded) if state.uploaded is not None else -1):
        waiting.append("writes not uploaded")
    if waiting:
        return Evictability(0, "not fully synced: " + ", ".join(waiting))
    if heads in ([], [FIRST.id]):
        return Evictability(EMPTY_EVICTED)
    # Every commit but the first is uploaded or came from the bucket: it is all there.
    return Evictability(SYNCED_EVICTED, written=written)


def set_aside(page_dir: Path) -> Path:
    """Step 1: rename the page's directory aside (atomic); returns where it is now."""
    aside = page_dir.with_name(page_dir.name + SUFFIX)
    if page_dir.exists():
        os.rename(page_dir, aside)
        _fsync_dir(page_dir.parent)
    return aside


def delete_aside(aside: Path) -> None:
    """Step 3: delete a directory set aside."""
    shutil.rmtree(aside, ignore_errors=True)
    _fsync_dir(aside.parent)


def delete_page_dir(page_dir: Path) -> None:
    """Set a page's directory aside, then delete it (blocking): steps 1 and 3 with no
    record between, for storage that nothing needs (a restore that failed or was cut
    short)."""
    delete_aside(set_aside(page_dir))


def kind_of_aside(aside: Path, tag: bytes) -> Evictability:
    """What a page set aside by an eviction cut short was (blocking): read from its
    database if it is still whole; else restoring from the bucket is the safe guess."""
    try:
        verdict = evictability(aside / "page.sqlite", tag)
    except sqlite3.Error:
        verdict = Evictability(0)
    return verdict if verdict.kind else Evictability(SYNCED_EVICTED)


def _fsync_dir(d: Path) -> None:
    fd = os.open(d, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


Walk = list[tuple[Path, list[Path]]]
"""Each ledger directory with what it holds (page directories, and set-aside ones)."""


def walk(ledgers_dir: Path) -> Walk:
    """One walk of the ledgers' directories (blocking): what a start looks through."""
    if not ledgers_dir.is_dir():
        return []
    return [(d, list(d.iterdir())) for d in ledgers_dir.iterdir() if d.is_dir()]


def cut_short(walked: Walk, suffixes: tuple[str, ...] = (SUFFIX,)) -> list[tuple[Path, str, str]]:
    """The ``(ledger directory, page directory name, suffix)`` of evictions cut short,
    or of other steps that set a page's directory aside under one of ``suffixes``
    (blocking)."""
    out: list[tuple[Path, str, str]] = []
    for ledger, entries in walked:
        for p in entries:
            for suffix in suffixes:
                if p.name.endswith(suffix) and p.is_dir():
                    out.append((ledger, p.name[: -len(suffix)], suffix))
    return out


def directory_bytes(root: Path) -> int:
    """Bytes of every file under ``root`` (blocking)."""
    total = 0
    for dirpath, _, files in os.walk(root):
        for f in files:
            with contextlib.suppress(FileNotFoundError):  # deleted meanwhile
                total += os.stat(os.path.join(dirpath, f)).st_size
    return total
