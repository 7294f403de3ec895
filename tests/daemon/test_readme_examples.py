"""The examples of the README and of ``docs/`` that need a daemon (marked
``<!-- example: daemon -->``, which ``tests/test_readme.py`` leaves out): each runs as it
is, in a fresh process, against a real daemon found through ``$LEDGERD_SOCKET``, and
passes its own asserts."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from tests.daemon.conftest import Daemon

ROOT = Path(__file__).resolve().parents[2]
README = ROOT / "README.md"
SOURCES = [README, *sorted((ROOT / "docs").glob("*.md"))]
_MARKED = re.compile(r"<!-- example: daemon -->\n```python\n(.*?)\n```", re.DOTALL)


def examples_in(source: Path) -> list[str]:
    return _MARKED.findall(source.read_text())


def examples() -> list[tuple[str, str]]:
    return [
        (str(source.relative_to(ROOT)), code) for source in SOURCES for code in examples_in(source)
    ]


def test_the_readme_has_daemon_examples() -> None:
    assert examples_in(README), "the README's guide has no example of the client"
    for name in ("tuples.md", "merging.md", "python-api.md"):
        assert examples_in(ROOT / "docs" / name), f"docs/{name} lost its daemon example"
    for source in SOURCES:
        assert source.read_text().count("<!-- example: daemon -->") == len(examples_in(source))
    for _, block in examples():
        assert "assert " in block
        assert "asyncio.run(main())" in block or "with Client(" in block


@pytest.mark.parametrize(
    ("source", "code"), examples(), ids=[f"{s}-{n}" for n, (s, _) in enumerate(examples())]
)
def test_readme_daemon_example_runs(source: str, code: str, daemon: Daemon, tmp_path: Path) -> None:
    script = tmp_path / "example.py"
    script.write_text(code + "\n")
    env = {**os.environ, "LEDGERD_SOCKET": str(daemon.socket)}
    done = subprocess.run(
        [sys.executable, str(script)],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, f"{source} failed:\n{done.stdout}\n{done.stderr}"
