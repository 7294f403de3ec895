"""The runnable examples of the README and of the reference in ``docs/``: every Python block
marked ``<!-- example -->`` runs, as it is, in a fresh process in a temporary directory
(its ``./data``), and passes its own asserts. (Blocks marked ``<!-- example: daemon -->``
need a daemon: ``tests/daemon/test_readme_examples.py`` runs them.)"""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
README = ROOT / "README.md"
SOURCES = [README, *sorted((ROOT / "docs").glob("*.md"))]
"""Where examples are: the guide, and the reference pages."""
_MARKED = re.compile(r"<!-- example -->\n```python\n(.*?)\n```", re.DOTALL)


def examples_in(source: Path) -> list[str]:
    return _MARKED.findall(source.read_text())


def examples() -> list[tuple[str, str]]:
    """Every marked example: (its file, relative to the repository, and its code)."""
    return [
        (str(source.relative_to(ROOT)), code) for source in SOURCES for code in examples_in(source)
    ]


def test_the_data_modelling_section_has_its_examples() -> None:
    assert len(examples_in(ROOT / "docs" / "tuples.md")) >= 4
    assert examples_in(README), "the README's guide has no runnable example"
    for source in SOURCES:
        text = source.read_text()
        assert text.count("<!-- example -->") == len(examples_in(source)), (
            f"{source.name}: a marker is not before a python block"
        )
    for _, block in examples():
        assert "asyncio.run(main())" in block and "assert " in block


@pytest.mark.parametrize(
    ("source", "code"), examples(), ids=[f"{s}-{n}" for n, (s, _) in enumerate(examples())]
)
def test_readme_example_runs_twice(source: str, code: str, tmp_path: Path) -> None:
    """Each example "runs as it is (it opens ``./data``)": a reader who runs one twice
    finds the first run's keys there, and the second run passes too."""
    script = tmp_path / "example.py"
    script.write_text(code + "\n")
    for run in ("first", "second"):
        done = subprocess.run(
            [sys.executable, str(script)], cwd=tmp_path, capture_output=True, text=True, timeout=120
        )
        assert done.returncode == 0, f"{source}, {run} run:\n{done.stdout}\n{done.stderr}"
        assert (tmp_path / "data").is_dir()  # it used its own data dir, not the caller's
