"""A :class:`~sync.cloud.CloudStore` in a local or mounted folder (``file:///path``).

This module owns mapping object names to files. Writes go to a temporary file in
the same directory, are fsynced, and are published with ``os.link`` (which fails
if the name exists, so nothing is ever overwritten, even by two daemons sharing
the folder). Readers therefore never see a partial object. The temporary file of a
put cut short (its daemon killed) is removed by a listing of its directory once it
has not been written to for ``STALE_TMP`` seconds. File work runs on
worker threads.

Only regular files are objects: anything else under a name (a FIFO, a device, a
symlink) is skipped by ``list`` and refused by ``get``, which opens with
``O_NONBLOCK | O_NOFOLLOW`` so that nothing can make it wait. Files are created
0600 and directories 0700 whatever the umask. The root folder is created only by
:meth:`FolderStore.create_bucket`: a ``put`` into a root that is gone (a share
that is not mounted) fails instead of starting an empty bucket.
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import os
import stat
import time
import uuid
from collections.abc import AsyncIterator
from pathlib import Path

from ledgerd.sync.cloud import CloudStore, check_name, check_prefix, filtered_names
from ledgerd.sync.errors import (
    AlreadyExistsError,
    CloudNotFoundError,
    NoBucketError,
    PermanentCloudError,
    RangeNotInObjectError,
)

_TMP = ".tmp-"
STALE_TMP = 3600.0
"""Seconds after which a temporary file nobody writes to is a put cut short (its daemon
was killed): the listing of its directory removes it. A put still going on past that
finds its file gone and fails, and its pack is put again."""
FILE_MODE = 0o600
DIR_MODE = 0o700


def _remove_if_stale(entry: os.DirEntry[str]) -> None:
    """Remove a temporary file a put cut short left (untouched for STALE_TMP seconds)."""
    with contextlib.suppress(OSError):
        st = entry.stat(follow_symlinks=False)
        if stat.S_ISREG(st.st_mode) and time.time() - st.st_mtime > STALE_TMP:
            os.unlink(entry.path)


class FolderStore(CloudStore):
    def __init__(self, root: Path) -> None:
        self.root = Path(root)

    def _path(self, name: str) -> Path:
        return self.root / check_name(name)

    async def create_bucket(self) -> None:
        def make() -> None:
            try:
                if not self.root.is_dir():
                    self.root.mkdir(mode=DIR_MODE, parents=True, exist_ok=True)
                    os.chmod(self.root, DIR_MODE)
            except OSError as e:
                raise PermanentCloudError(
                    f"cannot create the bucket folder {self.root}: {e}"
                ) from e

        await asyncio.to_thread(make)

    def _make_dirs(self, parent: Path) -> None:
        """Create the directories from the root down to ``parent`` (never the root)."""
        if not self.root.is_dir():
            raise NoBucketError(
                f"the bucket folder {self.root} does not exist (moved away or not mounted?)"
            )
        here = self.root
        for part in parent.relative_to(self.root).parts:
            here = here / part
            try:
                os.mkdir(here, DIR_MODE)
            except FileExistsError:
                continue
            except FileNotFoundError:
                raise NoBucketError(f"the bucket folder {self.root} went away") from None
            os.chmod(here, DIR_MODE)  # the umask may have taken bits away

    async def put(self, name: str, data: bytes) -> None:
        path = self._path(name)

        def write() -> None:
            tmp = path.parent / f"{_TMP}{uuid.uuid4().hex}"
            try:
                self._make_dirs(path.parent)
                fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, FILE_MODE)
                try:
                    os.fchmod(fd, FILE_MODE)
                    view = memoryview(data)
                    while view:
                        view = view[os.write(fd, view) :]
                    os.fsync(fd)
                finally:
                    os.close(fd)
                try:
                    os.link(tmp, path)
                except FileExistsError:
                    raise AlreadyExistsError(f"object {name} already exists") from None
            except OSError as e:
                raise PermanentCloudError(f"cannot write {path}: {e}") from e
            finally:
                with contextlib.suppress(OSError):
                    tmp.unlink()

        await asyncio.to_thread(write)

    async def get(self, name: str, offset: int = 0, length: int | None = None) -> bytes:
        path = self._path(name)

        def read() -> bytes:
            try:
                fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_NOFOLLOW)
            except FileNotFoundError:
                raise CloudNotFoundError(f"no object {name}") from None
            except OSError as e:
                if e.errno == errno.ELOOP:
                    raise PermanentCloudError(f"{path} is a symlink, not an object") from None
                raise PermanentCloudError(f"cannot read {path}: {e}") from e
            try:
                st = os.fstat(fd)
                if not stat.S_ISREG(st.st_mode):
                    raise PermanentCloudError(f"{path} is not a regular file")
                if length == 0:
                    return b""
                if (offset or length is not None) and offset >= st.st_size:
                    raise RangeNotInObjectError(
                        f"{name}: range from {offset} is past the end ({st.st_size} bytes)"
                    )
                end = st.st_size if length is None else min(st.st_size, offset + length)
                parts = []
                pos = offset
                while pos < end:
                    chunk = os.pread(fd, end - pos, pos)
                    if not chunk:
                        break
                    parts.append(chunk)
                    pos += len(chunk)
                return b"".join(parts)
            except OSError as e:
                raise PermanentCloudError(f"cannot read {path}: {e}") from e
            finally:
                os.close(fd)

        return await asyncio.to_thread(read)

    async def list(self, prefix: str = "", after: str = "") -> AsyncIterator[str]:
        check_prefix(prefix)
        folder, _, _ = prefix.rpartition("/")

        def scan() -> list[str]:
            out: list[str] = []
            stack = [folder]
            while stack:
                rel = stack.pop()
                try:
                    entries = list(os.scandir(self.root / rel if rel else self.root))
                except (FileNotFoundError, NotADirectoryError):
                    continue
                for entry in entries:
                    if entry.name.startswith(_TMP):
                        _remove_if_stale(entry)
                        continue
                    name = f"{rel}/{entry.name}" if rel else entry.name
                    if entry.is_dir(follow_symlinks=False):
                        if name.startswith(prefix) or prefix.startswith(name + "/"):
                            stack.append(name)
                    elif (
                        entry.is_file(follow_symlinks=False)
                        and name.startswith(prefix)
                        and name > after
                    ):
                        out.append(name)
            return sorted(out)

        names = await asyncio.to_thread(scan)

        async def gen() -> AsyncIterator[str]:
            for n in names:
                yield n

        async for n in filtered_names(gen(), str(self.root)):
            yield n

    async def delete(self, name: str) -> None:
        path = self._path(name)
        await asyncio.to_thread(lambda: path.unlink(missing_ok=True))
