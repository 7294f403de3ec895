"""SIGKILL a child changing documents: after restart, documents and indexes agree."""

from __future__ import annotations

import asyncio
import contextlib
import random
import signal
import sys
from pathlib import Path

import pytest

from ledgerd.store import DocumentStore, Repository

ROOT = Path(__file__).resolve().parents[2]


async def _run_and_kill(data: Path, seed: int, lines_before_kill: int) -> list[str]:
    proc = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "tests.store.docs_crash_child",
        str(data),
        str(seed),
        cwd=ROOT,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    assert proc.stdout is not None
    seen: list[str] = []
    try:
        while len(seen) < lines_before_kill:
            line = await asyncio.wait_for(proc.stdout.readline(), 60)
            if not line:
                err = await proc.stderr.read() if proc.stderr else b""
                pytest.fail(f"child exited early: {err.decode()[-2000:]}")
            seen.append(line.decode().strip())
    finally:
        if proc.returncode is None:
            with contextlib.suppress(ProcessLookupError):
                proc.send_signal(signal.SIGKILL)
        await proc.wait()
    rest = await proc.stdout.read()  # acknowledged before the kill too
    seen.extend(x for x in rest.decode().splitlines() if x.strip())
    return seen


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
