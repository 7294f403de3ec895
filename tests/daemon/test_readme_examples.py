"""The README's examples that need a daemon (marked ``<!-- example: daemon -->``, which
``tests/test_readme.py`` leaves out): each runs as it is, in a fresh process, against
a real daemon found through ``$LEDGERD_SOCKET``, and passes its own asserts."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from tests.daemon.conftest import Daemon

README = Path(__file__).resolve().parents[2] / "README.md"
_MARKED = re.compile(r"<!-- example: daemon -->\n```python\n(.*?)\n```", re.DOTALL)


def examples() -> list[str]:
    return _MARKED.findall(README.read_text())


def test_the_readme_has_daemon_examples() -> None:
    blocks = examples()
    assert blocks and README.read_text().count("<!-- example: daemon -->") == len(blocks)
    for block in blocks:
        assert "asyncio.run(main())" in block and "assert " in block


@pytest.mark.parametrize("n", range(len(examples())))
def test_readme_daemon_example_runs(n: int, daemon: Daemon, tmp_path: Path) -> None:
    script = tmp_path / f"example_{n}.py"
    script.write_text(examples()[n] + "\n")
    env = {**os.environ, "LEDGERD_SOCKET": str(daemon.socket)}
    done = subprocess.run(
        [sys.executable, str(script)],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, f"example {n} failed:\n{done.stdout}\n{done.stderr}"
