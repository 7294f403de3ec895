"""The project's own rules: ruff and mypy --strict are clean."""

from __future__ import annotations

import shutil
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def _run(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", *args], cwd=ROOT, capture_output=True, text=True, check=False
    )


def test_ruff_clean() -> None:
    out = _run("ruff", "check", ".")
    assert out.returncode == 0, out.stdout + out.stderr


def test_mypy_strict_clean() -> None:
    if shutil.which("mypy") is None and _run("mypy", "--version").returncode:
        pytest.fail("mypy is not installed; install the test extra: pip install -e '.[test]'")
    out = _run("mypy")  # the tests and benchmarks
    assert out.returncode == 0, out.stdout + out.stderr
    # The packages, as installed: this fails unless the editable install was made
    # with editable_mode=strict (the README's commands do), which mypy can follow.
    out = _run("mypy", *(f"--package=ledgerd.{p}" for p in ("store", "sync", "daemon")))
    assert out.returncode == 0, out.stdout + out.stderr


def test_layers_hold() -> None:
    """daemon -> sync -> store, and store's private modules stay inside it."""
    out = subprocess.run(
        [str(Path(sys.executable).with_name("lint-imports"))],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=False,
    )
    assert out.returncode == 0, out.stdout + out.stderr


def test_the_private_modules_contract_names_every_private_store_module() -> None:
    """The forbidden contract lists every module of store/ but the public ones, so a new
    module is private until it is named public here and in docs/architecture.md."""
    public = {"errors", "page.hooks", "tree.merge", "page.exchange", "pieces.digest"}
    public |= {"keys.tuple", "keys.subspace", "page.check", "page.gc", "tree.dots"}
    store = ROOT / "store"
    private = {
        "ledgerd.store." + path.relative_to(store).with_suffix("").as_posix().replace("/", ".")
        for path in store.rglob("*.py")
        if path.name != "__init__.py"
    } - {f"ledgerd.store.{m}" for m in public}
    contracts = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["importlinter"]
    (contract,) = [
        c
        for c in contracts["contracts"]
        if c["name"] == "store's private modules stay inside store"
    ]
    assert set(contract["forbidden_modules"]) == private
