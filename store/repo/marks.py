"""Unwritten marks: the files that say a write making a page is under way.

This module owns the ``unwritten`` directory's marks (see :data:`UNWRITTEN`) and
telling a page whose making a crash cut short from one that was made (blocking
functions, run on a thread). The repository decides what to do with such a page.
"""

from __future__ import annotations

import contextlib
import os
import shutil
from pathlib import Path

from ledgerd.store.repo import eviction
from ledgerd.store.repo.layout import decode_name, encode_name, is_lost
from ledgerd.store.sqlite.db import NEW_SUFFIX

UNWRITTEN = "unwritten"
"""A directory beside ``ledgers``: while a write that makes a page is under way (a
daemon's PUT, batch, document write or session transaction into a page that did not
exist), a file ``{ledger}/{page}`` (their encoded names) is in it
(:meth:`Repository.mark_unwritten`). A page still marked when the repository opens
and holding nothing but its first commit was made by a write that a crash cut short,
never acknowledged: it is removed, as a failed first write's page is at once."""


def unwritten_marks(directory: Path) -> list[tuple[Path, bytes, bytes]]:
    """The marks under ``directory`` with the ledger and page each names (blocking);
    anything else there is dropped."""
    out: list[tuple[Path, bytes, bytes]] = []
    if not directory.is_dir():
        drop_mark(directory)  # something else in its place (or nothing)
        return out
    for d in list(directory.iterdir()):
        ledger = decode_name(d.name)
        if not ledger or not d.is_dir():
            drop_mark(d)
            continue
        for f in list(d.iterdir()):
            page = decode_name(f.name)
            if page and mark_path(directory, ledger, page) == f:
                out.append((f, ledger, page))
            else:
                drop_mark(f)
    return out


def mark_path(directory: Path, ledger: bytes, page_id: bytes) -> Path:
    # A directory per ledger, as under ledgers/: a name joining both could be over
    # the file system's 255 bytes (names are up to 128 bytes, 171 in base64).
    return directory / encode_name(ledger) / encode_name(page_id)


def make_mark(path: Path) -> None:
    for attempt in range(3):  # an drop_mark on another thread may remove the directory
        try:
            os.close(os.open(path, os.O_WRONLY | os.O_CREAT, 0o600))
            return
        except FileNotFoundError:
            if attempt == 2:
                raise
            for d in (path.parent.parent, path.parent):  # private, as ledgers/ is
                d.mkdir(mode=0o700, exist_ok=True)


def drop_mark(path: Path) -> None:
    """Remove a mark (or whatever is in its place), and its ledger's directory if
    that leaves it empty."""
    if path.is_dir():
        shutil.rmtree(path, ignore_errors=True)
    else:
        path.unlink(missing_ok=True)
    with contextlib.suppress(OSError):  # not empty: other marks
        path.parent.rmdir()


def never_made(path: Path) -> bool:
    """A marked page's database was never made (blocking): no file, or (as an older
    version left it, killed between creating the file and SQLite writing it) an empty
    one with no -wal. A page that was written has its -wal until it closes, and its
    close drops its mark, so an empty file beside a -wal is damage (refused as such).
    So is no file beside a -wal or -journal (:func:`store.repo.layout.is_lost`):
    SQLite makes those only once the file is in place (a making writes
    ``page.sqlite.new`` and its own side files, :func:`remove_unmade`), so the page
    was made, and they may hold commits."""
    try:
        if path.stat().st_size > 0:
            return False
    except FileNotFoundError:
        # No file: never made, unless its -wal or -journal remains (SQLite makes those
        # only for a database of this name): then the file was lost, and what remains
        # is all that is left of the page (see Repository.page_lost).
        return not is_lost(path.parent)
    return not path.with_name(path.name + "-wal").exists()


def remove_unmade(walked: eviction.Walk) -> list[Path]:
    """Remove what a making of a page's database cut short left (blocking): in a page
    directory with no ``page.sqlite``, its ``page.sqlite.new`` and that file's -journal,
    -wal and -shm (see store.sqlite.files.create_private), then the directory if that leaves it
    empty, and its ledger's too. A page made without an unwritten mark (a policy set, a
    sync download) left its ledger listed with no page, and the file until the page was
    made again. Anything else (a -wal whose database is lost) stays, as does a page with
    its database. Returns the page directories cleaned."""
    cleaned: list[Path] = []

    def ours(d: Path) -> bool:  # a page's or ledger's directory, not one set aside
        raw = decode_name(d.name)
        return raw is not None and encode_name(raw) == d.name and d.is_dir()

    for ledger, entries in walked:
        if not ours(ledger):
            continue
        removed = False
        for page_dir in entries:
            path = page_dir / "page.sqlite"
            if path.exists() or not ours(page_dir):
                continue
            new = path.with_name(path.name + NEW_SUFFIX)
            for f in (new, *(new.with_name(new.name + s) for s in ("-journal", "-wal", "-shm"))):
                with contextlib.suppress(FileNotFoundError):
                    f.unlink()
                    cleaned.append(page_dir)
            with contextlib.suppress(OSError):  # not empty: left for the page's next open
                page_dir.rmdir()
                removed = True
        if removed:
            with contextlib.suppress(OSError):  # not empty: other pages
                ledger.rmdir()
    return sorted(set(cleaned))
