"""The distribution: one ``ledgerd`` namespace at the top of site-packages.

Built from this checkout into a wheel (no network: the test extra brings a
setuptools that builds it) and installed into a directory of its own beside a
stand-in for python-daemon, which also installs a top-level ``daemon`` package.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_the_wheel_installs_only_ledgerd_beside_another_daemon_package(tmp_path: Path) -> None:
    # Built from a copy of what the wheel is made of: setuptools builds in the source
    # tree and rewrites its ledgerd.egg-info, the metadata that every daemon and
    # ledgerctl started from the checkout reads its version from, while the tests
    # running beside this one (pytest-xdist) start them.
    source = tmp_path / "source"
    source.mkdir()
    for name in ("pyproject.toml", "README.md"):
        shutil.copy2(ROOT / name, source / name)
    for layer in ("store", "sync", "daemon"):
        shutil.copytree(ROOT / layer, source / layer, ignore=shutil.ignore_patterns("__pycache__"))
    wheels = tmp_path / "wheels"
    subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q",
         "-w", str(wheels), str(source)],
        check=True,
        capture_output=True,
        env={**os.environ, "PIP_NO_INDEX": "1"},
    )  # fmt: skip
    (wheel,) = wheels.glob("ledgerd-*.whl")
    names = zipfile.ZipFile(wheel).namelist()
    top = {n.split("/")[0] for n in names}
    assert {t for t in top if not t.endswith(".dist-info")} == {"ledgerd"}, top
    assert "ledgerd/__init__.py" not in names  # a namespace package
    for layer in ("store", "sync", "daemon"):
        assert f"ledgerd/{layer}/py.typed" in names

    site = tmp_path / "site"
    (site / "daemon").mkdir(parents=True)  # what python-daemon puts there
    (site / "daemon" / "__init__.py").write_text("WHOSE = 'python-daemon'\n")
    subprocess.run(
        [sys.executable, "-m", "pip", "install", "--no-deps", "-q", "--target", str(site),
         str(wheel)],
        check=True,
        capture_output=True,
    )  # fmt: skip
    assert (site / "daemon" / "__init__.py").read_text() == "WHOSE = 'python-daemon'\n"
    probe = (
        "import daemon, ledgerd.daemon, ledgerd.store, ledgerd.sync; "
        "print(daemon.WHOSE, ledgerd.daemon.__version__)"
    )
    env = {**os.environ, "PYTHONPATH": str(site)}
    out = subprocess.run(
        [sys.executable, "-I", "-c", f"import sys; sys.path.insert(0, {str(site)!r}); {probe}"],
        capture_output=True,
        text=True,
        env=env,
        check=True,
    )
    assert out.stdout.split()[0] == "python-daemon"
    for cmd in ("ledgerd.daemon", "ledgerd.daemon.cli"):
        out = subprocess.run(
            [sys.executable, "-I", "-c",
             f"import sys, runpy; sys.path.insert(0, {str(site)!r}); sys.argv = ['x', '--version'];"
             f" runpy.run_module({cmd!r}, run_name='__main__')"],
            capture_output=True,
            text=True,
        )  # fmt: skip
        assert out.returncode == 0 and out.stdout.split()[1][0].isdigit(), out
