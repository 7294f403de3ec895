"""Fixtures that run the real daemon as a subprocess on a temporary socket."""

from __future__ import annotations

import http.client as httpclient
import json
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
import boto3
import pytest
from hypothesis import HealthCheck, settings

from ledgerd.sync.testing import AWS_ENV, moto_server

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
            [sys.executable, "-m", "ledgerd.daemon.cli", *args],
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
                "ledgerd.daemon",
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


# -- several daemons sharing a bucket on moto's HTTP server ---------------------------


@pytest.fixture(scope="session")
def s3_endpoint() -> Iterator[str]:
    with moto_server() as url:
        yield url


AWS = AWS_ENV


@pytest.fixture
def bucket(s3_endpoint: str) -> str:
    name = f"ledgerd-{os.urandom(4).hex()}"
    boto3.client(
        "s3",
        endpoint_url=s3_endpoint,
        region_name="us-east-1",
        aws_access_key_id="testing",
        aws_secret_access_key="testing",
    ).create_bucket(Bucket=name)
    return name


def _start(base: Path, endpoint: str, bucket: str) -> Daemon:
    env = {**AWS, "LEDGERD_ENDPOINT_URL": endpoint, "LEDGERD_SYNC_INTERVAL": "60"}
    return start_daemon(base, "--cloud", f"s3://{bucket}/e2e", env=env)


def _sync(d: Daemon) -> None:
    out = d.ledgerctl("sync", "--timeout", "60")
    assert out.returncode == 0, out.stderr.decode()


def _ls(d: Daemon, ledger: str = "notes", page: str = "inbox") -> list[dict[str, str]]:
    out = d.ledgerctl("ls", ledger, page, "--json", check=True)
    return [json.loads(x) for x in out.stdout.decode().splitlines()]


@pytest.fixture
def three(short_tmp: Path, s3_endpoint: str, bucket: str) -> Iterator[list[Daemon]]:
    ds = [_start(short_tmp / n, s3_endpoint, bucket) for n in ("a", "b", "c")]
    try:
        yield ds
    finally:
        for d in ds:
            assert d.stop() == 0, d.log_text()


class UnixHTTPConnection(httpclient.HTTPConnection):
    """A blocking HTTP connection to the daemon's socket (the stateful tests drive it
    from hypothesis' synchronous rules)."""

    def __init__(self, path: Path) -> None:
        super().__init__("ledgerd", timeout=60)
        self.path = path

    def connect(self) -> None:
        self.sock = sockets.socket(sockets.AF_UNIX)
        self.sock.connect(str(self.path))


def stateful_settings(examples: int, steps: int = 30) -> settings:
    """Settings of a state machine driving the daemon: ``examples`` runs of ``steps``
    steps, more with ``LEDGERD_STATEFUL_EXAMPLES`` and ``LEDGERD_STATEFUL_STEPS``."""
    return settings(
        max_examples=int(os.environ.get("LEDGERD_STATEFUL_EXAMPLES", str(examples))),
        stateful_step_count=int(os.environ.get("LEDGERD_STATEFUL_STEPS", str(steps))),
        deadline=None,
        suppress_health_check=list(HealthCheck),
    )
