"""What a page gives to sync: pending uploads, split into EAGER and LAZY pieces."""

from __future__ import annotations

import itertools
import random
from pathlib import Path
from typing import Any

import pytest

from ledgerd.store import Page, Priority, Repository, commit, exchange
from ledgerd.store.errors import CorruptObjectError
from ledgerd.store.schema import LOCAL


async def _local(page: Page) -> set[bytes]:
    rows = await page.db.read_all(f"SELECT digest FROM piece_status WHERE status = {LOCAL}")
    return {bytes(r[0]) for r in rows}


async def test_every_local_piece_is_listed_once_and_lazy_values_wait(tmp_path: Path) -> None:
    """LAZY values stay behind, also one that a later unsynced commit replaced."""
    async with await Repository.open(tmp_path) as repo:
        page = await repo.ledger("l").page("p")
        photo = random.Random(1).randbytes(200_000)
        replaced = random.Random(2).randbytes(200_000)
        await page.put(b"photo", photo, Priority.LAZY)
        await page.put(b"draft", replaced, Priority.LAZY)
        await page.flush()
        await page.put(b"draft", b"final", Priority.LAZY)  # a later commit replaces it
        await page.put(b"e", b"e" * 100)
        up = await exchange.pending_upload(page)
        assert len(up.commits) >= 2
        assert not set(up.eager) & set(up.lazy)
        assert set(up.eager) | set(up.lazy) == await _local(page)
        lazy = await page.objects.get_pieces(up.lazy)
        assert sum(map(len, lazy.values())) >= len(photo) + len(replaced)
        eager = await page.objects.get_pieces(up.eager)
        assert not [v for v in eager.values() if len(v) > 1000 and (v in photo or v in replaced)]


async def test_the_cost_of_an_upload_follows_the_change_not_the_commits(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Fifty commits of 100 new random keys each, after an upload of 5,000: one
    diff from the last upload to the head, not one walk per commit (each of which
    would visit most leaves twice)."""
    rng = random.Random(3)
    async with await Repository.open(tmp_path) as repo:
        page = await repo.ledger("l").page("p")
        await page.write([(rng.randbytes(16), rng.randbytes(100)) for _ in range(5000)])
        up = await exchange.pending_upload(page)
        await exchange.mark_uploaded(page, [c.id for c in up.commits], up.eager + up.lazy)
        for _ in range(50):
            async with page.transaction() as txn:
                for _ in range(100):
                    await txn.put(rng.randbytes(16), rng.randbytes(100))
        loads = 0
        load = page.nodes.load

        async def counting(digest: bytes) -> Any:
            nonlocal loads
            loads += 1
            return await load(digest)

        monkeypatch.setattr(page.nodes, "load", counting)
        up = await exchange.pending_upload(page)
        assert len(up.commits) == 50
        assert 0 < loads <= 500, loads  # the head's tree has about 160 nodes


@pytest.mark.parametrize("entries", [20, 2000])  # verified inline, and on a thread
async def test_an_import_with_a_corrupt_piece_stores_nothing(tmp_path: Path, entries: int) -> None:
    rng = random.Random(3)
    async with (
        await Repository.open(tmp_path / "a") as ra,
        await Repository.open(tmp_path / "b") as rb,
    ):
        a = await ra.ledger("l").page("p")
        async with a.transaction() as txn:
            await txn.put_many((rng.randbytes(8), rng.randbytes(100)) for _ in range(entries))
        up = await exchange.pending_upload(a)
        pieces = await a.objects.get_pieces(up.eager)
        assert len(pieces) > entries  # a piece per value, and the tree's nodes
        commits = [c.data for c in up.commits]
        b = await rb.ledger("l").page("p")
        bad = dict(pieces)
        victim = sorted(bad)[len(bad) // 2]
        bad[victim] = bad[victim][:-1] + bytes([bad[victim][-1] ^ 1])
        with pytest.raises(CorruptObjectError, match="does not match its digest"):
            await exchange.import_remote(b, commits, bad, {})
        assert [e async for e in b.iter_entries()] == []
        assert await exchange.import_remote(b, commits, pieces, {})
        assert [e async for e in b.iter_entries()] == [e async for e in a.iter_entries()]


@pytest.mark.parametrize("own_uploaded", [False, True])
async def test_after_merging_an_import_the_upload_diffs_from_the_imported_parent(
    tmp_path: Path, own_uploaded: bool
) -> None:
    """A device with one commit of its own (uploaded or not) imports a large page
    and merges: what it uploads next is worked out from the imported head, not from
    the empty page nor from its own commit."""
    rng = random.Random(4)
    # A merge's parents are in id order: the device's own commit first is the case
    # that walked its history down to the empty page. Its id is random; so that it
    # comes first in one of a few attempts, the imported head's id must not be among
    # the smallest (it was, by chance, in about one run in seventy).
    for tries in itertools.count():
        async with await Repository.open(tmp_path / f"a{tries}") as ra:
            a = await ra.ledger("l").page("p")
            for _ in range(3):  # a longer history than the device's own commit
                async with a.transaction() as txn:
                    await txn.put_many((rng.randbytes(8), rng.randbytes(100)) for _ in range(1000))
            up = await exchange.pending_upload(a)
            pieces = await a.objects.get_pieces(up.eager)
            if a.head.id[0] >= 0x40:  # then each attempt below has a chance of 1/4 or more
                break
    for attempt in range(64):
        async with await Repository.open(tmp_path / f"b{attempt}") as rb:
            b = await rb.ledger("l").page("p")
            await b.put(b"mine", b"m%d" % attempt)
            await b.flush()
            if own_uploaded:
                own = await exchange.pending_upload(b)
                await exchange.mark_uploaded(b, [c.id for c in own.commits], own.eager)
            *_, imported = await exchange.import_remote(b, [c.data for c in up.commits], pieces, {})
            await b.merger.settle()
            assert len(await b.heads()) == 1 and imported.id in b.head.parents  # merged
            if b.head.parents[0] == imported.id:
                continue
            mine = await exchange.pending_upload(b)
            assert mine.base_root == imported.root
            # Its own commit's nodes and the merge's few new nodes; none of a's.
            assert len(mine.eager) < 20
            assert not set(mine.eager) & set(pieces)
            return
    raise AssertionError("no merge with the device's own commit first")


async def test_a_rejoin_refuses_a_checkpoint_whose_other_commits_are_not_older(
    tmp_path: Path,
) -> None:
    """A checkpoint's other commits are ancestors of its head, which the rejoin merges
    over: one as new as the head is a malformed checkpoint, refused with nothing
    stored (as :func:`exchange.import_checkpoint` refuses it)."""
    async with await Repository.open(tmp_path) as repo:
        page = await repo.ledger("l").page("p")
        await page.put(b"k", b"mine")
        await page.flush()
        head = page.head
        c = commit.make((head.id,), head.timestamp + 1, head.generation + 1, head.root, b"c")
        other = commit.make((head.id,), head.timestamp, c.generation, head.root, b"o")
        with pytest.raises(CorruptObjectError, match="not older than its head"):
            await exchange.rejoin(page, [c.data, other.data], {}, {}, [])
        assert page.head.id == head.id
        assert await page.get(b"k") == b"mine"
