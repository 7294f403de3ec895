"""bench/RESULTS.md is what ``python -m bench.results`` writes from bench/results.json, and
the data file holds a row for every benchmark module."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from bench import results

ROOT = Path(__file__).resolve().parent.parent
NOT_BENCHMARKS = {"__init__", "common", "results", "sync_scale"}
"""Modules of bench/ that are no benchmark of their own (``sync_scale`` runs as
``bench.sync --only-scale``)."""


def test_the_checked_in_table_is_what_the_generator_writes() -> None:
    expected = results.render(*results.load(results.DATA))
    assert results.OUT.read_text() == expected, "run: python -m bench.results"


def test_check_mode_agrees(tmp_path: Path) -> None:
    done = subprocess.run(
        [sys.executable, "-m", "bench.results", "--check"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr
    stale = tmp_path / "RESULTS.md"
    stale.write_text("# old\n")
    assert results.main(["--check", "--out", str(stale)]) == 1
    assert results.main(["--out", str(stale)]) == 0
    assert stale.read_text() == results.OUT.read_text()


def test_help() -> None:
    done = subprocess.run(
        [sys.executable, "-m", "bench.results", "--help"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0 and "--check" in done.stdout


def test_every_benchmark_has_a_row() -> None:
    _, rows = results.load(results.DATA)
    commands = " ".join(r.command for r in rows)
    modules = {p.stem for p in (ROOT / "bench").glob("*.py")} - NOT_BENCHMARKS
    assert modules, "no benchmark found"
    for module in sorted(modules):
        assert f"python -m bench.{module}" in commands, f"bench.{module} has no row"
    for wanted in (
        "python -m bench.sim --histories 10000 --seed-start 0 --jobs 2",
        "python -m bench.daemons --run same-keys",
        "python -m bench.daemons --run life --steps 200",
    ):
        assert wanted in [r.command for r in rows], wanted


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"met": "maybe"}, "'met' is 'maybe'"),
        ({"figure": ""}, "'figure' is empty"),
        ({"colour": "red"}, "unknown fields colour"),
        ({"target": 3}, "'target' must be a string"),
    ],
)
def test_bad_data_is_refused(tmp_path: Path, change: dict[str, object], message: str) -> None:
    row = {"name": "n", "what": "w", "command": "python -m bench.x", "figure": "1", "met": "yes"}
    data = tmp_path / "results.json"
    data.write_text(json.dumps({"machine": "m", "benchmarks": [{**row, **change}]}))
    with pytest.raises(results.ResultsError, match=message):
        results.load(data)
    assert results.main(["--data", str(data), "--out", str(tmp_path / "out.md")]) == 2
    assert not (tmp_path / "out.md").exists()


def test_a_name_used_twice_is_refused(tmp_path: Path) -> None:
    row = {"name": "n", "what": "w", "command": "c", "figure": "1", "met": "n/a"}
    data = tmp_path / "results.json"
    data.write_text(json.dumps({"machine": "m", "benchmarks": [row, row]}))
    with pytest.raises(results.ResultsError, match="used twice: n"):
        results.load(data)


def test_a_pipe_in_a_cell_does_not_break_the_table() -> None:
    row = results.Benchmark("a|b", "w", "python -m bench.x", "1 | 2", "", "", "yes", "")
    table = results.render("m", [row])
    line = next(ln for ln in table.splitlines() if ln.startswith("| **a"))
    assert line.count(" | ") == 5
