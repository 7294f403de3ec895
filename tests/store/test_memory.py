"""Streaming a 256 MiB value in and out must not hold it in memory."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

MiB = 1024 * 1024
ROOT = Path(__file__).resolve().parents[2]


def test_streaming_256_mib_keeps_rss_flat(tmp_path: Path) -> None:
    size = 256 * MiB
    out = subprocess.run(
        [sys.executable, "-m", "tests.store.memory_child", str(tmp_path), str(size)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=240,
        check=False,
    )
    assert out.returncode == 0, out.stderr
    report = json.loads(out.stdout)
    assert report["same"] and report["read"] == size
    growth_mib = (report["peak_kib"] - report["baseline_kib"]) / 1024
    assert growth_mib < 64, report
