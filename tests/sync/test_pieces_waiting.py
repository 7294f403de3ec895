"""Value pieces that wait for their entries (an upload larger than a pack spreads its
pieces over packs before the one with its writes), when packs are imported out of
order: a pack's GET failed and was retried after later packs were in."""

from __future__ import annotations

from pathlib import Path

from ledgerd.store import Repository
from ledgerd.store.page import exchange as ex
from ledgerd.sync.download import _import_marks

DEVICE = "ab" * 16


async def test_a_pack_with_writes_ends_only_the_waits_below_it(tmp_path: Path) -> None:
    """Pieces-only packs 10 and 17 are in; the writes of 10 come with 13, those of 17
    with 18. Importing 13 ended the wait of both, so garbage collection freed 17's
    pieces and 18 waited for good for a value that was nowhere (sim seed 512)."""
    async with await Repository.open(tmp_path) as repo:
        page = await repo.ledger("l").page("p")
        name = f"{ex.PIECES_WAITING}{DEVICE}"

        async def imported(seq: int, writes: bool) -> list[int]:
            for n, value in await _import_marks(page, DEVICE, seq, writes):
                await ex.set_sync_value(page, n, value)
            return ex.waiting_seqs(await ex.sync_value(page, name))

        assert await imported(17, writes=False) == [17]
        assert await imported(10, writes=False) == [10, 17]
        assert await imported(13, writes=True) == [17]
        assert await ex.sync_value(page, f"imported/{DEVICE}") == b"17"
        assert await imported(18, writes=True) == []
        assert await ex.sync_value(page, name) == b"0"  # what garbage collection reads


def test_the_row_reads_as_it_was_written_and_an_odd_one_keeps_the_pieces() -> None:
    assert ex.waiting_seqs(None) == [] and ex.waiting_seqs(b"0") == []
    assert ex.waiting_seqs(b"17") == [17]  # (a row of one, as ledgerd wrote them before)
    assert ex.waiting_seqs(ex.waiting_value([17, 10, 10])) == [10, 17]
    assert ex.waiting_seqs(b"x") == [1]
