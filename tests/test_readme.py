"""The README's runnable examples: every Python block marked ``<!-- example -->`` runs,
as it is, in a fresh process in a temporary directory (its ``./data``), and passes
its own asserts."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

README = Path(__file__).resolve().parent.parent / "README.md"
_MARKED = re.compile(r"<!-- example -->\n```python\n(.*?)\n```", re.DOTALL)


def examples() -> list[str]:
    return _MARKED.findall(README.read_text())


def test_the_data_modelling_section_has_its_examples() -> None:
    blocks = examples()
    assert len(blocks) >= 4
    text = README.read_text()
    assert text.count("<!-- example -->") == len(blocks), "a marker is not before a python block"
    for block in blocks:
        assert "asyncio.run(main())" in block and "assert " in block


@pytest.mark.parametrize("n", range(len(examples())))
def test_readme_example_runs_twice(n: int, tmp_path: Path) -> None:
    """Each example "runs as it is (it opens ``./data``)": a reader who runs one twice
    finds the first run's keys there, and the second run passes too."""
    script = tmp_path / f"example_{n}.py"
    script.write_text(examples()[n] + "\n")
    for run in ("first", "second"):
        done = subprocess.run(
            [sys.executable, str(script)], cwd=tmp_path, capture_output=True, text=True, timeout=120
        )
        assert done.returncode == 0, f"example {n}, {run} run:\n{done.stdout}\n{done.stderr}"
        assert (tmp_path / "data").is_dir()  # it used its own data dir, not the caller's
