"""A process killed while it makes a page's database file (store.sqlite.db._create_private)."""

from __future__ import annotations

import signal
import subprocess
import sys
from pathlib import Path

import pytest

from ledgerd.store import Repository
from ledgerd.store.repo.repository import encode_name

ROOT = Path(__file__).resolve().parents[2]


def _killed_making(data: Path, point: str) -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "tests.store.making_crash_child", str(data), point],
        cwd=ROOT,
        capture_output=True,
        timeout=60,
    )
    assert proc.returncode == -signal.SIGKILL, proc.stderr.decode()


def _files(ledgers: Path) -> list[str]:
    return sorted(str(f.relative_to(ledgers)) for f in ledgers.rglob("*"))


@pytest.mark.parametrize("point", ["made", "header", "rename"])
async def test_a_page_whose_making_was_cut_short_before_its_file_was_in_place_leaves_nothing(
    tmp_path: Path, point: str
) -> None:
    # A page made with no unwritten mark (a policy PUT's, a sync download's) by a
    # process killed before page.sqlite.new was renamed into place left its ledger
    # listed with no page, and page.sqlite.new (with its -journal) in the page's
    # directory until that page was made again, if ever. Nothing was in the page:
    # the next start removes what the making left.
    async with await Repository.open(tmp_path) as repo:
        await (await repo.ledger("kept").page("q")).put(b"k", b"v")
        ledgers = repo.ledgers_dir
    _killed_making(tmp_path, point)
    assert any(f.endswith(".new") for f in _files(ledgers))  # the kill came in time
    async with await Repository.open(tmp_path) as repo:
        assert await repo.ledgers() == [b"kept"]
        assert all(f.split("/")[0] == encode_name(b"kept") for f in _files(ledgers))
        page = await repo.ledger("l").page("p")  # made anew, as if never begun
        await page.put(b"k", b"v")
        assert await page.get(b"k") == b"v"
        assert await repo.ledger("kept").page("q") is not None
