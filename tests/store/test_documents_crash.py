"""SIGKILL a child changing documents: after restart, documents and indexes agree."""

from __future__ import annotations

import random
from pathlib import Path

import pytest

from ledgerd.store import DocumentStore, Repository
from tests.store.test_crash import run_and_kill

ROOT = Path(__file__).resolve().parents[2]


async def _run_and_kill(data: Path, seed: int, lines_before_kill: int) -> list[str]:
    return await run_and_kill(data, seed, lines_before_kill, "tests.store.docs_crash_child")


async def _crash_loop(tmp_path: Path, iterations: int) -> None:
    rng = random.Random(20261123)
    data = tmp_path / "data"
    acked: dict[str, str] = {}
    for it in range(iterations):
        lines = await _run_and_kill(data, it, rng.randint(2, 200))
        for line in lines:
            kind, *rest = line.split()
            if kind == "A":
                doc_id, rev = rest
                acked[doc_id] = max(acked.get(doc_id, ""), rev)
        async with await Repository.open(data) as repo:
            page = await repo.ledger("crash").page("docs")
            docs = await DocumentStore.open(page)
            every = []
            token = None
            while True:
                res = await docs.list_documents("c", limit=1000, token=token, include_deleted=True)
                every += res.items
                if (token := res.token) is None:
                    break
            revs = {d.id: d.rev for d in every}
            for doc_id, rev in acked.items():
                assert revs.get(doc_id, "") >= rev, f"iteration {it}: {doc_id} lost {rev}"
            for k in range(4):
                want = sorted(
                    (d.data["v"], d.id) for d in every if not d.deleted and d.data["k"] == k
                )
                got: list[str] = []
                qtoken = None
                while True:
                    q = await docs.query("c", "by_k", k, limit=1000, token=qtoken)
                    got += [d.id for d in q.items]
                    if (qtoken := q.token) is None:
                        break
                assert got == [i for _, i in want], f"iteration {it}"
            await docs.close()
    assert acked


async def test_sigkill_during_document_updates_leaves_indexes_agreeing(tmp_path: Path) -> None:
    await _crash_loop(tmp_path, 8)


@pytest.mark.slow
async def test_sigkill_during_document_updates_many_times(tmp_path: Path) -> None:
    await _crash_loop(tmp_path, 60)
