"""The data directory's names and files: how a name is checked and encoded, the
lock that keeps one process at a time, and removing a page's directory.

Layout: ``{data_dir}/{FORMAT_VERSION}/ledgers/{ledger_b64}/{page_b64}/page.sqlite``
with base64url names without padding. What is in the files is not this module's:
the pages own their databases, :mod:`store.repo.marks` the unwritten marks.
"""

from __future__ import annotations

import base64
import binascii
import contextlib
import fcntl
import os
import shutil
from pathlib import Path

from ledgerd.store.errors import InvalidArgumentError, NameTooLargeError, RepositoryLockedError

NAME_LIMIT = 128
PAGE_ID_SIZE = 16
"""Bytes of a page id chosen at random when none is given."""


def check_name(value: bytes | str, what: str) -> bytes:
    if isinstance(value, str):
        raw = value.encode()
    elif isinstance(value, bytes | bytearray | memoryview):  # not bytes(n): n NUL bytes
        raw = bytes(value)
    else:
        raise InvalidArgumentError(f"{what} is bytes or str, not {type(value).__name__}")
    if not raw:
        raise InvalidArgumentError(f"{what} must not be empty")
    if len(raw) > NAME_LIMIT:
        raise NameTooLargeError(f"{what} of {len(raw)} bytes is over the {NAME_LIMIT}-byte limit")
    return raw


def encode_name(raw: bytes) -> str:
    return base64.urlsafe_b64encode(raw).rstrip(b"=").decode()


def decode_name(text: str) -> bytes | None:
    try:
        return base64.urlsafe_b64decode(text + "=" * (-len(text) % 4))
    except (binascii.Error, ValueError):
        return None


def lock_directory(root: Path) -> int:
    """Create ``root`` (0700) if needed and take the exclusive lock of ``ledgerd.lock``."""
    if not root.is_dir():
        root.parent.mkdir(parents=True, exist_ok=True)
        with contextlib.suppress(FileExistsError):  # created meanwhile: checked below
            root.mkdir(mode=0o700)
    fd = os.open(root / "ledgerd.lock", os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        os.close(fd)
        raise RepositoryLockedError(
            f"the data directory {root} is in use by another process (a running ledgerd? "
            "then use its client, ledgerd.daemon.client, instead of opening the directory)"
        ) from None
    except BaseException:
        os.close(fd)
        raise
    return fd


DISCARDED = ".discarded"
"""Suffix of a page directory being removed (:meth:`Repository.discard_unwritten`);
one found when the repository opens is a removal cut short, finished then."""


LOST_LEFTOVERS = ("-wal", "-journal")
"""What a ``page.sqlite`` that is gone may leave: its page is damaged (see
:meth:`Repository.page_lost`)."""


def is_lost(page_dir: Path) -> bool:
    """The page directory's database file is gone while its -wal or -journal remains
    (blocking)."""
    return bool(lost_leftovers(page_dir))


def lost_leftovers(page_dir: Path) -> list[str]:
    """The names of what remains of a ``page.sqlite`` that is gone (blocking): none if
    it is there, or if nothing remains (a page never made)."""
    path = page_dir / "page.sqlite"
    try:
        if path.exists():
            return []
        return [path.name + s for s in LOST_LEFTOVERS if path.with_name(path.name + s).exists()]
    except OSError:  # a name too long, say: the page's open says what is wrong
        return []


def remove_page_dir(page_dir: Path) -> None:
    """Rename a page's directory to a name listings skip (atomic), then delete it; and
    its ledger's directory if that leaves it empty (blocking)."""
    aside = page_dir.with_name(page_dir.name + DISCARDED)
    shutil.rmtree(aside, ignore_errors=True)  # one left by a removal cut short
    with contextlib.suppress(FileNotFoundError):
        os.rename(page_dir, aside)
    remove_aside(aside)


def remove_aside(aside: Path) -> None:
    shutil.rmtree(aside, ignore_errors=True)
    with contextlib.suppress(OSError):  # not empty: other pages
        aside.parent.rmdir()
