"""The daemon's and the clients' paths: the socket's directory, what is at the socket's
path, the data directory's lock and file modes, and path problems as one line.

These tests run as root, so they can make directories that belong to another uid.
"""

from __future__ import annotations

import os
import stat
import subprocess
import sys
from pathlib import Path

import pytest

from ledgerd.daemon.client import AsyncClient, Client, UnsafeSocketError
from ledgerd.store import Repository, RepositoryLockedError
from tests.daemon.conftest import ROOT, Daemon, start_daemon

OTHER_UID = 54321


def ledgerd(*args: str) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("LEDGERD_")}
    return subprocess.run(
        [sys.executable, "-m", "ledgerd.daemon", *args],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


def ledgerctl(socket: Path, *args: str) -> subprocess.CompletedProcess[bytes]:
    return subprocess.run(
        [sys.executable, "-m", "ledgerd.daemon.cli", "--socket", str(socket), *args],
        cwd=ROOT,
        capture_output=True,
        timeout=60,
        check=False,
    )


def one_line(out: subprocess.CompletedProcess[str], *words: str) -> str:
    """The run failed with exit status 2 and exactly one line naming ``words``."""
    assert out.returncode == 2, out
    lines = out.stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in out.stderr, out.stderr
    for w in words:
        assert w in lines[0], lines[0]
    return lines[0]


# -- the socket's directory ---------------------------------------------------------------


@pytest.mark.parametrize("mode", [0o777, 0o770, 0o1777])
def test_the_daemon_refuses_a_socket_directory_others_can_write(short_tmp: Path, mode: int) -> None:
    sockdir = short_tmp / "run"
    sockdir.mkdir()
    os.chmod(sockdir, mode)
    out = ledgerd("--data-dir", str(short_tmp / "data"), "--socket", str(sockdir / "s.sock"))
    one_line(out, "socket:", "writable by others", str(sockdir))
    assert not (short_tmp / "data").exists()  # nothing was created
    # A shared directory (sticky, like /tmp) is not to be chmod-ed: a private one in it.
    advice = f"mkdir -m 700 {sockdir}/ledgerd-" if mode & 0o1000 else f"chmod go-w {sockdir}"
    assert advice in out.stderr, out.stderr


def test_a_missing_socket_directory_under_an_unsafe_parent_is_refused_first(
    short_tmp: Path,
) -> None:
    """The daemon would create the socket's directory in a parent others can write
    (no sticky bit): refused before anything is created (found by the review)."""
    parent = short_tmp / "open"
    parent.mkdir()
    os.chmod(parent, 0o777)
    out = ledgerd("--data-dir", str(short_tmp / "data"), "--socket", str(parent / "sub" / "s"))
    one_line(out, "socket:", "writable by others", str(parent))
    assert not (short_tmp / "data").exists() and not (parent / "sub").exists()


def test_the_daemon_refuses_a_socket_directory_of_another_user(short_tmp: Path) -> None:
    sockdir = short_tmp / "run"
    sockdir.mkdir(mode=0o700)
    os.chown(sockdir, OTHER_UID, -1)
    out = ledgerd("--data-dir", str(short_tmp / "data"), "--socket", str(sockdir / "s.sock"))
    one_line(out, "socket:", f"belongs to uid {OTHER_UID}")
    # A directory above it that others can write without a sticky bit is as bad.
    os.chown(sockdir, 0, -1)
    os.chmod(short_tmp, 0o777)
    out = ledgerd("--data-dir", str(short_tmp / "data"), "--socket", str(sockdir / "s.sock"))
    one_line(out, "socket:", f"{short_tmp}, above the socket's directory", "no sticky bit")
    assert not (short_tmp / "data").exists()


def test_a_missing_socket_directory_is_created_0700_under_a_sticky_parent(
    short_tmp: Path,
) -> None:
    """Like /tmp/ledgerd-$UID under /tmp: the sticky parent is fine, the new directory
    is created private."""
    os.chmod(short_tmp, 0o1777)
    d = start_daemon(short_tmp / "base", "--socket", str(short_tmp / "mine" / "s.sock"))
    try:
        assert stat.S_IMODE((short_tmp / "mine").stat().st_mode) == 0o700
        with Client(short_tmp / "mine" / "s.sock") as c:
            assert c.status()["pid"] == d.proc.pid
    finally:
        assert d.stop() == 0


async def test_clients_refuse_a_socket_in_a_directory_others_can_write(daemon: Daemon) -> None:
    """Someone who can write the socket's directory could have replaced the socket:
    neither client connects, ledgerctl exits 2 with one line."""
    os.chmod(daemon.socket.parent, 0o777)
    try:
        async with AsyncClient(daemon.socket) as c:
            with pytest.raises(UnsafeSocketError, match="writable by others"):
                await c.status()
        with Client(daemon.socket) as bc, pytest.raises(UnsafeSocketError):
            bc.status()
        out = ledgerctl(daemon.socket, "put", "l", "p", "k", "secret")
        assert out.returncode == 2 and out.stdout == b""
        err = out.stderr.decode()
        assert err.startswith("ledgerctl: refusing to connect: ") and err.count("\n") == 1, err
    finally:
        os.chmod(daemon.socket.parent, 0o700)
    async with AsyncClient(daemon.socket) as c:
        assert await c.ledgers() == []  # the refused put sent nothing


# -- what is at the socket's path -----------------------------------------------------------


def test_a_socket_path_that_is_a_regular_file_is_not_deleted(short_tmp: Path) -> None:
    f = short_tmp / "precious.txt"
    f.write_bytes(b"keep me")
    out = ledgerd("--data-dir", str(short_tmp / "data"), "--socket", str(f))
    one_line(out, "socket:", "is not a socket")
    assert f.read_bytes() == b"keep me"
    link = short_tmp / "link.sock"
    link.symlink_to(f)
    out = ledgerd("--data-dir", str(short_tmp / "data"), "--socket", str(link))
    one_line(out, "socket:", "is not a socket")
    assert link.is_symlink() and f.read_bytes() == b"keep me"


def test_a_second_daemon_refused_on_the_socket_creates_nothing(
    daemon: Daemon, short_tmp: Path
) -> None:
    out = ledgerd("--data-dir", str(short_tmp / "new-data"), "--socket", str(daemon.socket))
    one_line(out, "another ledgerd is listening")
    assert not (short_tmp / "new-data").exists()


# -- path problems: one line each ----------------------------------------------------------


def test_path_problems_are_one_line(short_tmp: Path) -> None:
    sock = str(short_tmp / "s.sock")
    a_file = short_tmp / "file"
    a_file.write_bytes(b"x")
    one_line(ledgerd("--data-dir", "/proc/nope", "--socket", sock), "data_dir:", "/proc/nope")
    one_line(ledgerd("--data-dir", str(a_file), "--socket", sock), "data_dir:", "not a directory")
    one_line(
        ledgerd("--data-dir", str(short_tmp / "d"), "--socket", str(a_file / "x.sock")),
        "socket:",
    )
    missing = short_tmp / "missing" / "sub" / "x.sock"
    one_line(
        ledgerd("--data-dir", str(short_tmp / "d"), "--socket", str(missing)),
        "socket:",
        "does not exist",
    )
    assert not (short_tmp / "d").exists()


@pytest.mark.parametrize("url", ["file://relative/path", "file://mybucket/tmp/x"])
def test_a_file_url_with_a_host_is_refused(short_tmp: Path, url: str) -> None:
    """``file://relative/path`` is the host ``relative`` and the path ``/path``: refused,
    saying how to write a relative or home path, and no bucket is made anywhere."""
    sock, data = str(short_tmp / "s.sock"), str(short_tmp / "d")
    line = one_line(ledgerd("--data-dir", data, "--socket", sock, "--cloud", url), "cloud:")
    host, path = url[len("file://") :].split("/", 1)
    assert f"names the host '{host}'" in line
    assert f"file://$PWD/{host}/{path}" in line and "file://$HOME/" in line
    assert not (short_tmp / "d").exists()
    ok = ledgerd("--check-config", "--data-dir", data, "--cloud", "file://localhost/srv/b")
    assert ok.returncode == 0 and 'cloud = "file://localhost/srv/b"' in ok.stdout, ok


# -- the data directory -----------------------------------------------------------------


async def test_embedded_open_of_a_running_daemons_data_dir_is_refused(daemon: Daemon) -> None:
    with pytest.raises(RepositoryLockedError, match="in use"):
        await Repository.open(daemon.data)
    assert daemon.stop() == 0
    async with await Repository.open(daemon.data) as repo:  # free once the daemon stopped
        await (await repo.ledger("l").page("p")).put(b"k", b"v")
        with pytest.raises(RepositoryLockedError):  # and held while open
            await Repository.open(daemon.data)


def test_data_is_private_whatever_the_umask(short_tmp: Path) -> None:
    old = os.umask(0o022)
    try:
        d = start_daemon(short_tmp)
    finally:
        os.umask(old)
    try:
        with Client(d.socket) as c:
            c.put("l", "p", b"k", b"v")
            c.heads("l", "p")  # committed
        seen = []
        for path in [d.data, *d.data.rglob("*")]:
            mode = stat.S_IMODE(path.lstat().st_mode)
            seen.append(path.name)
            assert mode == (0o700 if path.is_dir() else 0o600), (path, oct(mode))
        assert {"page.sqlite", "page.sqlite-wal", "page_usage.sqlite", "ledgerd.lock"} <= set(seen)
    finally:
        assert d.stop() == 0
