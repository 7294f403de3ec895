"""A full disk: writes fail with StorageFullError, nothing acknowledged is lost,
and once space is freed the page writes, closes and opens again.

Runs on a small tmpfs (as root, like the project's CI); elsewhere it is skipped.
"""

from __future__ import annotations

import os
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from ledgerd.store import Repository, StorageFullError


@pytest.fixture
def small_disk(tmp_path: Path) -> Iterator[Path]:
    mnt = tmp_path / "small"
    mnt.mkdir()
    out = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", "size=3m", "tmpfs", str(mnt)],
        capture_output=True,
        check=False,
    )
    if out.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {out.stderr.decode().strip()}")
    try:
        yield mnt
    finally:
        subprocess.run(["umount", "-l", str(mnt)], check=False)


def _fill(path: Path, leave: int) -> None:
    """Take the disk's free space down to about ``leave`` bytes."""
    st = os.statvfs(path.parent)
    free = st.f_bavail * st.f_frsize
    path.write_bytes(b"\0" * max(0, free - leave))


async def test_disk_full_is_a_clear_error_and_loses_nothing(small_disk: Path) -> None:
    data = small_disk / "data"
    acked: dict[bytes, bytes] = {}
    async with await Repository.open(data) as repo:
        page = await repo.ledger("l").page("p")
        await page.put(b"before", b"x" * 100)
        await page.flush()
        acked[b"before"] = b"x" * 100
        filler = small_disk / "filler"
        _fill(filler, 64 * 1024)
        with pytest.raises(StorageFullError, match="disk is full"):
            for i in range(10_000):
                value = os.urandom(2000)
                await page.put(b"k%d" % i, value)
                acked[b"k%d" % i] = value
                await page.flush()
        for k, v in acked.items():  # every acknowledged write reads back
            assert await page.get(k) == v
        filler.unlink()  # space is freed: writing works again, without a restart
        await page.put(b"after", b"y")
        await page.flush()
        acked[b"after"] = b"y"
    _fill(small_disk / "filler2", 256 * 1024)  # a restart on a nearly full disk
    async with await Repository.open(data) as repo:
        page = await repo.ledger("l").page("p")
        for k, v in acked.items():
            assert await page.get(k) == v
