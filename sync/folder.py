"""A :class:`~sync.cloud.CloudStore` in a local or mounted folder (``file:///path``).

This module owns mapping object names to files. Writes go to a temporary file in
the same directory, are fsynced, and are published with ``os.link`` (which fails
if the name exists, so nothing is ever overwritten, even by two daemons sharing
the folder). Readers therefore never see a partial object. File work runs on
worker threads.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import uuid
from collections.abc import AsyncIterator
from pathlib import Path

from ledgerd.sync.cloud import CloudStore, check_name, check_prefix, filtered_names
from ledgerd.sync.errors import AlreadyExistsError, CloudNotFoundError, PermanentCloudError

_TMP = ".tmp-"


class FolderStore(CloudStore):
    def __init__(self, root: Path) -> None:
        self.root = Path(root)

    def _path(self, name: str) -> Path:
        return self.root / check_name(name)

    async def put(self, name: str, data: bytes) -> None:
        path = self._path(name)

        def write() -> None:
            path.parent.mkdir(parents=True, exist_ok=True)
            tmp = path.parent / f"{_TMP}{uuid.uuid4().hex}"
            try:
                with open(tmp, "wb") as f:
                    f.write(data)
                    f.flush()
                    os.fsync(f.fileno())
                try:
                    os.link(tmp, path)
                except FileExistsError:
                    raise AlreadyExistsError(f"object {name} already exists") from None
            except PermissionError as e:
                raise PermanentCloudError(f"cannot write {path}: {e}") from e
            finally:
                with contextlib.suppress(FileNotFoundError):
                    tmp.unlink()

        await asyncio.to_thread(write)

    async def get(self, name: str, offset: int = 0, length: int | None = None) -> bytes:
        path = self._path(name)

        def read() -> bytes:
            try:
                with open(path, "rb") as f:
                    f.seek(offset)
                    return f.read() if length is None else f.read(length)
            except FileNotFoundError:
                raise CloudNotFoundError(f"no object {name}") from None
            except PermissionError as e:
                raise PermanentCloudError(f"cannot read {path}: {e}") from e

        return await asyncio.to_thread(read)

    async def list(self, prefix: str = "", after: str = "") -> AsyncIterator[str]:
        check_prefix(prefix)

        def scan() -> list[str]:
            out = []
            for dirpath, dirnames, filenames in os.walk(self.root):
                dirnames[:] = [d for d in dirnames if not d.startswith(_TMP)]
                rel = os.path.relpath(dirpath, self.root)
                for fn in filenames:
                    if fn.startswith(_TMP):
                        continue
                    name = fn if rel == "." else f"{rel}/{fn}"
                    if name.startswith(prefix) and name > after:
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
