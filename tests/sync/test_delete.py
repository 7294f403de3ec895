"""A page delete is a synced fact: other devices empty the page and leave it out of
their listings; a concurrent write merges with it like any concurrent write."""

from __future__ import annotations

from pathlib import Path

from ledgerd.sync.folder import FolderStore
from tests.sync.test_engine import Device, _keys, device


async def _exchange(*devices: Device) -> None:
    for _ in range(2):
        for d in devices:
            await d.engine.sync()


async def _shared_page(a: Device, b: Device) -> None:
    pa = await a.repo.ledger("l").page("p")
    await pa.write([(b"k0", b"a0"), (b"k1", b"a1")])
    await (await a.repo.ledger("l").page("other")).put(b"x", b"1")
    await _exchange(a, b)
    assert await b.repo.ledger("l").pages() == [b"other", b"p"]


async def test_a_delete_on_one_device_empties_and_hides_the_page_on_another(
    tmp_path: Path, bucket: FolderStore
) -> None:
    async with device(tmp_path / "a", bucket) as a, device(tmp_path / "b", bucket) as b:
        await _shared_page(a, b)
        for page in b.repo.open_pages():
            await page.close()  # B's copy closed: the import opens it, the listing reads rows
        await a.repo.delete_page("l", "p")
        await _exchange(a, b)
        assert await b.repo.ledger("l").pages() == [b"other"]
        pb = await b.repo.ledger("l").page("p")
        pa = await a.repo.ledger("l").page("p")
        assert pb.head.root == pa.head.root and pb.deleted
        assert await _keys(b.repo) == {}
        await a.repo.delete_ledger("l")
        await _exchange(a, b)
        assert await b.repo.ledgers() == [] and await a.repo.ledgers() == []
        # A write on B after the delete brings the page back, on A too.
        await pb.put(b"again", b"b")
        await _exchange(a, b)
        assert await _keys(a.repo) == {b"again": b"b"}
        assert await a.repo.ledger("l").pages() == [b"p"]


async def test_a_concurrent_write_merges_with_the_delete_by_last_one_wins(
    tmp_path: Path, bucket: FolderStore
) -> None:
    """Keys the delete removed and the other device changed concurrently: per key, the
    later write wins, as in any join (k0, which B wrote after the delete, stays; k1,
    which B wrote before it, goes); keys new on B survive the delete, as they do a
    clear; the page is back on both devices."""
    async with device(tmp_path / "a", bucket) as a, device(tmp_path / "b", bucket) as b:
        await _shared_page(a, b)
        pb = await b.repo.ledger("l").page("p")
        await pb.put(b"k1", b"b1 written before the delete")
        await pb.flush()
        await a.repo.delete_page("l", "p")  # later than B's first write
        await pb.write([(b"k0", b"b0 written after the delete"), (b"new", b"b")])
        await pb.flush()
        await _exchange(a, b)
        want = {b"k0": b"b0 written after the delete", b"new": b"b"}
        assert await _keys(a.repo) == await _keys(b.repo) == want
        pa = await a.repo.ledger("l").page("p")
        assert pa.head.root == pb.head.root and len(await pa.heads()) == 1
        assert await a.repo.ledger("l").pages() == await b.repo.ledger("l").pages()
        assert await a.repo.ledger("l").pages() == [b"other", b"p"]


async def test_a_concurrent_write_older_than_the_delete_loses_it(
    tmp_path: Path, bucket: FolderStore
) -> None:
    async with device(tmp_path / "a", bucket) as a, device(tmp_path / "b", bucket) as b:
        await _shared_page(a, b)
        pb = await b.repo.ledger("l").page("p")
        await pb.put(b"k1", b"changed on b")
        await pb.flush()
        await a.repo.delete_page("l", "p")  # the later commit: the delete wins k1
        await _exchange(a, b)
        assert await _keys(a.repo) == await _keys(b.repo) == {}
        assert await a.repo.ledger("l").pages() == await b.repo.ledger("l").pages() == [b"other"]
