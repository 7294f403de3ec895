"""Page eviction (store.repo.eviction): what may be evicted, restoring on the next use,
an eviction cut short, and the LRU and age policies."""

from __future__ import annotations

import asyncio
import logging
from pathlib import Path

import pytest

from ledgerd.store import (
    InvalidArgumentError,
    NotEvictableError,
    Page,
    PageHooks,
    PageUnavailableError,
    Repository,
)
from ledgerd.store.page import exchange
from ledgerd.store.page.hooks import NO_HOOKS
from ledgerd.store.repo import eviction
from ledgerd.store.repo.eviction import SUFFIX
from ledgerd.store.sqlite.schema import FORMAT_VERSION
from ledgerd.store.tree import commit
from tests.store.test_crash import run_and_kill
from tests.store.test_gc import upload_all
from tests.store.test_repository import held_close


class Bucket:
    """A restorer that keeps a copy of each page's entries, as the bucket would."""

    def __init__(self) -> None:
        self.pages: dict[bytes, dict[bytes, bytes]] = {}
        self.restored: list[bytes] = []
        self.offline = False

    async def keep(self, page: Page) -> None:
        self.pages[page.id] = {e.key: await page.get(e.key) async for e in page.iter_entries()}
        await upload_all(page)

    async def restore_page(self, page: Page) -> bool:
        if self.offline:
            raise ConnectionError("the bucket is not reachable")
        if page.id not in self.pages:
            return False
        await page.write(list(self.pages[page.id].items()))
        await page.flush()
        await upload_all(page)  # (as an import would leave it: nothing to upload)
        self.restored.append(page.id)
        return True


async def synced_page(repo: Repository, bucket: Bucket, name: str) -> Path:
    page = await repo.ledger("l").page(name)
    await page.put(b"k", name.encode() * 100)
    await page.flush()
    await bucket.keep(page)
    await page.close()
    return repo.page_path(b"l", name.encode())


