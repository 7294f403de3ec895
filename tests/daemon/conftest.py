"""Fixtures that run the real daemon as a subprocess on a temporary socket."""

from __future__ import annotations

import os
import shutil
import signal
import socket as sockets
import subprocess
import sys
import tempfile
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass, field
from pathlib import Path

import aiohttp
import pytest

ROOT = Path(__file__).resolve().parents[2]


@dataclass
class Daemon:
    proc: subprocess.Popen[bytes]
    socket: Path
    data: Path
    log: Path
    notify: sockets.socket
    notes: list[str] = field(default_factory=list)

    def stop(self, sig: int = signal.SIGTERM, timeout: float = 60) -> int:
        if self.proc.poll() is None:
            self.proc.send_signal(sig)
        code = self.proc.wait(timeout)
        self.notify.close()
        return code

    def wait_notify(self, word: str, timeout: float = 30) -> None:
        """Block until the daemon sent a systemd notification containing ``word``."""
        self.notify.settimeout(timeout)
        while not any(word in n for n in self.notes):
            try:
                self.notes.append(self.notify.recv(4096).decode())
            except TimeoutError:
                pytest.fail(f"no {word} from ledgerd in {timeout}s; log:\n{self.log_text()}")

    def log_text(self) -> str:
        return self.log.read_text(errors="replace")[-5000:]

    def peak_rss_mib(self) -> float:
        for line in Path(f"/proc/{self.proc.pid}/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) / 1024
        raise AssertionError("no VmHWM")

    def ledgerctl(
        self, *args: str, input: bytes | None = None, check: bool = False
    ) -> subprocess.CompletedProcess[bytes]:
        env = {**os.environ, "LEDGERD_SOCKET": str(self.socket)}
        return subprocess.run(
            [sys.executable, "-m", "daemon.cli", *args],
            input=input,
            capture_output=True,
            env=env,
            cwd=ROOT,
            timeout=120,
            check=check,
        )


def start_daemon(
    base: Path, *args: str, env: dict[str, str] | None = None, wait: bool = True
) -> Daemon:
    """Start ``ledgerd`` with its data and socket under ``base``; wait for READY=1."""
    base.mkdir(parents=True, exist_ok=True)
    notify = sockets.socket(sockets.AF_UNIX, sockets.SOCK_DGRAM)
    notify_path = base / "notify.sock"
    notify_path.unlink(missing_ok=True)
    notify.bind(str(notify_path))
    log = base / "ledgerd.log"
    full_env = {**os.environ, "NOTIFY_SOCKET": str(notify_path), **(env or {})}
    for var in ("LEDGERD_CONFIG", "LEDGERD_SOCKET", "LEDGERD_DATA_DIR"):
        if var not in (env or {}):
            full_env.pop(var, None)
    sock = base / "ledgerd.sock"
    with log.open("ab") as logf:
        proc = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "daemon",
                "--data-dir",
                str(base / "data"),
                "--socket",
                str(sock),
                "--log-level",
                "debug",
                *args,
            ],
            cwd=ROOT,
            env=full_env,
            stdout=logf,
            stderr=logf,
        )
    d = Daemon(proc, sock, base / "data", log, notify)
    if wait:
        d.wait_notify("READY=1")
    return d


@pytest.fixture
def short_tmp() -> Iterator[Path]:
    """A short directory (Unix socket paths are limited to 107 bytes)."""
    d = Path(tempfile.mkdtemp(prefix="ld-", dir="/tmp"))
    try:
        yield d
    finally:
        shutil.rmtree(d, ignore_errors=True)


@pytest.fixture
def daemon(short_tmp: Path) -> Iterator[Daemon]:
    d = start_daemon(short_tmp)
    try:
        yield d
    finally:
        code = d.stop()
        assert code == 0, f"ledgerd exited with {code}; log:\n{d.log_text()}"


@pytest.fixture
async def http(daemon: Daemon) -> AsyncIterator[aiohttp.ClientSession]:
    async with aiohttp.ClientSession(
        connector=aiohttp.UnixConnector(path=str(daemon.socket)), base_url="http://ledgerd"
    ) as s:
        yield s
