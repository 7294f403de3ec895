"""SIGKILL a writing child process at random moments; nothing acknowledged is lost."""

from __future__ import annotations

import asyncio
import contextlib
import random
import signal
import sqlite3
import sys
from collections.abc import Callable
from pathlib import Path

import pytest

from ledgerd.store import Repository
from ledgerd.store.repo.repository import encode_name
from ledgerd.store.sqlite.schema import FORMAT_VERSION

ROOT = Path(__file__).resolve().parents[2]


async def run_and_kill(
    data: Path,
    seed: int | None,
    lines_before_kill: int = 0,
    child: str = "tests.store.crash_child",
    *,
    until: Callable[[list[str]], bool] | None = None,
) -> list[str]:
    """Run ``python -m child DATA [SEED]``, SIGKILL it after it printed that many lines
    (or once ``until(lines so far)``), and return every line it printed (each an
    acknowledged event)."""
    done = until or (lambda seen: len(seen) >= lines_before_kill)
    args = [str(data)] if seed is None else [str(data), str(seed)]
    proc = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        child,
        *args,
        cwd=ROOT,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    assert proc.stdout is not None
    seen: list[str] = []
    try:
        while not done(seen):
            line = await asyncio.wait_for(proc.stdout.readline(), 60)
            if not line:
                err = await proc.stderr.read() if proc.stderr else b""
                pytest.fail(f"child exited early: {err.decode()[-2000:]}")
            seen.append(line.decode().strip())
    finally:
        if proc.returncode is None:  # not when it exited early (its error is reported)
            with contextlib.suppress(ProcessLookupError):
                proc.send_signal(signal.SIGKILL)
        await proc.wait()
    # Lines already in the pipe were acknowledged before the kill too.
    rest = await proc.stdout.read()
    seen.extend(x for x in rest.decode().splitlines() if x.strip())
    return seen


async def _crash_loop(tmp_path: Path, iterations: int) -> None:
    rng = random.Random(20261122)
    data = tmp_path / "data"
    acked: set[bytes] = set()
    begun: set[str] = set()
    committed: set[str] = set()
    db_file = (
        data
        / str(FORMAT_VERSION)
        / "ledgers"
        / encode_name(b"crash")
        / encode_name(b"page")
        / "page.sqlite"
    )
    for it in range(iterations):
        lines = await run_and_kill(data, it, rng.randint(2, 120))
        for line in lines:
            kind, _, rest = line.partition(" ")
            if kind == "P":
                acked.add(rest.encode())
            elif kind == "B":
                begun.add(rest)
            elif kind == "C":
                committed.add(rest)
        # The file as the crash left it must be a sound database.
        conn = sqlite3.connect(db_file)
        try:
            assert conn.execute("PRAGMA integrity_check").fetchone()[0] == "ok"
        finally:
            conn.close()
        async with await Repository.open(data) as repo:
            page = await repo.ledger("crash").page("page")
            keys = set()
            async for e in page.iter_entries():
                keys.add(e.key)
            missing = acked - keys
            assert not missing, f"iteration {it}: acknowledged writes lost: {sorted(missing)[:5]}"
            txn_keys: dict[str, set[bytes]] = {}
            for k in keys:
                if k.startswith(b"t/"):
                    txn_keys.setdefault(k.split(b"/")[1].decode(), set()).add(k)
            for tid, present in txn_keys.items():
                assert tid in begun, f"iteration {it}: uncommitted transaction {tid} is visible"
                count = int(tid.split(".")[2])
                assert len(present) == count, f"transaction {tid} is partly visible"
            for tid in committed:
                assert tid in txn_keys, f"iteration {it}: committed transaction {tid} lost"
            assert len(await page.heads()) == 1
            for k in rng.sample(sorted(acked), min(20, len(acked))):
                await page.get(k)  # values are readable and verified
            integrity = await page.db.read_all("PRAGMA integrity_check")
            assert integrity[0][0] == "ok"
            assert not await page.db.read_all("SELECT 1 FROM journals")
    assert acked and committed


async def test_sigkill_at_random_moments_loses_nothing_acknowledged(tmp_path: Path) -> None:
    await _crash_loop(tmp_path, 20)


@pytest.mark.slow
async def test_sigkill_many_times(tmp_path: Path) -> None:
    await _crash_loop(tmp_path, 100)


async def test_an_acknowledged_write_of_the_empty_key_survives_a_crash(tmp_path: Path) -> None:
    # The empty key is a key like any other (written, listed, synced), but the recovery of
    # a crash's implicit journal took it for damage and left it out: acknowledged, lost.
    code = (
        "import asyncio, os, signal, sys\n"
        "from pathlib import Path\n"
        "from ledgerd.store import Repository\n"
        "from ledgerd.store.page import writer\n"
        "writer.COMMIT_DELAY = 3600.0  # nothing is committed before the kill\n"
        "async def main():\n"
        "    repo = await Repository.open(Path(sys.argv[1]))\n"
        "    page = await repo.ledger('l').page('p')\n"
        "    await page.put(b'', b'empty')\n"
        "    await page.put(b'k', b'v')\n"
        "    print('acknowledged', flush=True)\n"
        "    os.kill(os.getpid(), signal.SIGKILL)\n"
        "asyncio.run(main())\n"
    )
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-c", code, str(tmp_path), cwd=ROOT, stdout=asyncio.subprocess.PIPE
    )
    out, _ = await proc.communicate()
    assert out == b"acknowledged\n" and proc.returncode == -signal.SIGKILL
    conn = sqlite3.connect(next(tmp_path.glob(f"{FORMAT_VERSION}/ledgers/*/*/page.sqlite")))
    try:  # the writes were still in the journal: recovery is what this tests
        assert conn.execute("SELECT count(*) FROM journal_entries").fetchone()[0] == 2
    finally:
        conn.close()
    async with await Repository.open(tmp_path) as repo:
        page = await repo.ledger("l").page("p")
        assert await page.get(b"k") == b"v"
        assert await page.get(b"") == b"empty"