async def test_a_synced_page_is_evicted_and_comes_back_on_its_next_use(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    bucket = Bucket()
    caplog.set_level(logging.INFO, logger="ledgerd.store.repo.repository")
    async with await Repository.open(tmp_path, hooks=PageHooks(restorer=bucket)) as repo:
        path = await synced_page(repo, bucket, "p")
        assert await repo.evict(b"l", b"p") > 0
        assert not path.parent.exists() and repo.is_evicted(b"l", b"p")
        assert await repo.ledger("l").pages() == [b"p"]  # still listed
        bucket.offline = True
        # (the 503 message names the page and ledger as ledgerctl does, not as b'p')
        with pytest.raises(
            PageUnavailableError, match=r"^page p of ledger l was evicted .*not reachable"
        ):
            await repo.ledger("l").page("p")  # never an empty page
        assert repo.is_evicted(b"l", b"p") and not path.exists()
        bucket.offline = False
        page = await repo.ledger("l").page("p")
        assert await page.get(b"k") == b"p" * 100 and bucket.restored == [b"p"]
        assert not repo.is_evicted(b"l", b"p")
    logged = [r.getMessage() for r in caplog.records]
    assert any(m.startswith("page p of ledger l evicted (") for m in logged), logged
    assert "page p of ledger l restored after its eviction" in logged, logged
    assert not [m for m in logged if "b'" in m], logged
    async with await Repository.open(tmp_path) as repo:  # recorded: not evicted now
        assert await (await repo.ledger("l").page("p")).get(b"k") == b"p" * 100


async def test_without_a_restorer_an_evicted_page_is_unavailable(tmp_path: Path) -> None:
    bucket = Bucket()
    async with await Repository.open(tmp_path, hooks=PageHooks(restorer=bucket)) as repo:
        await synced_page(repo, bucket, "p")
        await repo.evict(b"l", b"p")
    async with await Repository.open(tmp_path) as repo:
        assert repo.page_exists(b"l", b"p")
        with pytest.raises(PageUnavailableError, match="no cloud"):
            await repo.ledger("l").page("p")


async def test_what_is_not_synced_is_not_evicted(tmp_path: Path) -> None:
    async with await Repository.open(tmp_path) as repo:
        page = await repo.ledger("l").page("p")
        await page.put(b"k", b"v" * 100)
        await page.flush()
        with pytest.raises(NotEvictableError, match="in use"), page.lease():
            await repo.evict(b"l", b"p")
        with pytest.raises(
            NotEvictableError,
            match=r"^page p of ledger l cannot be evicted: nothing could restore it",
        ):
            await repo.evict(b"l", b"p")  # closed (it was idle), not uploaded, and no cloud
        repo.hooks = PageHooks(restorer=_never_restores)
        with pytest.raises(NotEvictableError, match="writes not uploaded"):
            await repo.evict(b"l", b"p")  # with a cloud: not uploaded yet
        repo.hooks = NO_HOOKS
        page = await repo.ledger("l").page("p")
        assert await page.get(b"k") == b"v" * 100
        await upload_all(page)
        with pytest.raises(NotEvictableError, match="nothing could restore it"):
            await repo.evict(b"l", b"p")  # synced, but this repository has no restorer
        # An empty page that never synced is evicted, and starts empty again.
        await (await repo.ledger("l").page("empty")).close()
        await repo.evict(b"l", b"empty")
        assert not await (await repo.ledger("l").page("empty")).contains(b"k")


async def test_an_eviction_cut_short_is_finished_at_the_next_open(tmp_path: Path) -> None:
    bucket = Bucket()
    async with await Repository.open(tmp_path, hooks=PageHooks(restorer=bucket)) as repo:
        path = await synced_page(repo, bucket, "p")
    path.parent.rename(path.parent.with_name(path.parent.name + SUFFIX))  # step 1 only
    async with await Repository.open(tmp_path, hooks=PageHooks(restorer=bucket)) as repo:
        assert repo.is_evicted(b"l", b"p")
        assert not any(p.name.endswith(SUFFIX) for p in path.parent.parent.iterdir())
        assert await (await repo.ledger("l").page("p")).get(b"k") == b"p" * 100


class _Stalls(Bucket):
    """A bucket whose restore waits until it is released (a slow download)."""

    def __init__(self) -> None:
        super().__init__()
        self.started = asyncio.Event()
        self.release = asyncio.Event()
        self.page: Page | None = None

    async def restore_page(self, page: Page) -> bool:
        self.page = page
        self.started.set()
        await self.release.wait()
        return await super().restore_page(page)


async def test_an_open_cancelled_while_restoring_leaves_no_page_open(tmp_path: Path) -> None:
    """A client that disconnects while its page is restored cancels the open: the page
    being restored is closed, not left open and unlisted, and the next use restores it."""
    bucket = _Stalls()
    async with await Repository.open(tmp_path, hooks=PageHooks(restorer=bucket)) as repo:
        bucket.release.set()
        await synced_page(repo, bucket, "p")
        await repo.evict(b"l", b"p")
        bucket.release.clear()
        opening = asyncio.create_task(repo.open_page(b"l", b"p"))
        await bucket.started.wait()
        opening.cancel()
        with pytest.raises(asyncio.CancelledError):
            await opening
        assert bucket.page is not None and bucket.page.closed
        assert repo.is_evicted(b"l", b"p")
        bucket.release.set()
        assert await (await repo.ledger("l").page("p")).get(b"k") == b"p" * 100


class _Halts(Bucket):
    """A bucket that restores into empty pages only (as a checkpoint goes only into a
    page that has nothing yet) and, while ``halt`` is set, stops halfway: part of the
    page stored, the rest never (a restore cut short by a cancel or a SIGKILL)."""

    def __init__(self) -> None:
        super().__init__()
        self.halt = False
        self.halted = asyncio.Event()

    async def restore_page(self, page: Page) -> bool:
        if [h.id for h in await page.heads()] != [commit.FIRST.id]:
            raise InvalidArgumentError("a checkpoint goes only into a page that has nothing yet")
        if self.halt:
            await page.put(b"half", b"h" * 100)
            await page.flush()
            self.halted.set()
            await asyncio.Event().wait()
        return await super().restore_page(page)


async def test_a_restore_cut_short_is_done_again_from_the_start(tmp_path: Path) -> None:
    """What a restore cut short stored is discarded on the page's next use, cancelled or
    killed (the repository opened again): the restore starts from an empty page."""
    bucket = _Halts()
    async with await Repository.open(tmp_path, hooks=PageHooks(restorer=bucket)) as repo:
        for name in ("p", "q"):
            await synced_page(repo, bucket, name)
            await repo.evict(b"l", name.encode())
        bucket.halt = True
        for pid in (b"p", b"q"):
            bucket.halted.clear()
            opening = asyncio.create_task(repo.open_page(b"l", pid))
            await bucket.halted.wait()
            opening.cancel()
            with pytest.raises(asyncio.CancelledError):
                await opening
            assert repo.is_evicted(b"l", pid) and repo.page_path(b"l", pid).exists()
        bucket.halt = False
        page = await repo.ledger("l").page("p")  # cancelled: its next use restores it
        assert await page.get(b"k") == b"p" * 100 and not await page.contains(b"half")
    async with await Repository.open(tmp_path, hooks=PageHooks(restorer=bucket)) as repo:
        page = await repo.ledger("l").page("q")  # as after a SIGKILL mid-restore
        assert await page.get(b"k") == b"q" * 100 and not await page.contains(b"half")


async def test_lru_under_a_disk_budget_and_by_age(tmp_path: Path) -> None:
    bucket = Bucket()
    async with await Repository.open(tmp_path, hooks=PageHooks(restorer=bucket)) as repo:
        for i in range(6):
            await synced_page(repo, bucket, f"p{i}")
            await asyncio.gather(*repo._closing)  # closed_at recorded, in this order
        from ledgerd.store.repo.eviction import directory_bytes

        total = directory_bytes(tmp_path)
        one = directory_bytes(repo.page_path(b"l", b"p0").parent)
        assert await repo.evict_by_policy(disk_budget=total - 2 * one) >= 2
        evicted = [i for i in range(6) if repo.is_evicted(b"l", f"p{i}".encode())]
        assert evicted[:2] == [0, 1]  # least recently used first
        assert directory_bytes(tmp_path) <= total - 2 * one
        assert await repo.evict_by_policy(older_than=1e-9) == 6 - len(evicted)
        for i in range(6):  # every one comes back on use
            assert await (await repo.ledger("l").page(f"p{i}")).get(b"k") == b"p%d" % i * 100


async def test_sigkill_during_eviction_leaves_each_page_whole_or_evicted(tmp_path: Path) -> None:
    data = tmp_path / "data"
    lines = await run_and_kill(
        data,
        None,
        child="tests.store.evict_child",
        until=lambda seen: len([x for x in seen if x.startswith("E ")]) >= 15,
    )
    written = [x.split()[1] for x in lines if x.startswith("W ")]
    async with await Repository.open(data, hooks=PageHooks(restorer=_Missing())) as repo:
        for name in written:
            key = (b"l", name.encode())
            if repo.is_evicted(*key):
                assert not repo.page_path(*key).parent.exists()
                continue
            page = await repo.ledger("l").page(name)  # whole: it reads back
            assert await page.get(b"k") == name.encode() * 100
        assert not any(
            p.name.endswith(SUFFIX) for p in (data / str(FORMAT_VERSION) / "ledgers").rglob("*")
        )


class _Missing:
    async def restore_page(self, page: Page) -> bool:
        return False


__all__ = ["Bucket", "exchange"]


class _NeverRestores:
    async def restore_page(self, page: Page) -> bool:
        raise AssertionError("no page is restored here")


_never_restores = _NeverRestores()


async def test_an_eviction_waits_for_a_close_under_way(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A page closing (its when_closing hooks, such as the document layer storing its
    held index rows, still writing to its database) was taken for closed: its
    directory was set aside and deleted under the hooks. The eviction waits for the
    close to end."""
    bucket = Bucket()
    async with await Repository.open(tmp_path, hooks=PageHooks(restorer=bucket)) as repo:
        page = await repo.ledger("l").page("p")
        await page.put(b"k", b"v" * 100)
        await page.flush()
        await bucket.keep(page)
        gate, entered, hook_done = held_close(page)
        seen_at_aside: list[bool] = []
        aside, waits = asyncio.Event(), asyncio.Event()
        set_aside = eviction.set_aside

        def recording(path: Path) -> Path:
            seen_at_aside.append(bool(hook_done))
            aside.set()
            return set_aside(path)

        monkeypatch.setattr(eviction, "set_aside", recording)
        closing = asyncio.create_task(repo.close_idle(0))
        await entered.wait()
        close = page.close

        async def close_again() -> None:
            waits.set()
            await close()

        monkeypatch.setattr(page, "close", close_again)
        evicting = asyncio.create_task(repo.evict(b"l", b"p"))
        first = [asyncio.create_task(aside.wait()), asyncio.create_task(waits.wait())]
        await asyncio.wait(first, return_when=asyncio.FIRST_COMPLETED)
        gate.set()
        assert await evicting > 0
        await closing
        for t in first:
            t.cancel()
        assert seen_at_aside == [True]
        again = await repo.ledger("l").page("p")  # restored on its next use
        assert await again.get(b"k") == b"v" * 100
