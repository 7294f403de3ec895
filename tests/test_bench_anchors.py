"""The benchmarks' baselines: one raw SQLite anchor in the page writer's set-up, and
rounds whose first side turns."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest

from bench import common, daemon, ingest, reads
from ledgerd.store.sqlite.db import PAGE_SIZE


@pytest.mark.parametrize("shape", sorted(common.KV_TABLES))
def test_the_raw_anchor_has_the_page_writers_settings(tmp_path: Path, shape: str) -> None:
    path = tmp_path / "raw.sqlite"
    rows = [(b"k%05d" % i, b"v" * 100) for i in range(2500)]
    assert common.raw_kv_load(path, rows[::-1], 1000, shape) > 0
    db = common.raw_kv(path, shape)  # opens what is there
    try:
        assert db.execute("PRAGMA page_size").fetchone()[0] == PAGE_SIZE
        assert db.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
        assert db.execute("PRAGMA synchronous").fetchone()[0] == 1  # NORMAL
        (sql,) = db.execute("SELECT sql FROM sqlite_master WHERE name = 'kv'").fetchone()
        assert ("WITHOUT ROWID" in sql) == (shape == "without_rowid")
        seconds, n = common.raw_kv_scan(db)
        assert n == len(rows) and seconds >= 0
    finally:
        db.close()


def test_a_scan_of_the_without_rowid_table_reads_the_table_alone(tmp_path: Path) -> None:
    """The anchor a scan is compared with reads rows in key order straight through, not
    through an index and then the table."""
    db = common.raw_kv(tmp_path / "raw.sqlite")
    plan = " ".join(
        str(row[-1])
        for row in db.execute("EXPLAIN QUERY PLAN SELECT key, value FROM kv ORDER BY key")
    )
    db.close()
    assert "SCAN kv" in plan and "INDEX" not in plan.replace("PRIMARY KEY", ""), plan


@pytest.mark.parametrize(
    ("order", "sides"),
    [(daemon._order, daemon.SIDES), (ingest._order, ingest.SIDES)],
)
def test_each_side_goes_first_in_turn(
    order: Callable[[int], tuple[str, ...]], sides: tuple[str, ...]
) -> None:
    firsts = [order(r)[0] for r in range(len(sides))]
    assert sorted(firsts) == sorted(sides)
    for r in range(2 * len(sides)):
        assert sorted(order(r)) == sorted(sides)


def test_reads_compares_with_the_faster_raw_table() -> None:
    warm = [
        {"ours": {"scan_s": 2.0}, "rowid": {"scan_s": 1.0}, "without_rowid": {"scan_s": 0.4}},
        {"ours": {"scan_s": 2.2}, "rowid": {"scan_s": 1.1}, "without_rowid": {"scan_s": 0.5}},
        {"ours": {"scan_s": 1.8}, "rowid": {"scan_s": 0.3}, "without_rowid": {"scan_s": 0.45}},
    ]
    got = reads._warm_ratio(warm, "scan_s")
    assert got["anchor"] == "without_rowid"
    assert got["rounds"] == [5.0, 4.4, 4.0] and got["median"] == 4.4
