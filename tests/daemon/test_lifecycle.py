"""Start-up, configuration, systemd, the socket, peer credentials and SIGTERM."""

from __future__ import annotations

import asyncio
import gc
import grp
import os
import re
import resource
import signal
import socket
import stat
import subprocess
import sys
from pathlib import Path

import pytest

from ledgerd.daemon.client import AsyncClient, DaemonUnavailableError, LedgerError
from ledgerd.daemon.main import GC_YOUNG_THRESHOLD, SWITCH_INTERVAL_S, tune_gc, tune_threads
from tests.daemon.conftest import ROOT, Daemon, start_daemon


def _run_ledgerd(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    full = {k: v for k, v in os.environ.items() if not k.startswith("LEDGERD_")}
    return subprocess.run(
        [sys.executable, "-m", "ledgerd.daemon", *args],
        cwd=ROOT,
        env={**full, **(env or {})},
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


@pytest.mark.parametrize(
    ("args", "env", "key"),
    [
        (["--log-level", "loud"], {}, "log_level"),
        (["--cloud", "ftp://x"], {}, "cloud"),
        ([], {"LEDGERD_MAX_BATCH_BYTES": "-1"}, "max_batch_bytes"),
        ([], {"LEDGERD_DURABILITY": "sometimes"}, "durability"),
        ([], {"LEDGERD_ALLOWED_USERS": "no-such-user-xyz"}, "allowed_users"),
        (["--socket", "/tmp/" + "s" * 120], {}, "socket"),
        (["--config", "/nonexistent/ledgerd.toml"], {}, "config"),
    ],
)
def test_invalid_configuration_is_one_clear_line(
    short_tmp: Path, args: list[str], env: dict[str, str], key: str
) -> None:
    out = _run_ledgerd("--data-dir", str(short_tmp / "d"), *args, env=env)
    assert out.returncode == 2
    lines = out.stderr.strip().splitlines()
    assert len(lines) == 1 and key in lines[0] and "Traceback" not in out.stderr


def test_config_file_errors_name_the_key(short_tmp: Path) -> None:
    cfg = short_tmp / "c.toml"
    cfg.write_text('log_levl = "info"\n')
    out = _run_ledgerd("--config", str(cfg))
    assert out.returncode == 2 and "log_levl" in out.stderr
    cfg.write_text("log_level = [\n")
    out = _run_ledgerd("--config", str(cfg))
    assert out.returncode == 2 and "not valid TOML" in out.stderr


async def test_config_file_and_environment(short_tmp: Path) -> None:
    cfg = short_tmp / "c.toml"
    cfg.write_text(f'data_dir = "{short_tmp}/from-file"\nlog_level = "warning"\n')
    d = start_daemon(short_tmp / "run", "--config", str(cfg), env={"LEDGERD_LOG_LEVEL": "info"})
    try:
        async with AsyncClient(d.socket) as c:
            st = await c.status()
            # --data-dir from the fixture (a flag) wins over the file.
            assert st["data_dir"] == str(short_tmp / "run" / "data")
        assert "ready on" in d.log_text()  # info level came from the environment
    finally:
        assert d.stop() == 0


async def test_socket_is_0600_and_removed_on_exit(daemon: Daemon) -> None:
    mode = stat.S_IMODE(daemon.socket.stat().st_mode)
    assert mode == 0o600
    assert stat.S_ISSOCK(daemon.socket.stat().st_mode)
    assert daemon.stop() == 0
    assert not daemon.socket.exists()


async def test_socket_group_makes_it_0660(short_tmp: Path) -> None:
    group = grp.getgrgid(os.getgid()).gr_name
    d = start_daemon(short_tmp, env={"LEDGERD_SOCKET_GROUP": group})
    try:
        st = d.socket.stat()
        assert stat.S_IMODE(st.st_mode) == 0o660 and st.st_gid == os.getgid()
    finally:
        assert d.stop() == 0


async def test_peer_credentials_are_checked(short_tmp: Path) -> None:
    d = start_daemon(short_tmp, env={"LEDGERD_ALLOWED_USERS": "65534"})
    try:
        async with AsyncClient(d.socket) as c:
            with pytest.raises(LedgerError) as e:
                await c.status()
            assert e.value.status == 403 and e.value.code == "peer_refused"
            assert "not allowed" in str(e.value)
        out = d.ledgerctl("status")
        assert out.returncode == 4 and b"peer_refused" in out.stderr
    finally:
        assert d.stop() == 0
    d2 = start_daemon(short_tmp / "2", env={"LEDGERD_ALLOWED_USERS": str(os.getuid())})
    try:
        async with AsyncClient(d2.socket) as c:
            assert (await c.status())["pid"] == d2.proc.pid
    finally:
        assert d2.stop() == 0


async def test_one_daemon_per_data_dir(daemon: Daemon, short_tmp: Path) -> None:
    out = _run_ledgerd("--data-dir", str(daemon.data), "--socket", str(short_tmp / "other.sock"))
    assert out.returncode == 2 and "in use by another ledgerd" in out.stderr
    out = _run_ledgerd("--data-dir", str(short_tmp / "x"), "--socket", str(daemon.socket))
    assert out.returncode == 2 and "another ledgerd is listening" in out.stderr


async def test_systemd_notifications_and_watchdog(short_tmp: Path) -> None:
    d = start_daemon(short_tmp, env={"WATCHDOG_USEC": "200000"})
    try:
        assert any("READY=1" in n and "STATUS=serving" in n for n in d.notes)
        d.wait_notify("WATCHDOG=1")
    finally:
        d.proc.send_signal(signal.SIGTERM)
        d.wait_notify("STOPPING=1")
        # One SIGTERM only: a second one while draining exits at once (by design).
        assert d.proc.wait(60) == 0
        d.notify.close()


async def test_socket_activation(short_tmp: Path) -> None:
    path = short_tmp / "activated.sock"
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(str(path))
    listener.listen(16)
    notify = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    notify.bind(str(short_tmp / "n.sock"))
    env = {k: v for k, v in os.environ.items() if not k.startswith("LEDGERD_")}
    env.update(LISTEN_FDS="1", NOTIFY_SOCKET=str(short_tmp / "n.sock"))
    fd = listener.fileno()
    proc = subprocess.Popen(
        [
            "sh",
            "-c",
            f'exec env LISTEN_PID=$$ "{sys.executable}" -m ledgerd.daemon --data-dir '
            f'"{short_tmp}/data" --socket "{short_tmp}/unused.sock"',
        ],
        cwd=ROOT,
        env=env,
        pass_fds=(3,),
        preexec_fn=lambda: os.dup2(fd, 3),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )
    try:
        notify.settimeout(30)
        assert b"READY=1" in notify.recv(4096)
        async with AsyncClient(path) as c:
            await c.put("l", "p", b"k", b"via activation")
            assert await c.get("l", "p", b"k") == b"via activation"
        assert not (short_tmp / "unused.sock").exists()
    finally:
        proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=60)
        assert proc.returncode == 0, err.decode()[-3000:]
        listener.close()
        notify.close()


async def test_sigterm_during_write_storm_loses_no_acknowledged_write(short_tmp: Path) -> None:
    d = start_daemon(short_tmp)
    acked: set[bytes] = set()
    enough = asyncio.Event()

    async def writer(n: int) -> None:
        async with AsyncClient(d.socket) as c:
            i = 0
            while True:
                key = b"w%d/%06d" % (n, i)
                try:
                    if i % 5 == 4:
                        await c.batch("l", "p", puts=[(key + b"/%d" % j, b"v") for j in range(20)])
                        acked.update(key + b"/%d" % j for j in range(20))
                    else:
                        await c.put("l", "p", key, b"v" * (i % 300))
                        acked.add(key)
                except (LedgerError, DaemonUnavailableError, aiohttp_errors()):
                    return
                i += 1
                if len(acked) >= 1500:
                    enough.set()

    tasks = [asyncio.ensure_future(writer(n)) for n in range(8)]
    await asyncio.wait_for(enough.wait(), 120)
    d.proc.send_signal(signal.SIGTERM)
    await asyncio.gather(*tasks)
    assert await asyncio.to_thread(d.stop) == 0
    d2 = start_daemon(short_tmp)
    try:
        async with AsyncClient(d2.socket) as c:
            keys = {i.key async for i in c.entries("l", "p", values=False)}
        missing = acked - keys
        assert not missing, f"{len(missing)} acknowledged writes lost, e.g. {sorted(missing)[:3]}"
    finally:
        assert d2.stop() == 0


def aiohttp_errors() -> type[Exception]:
    import aiohttp

    return aiohttp.ClientError


async def test_idle_pages_are_closed_and_reopen_on_use(short_tmp: Path) -> None:
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (min(soft, 1024), hard))  # as under systemd
    try:
        d = start_daemon(short_tmp, env={"LEDGERD_PAGE_IDLE_SECONDS": "0.2"})
    finally:
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))
    try:
        # Open pages hold files: the daemon raised its soft limit towards the hard one.
        limits = Path(f"/proc/{d.proc.pid}/limits").read_text()
        line = next(ln for ln in limits.splitlines() if ln.startswith("Max open files"))
        daemon_soft = line[len("Max open files") :].split()[0]
        want = 65536 if hard == resource.RLIM_INFINITY else min(65536, hard)
        assert daemon_soft == "unlimited" or int(daemon_soft) >= want, limits
        async with AsyncClient(d.socket) as c:

            async def open_pages() -> set[str]:
                return {p["page_text"] for p in (await c.status())["open_pages"]}

            watch = await c.subscribe("l", "watched")  # a watcher holds its page open
            await c.put("l", "watched", b"k", b"w")
            await c.put("l", "plain", b"k", b"p")
            session = await c.open_session()  # a session holds only what is under way
            txn = await session.begin("l", "sess")
            await txn.put(b"k", b"s")
            await txn.commit()
            # (plain and sess may be closed already: they are idle after 0.2 s)
            assert "watched" in await open_pages()
            loop = asyncio.get_running_loop()
            deadline = loop.time() + 30
            while await open_pages() != {"watched"}:  # the daemon's idle check closes them
                assert loop.time() < deadline, d.log_text()
                await asyncio.sleep(0.05)
            await session.close()
            assert (await watch.__anext__()).changed[0].key == b"k"
            await watch.close()
            assert await c.get("l", "plain", b"k") == b"p"  # reopened on use
            assert "plain" in await open_pages()
    finally:
        assert d.stop() == 0, d.log_text()
    assert "idle pages" in d.log_text()


def test_the_daemon_collects_young_objects_less_often() -> None:
    before = gc.get_threshold()
    try:
        tune_gc()
        assert gc.get_threshold()[0] == GC_YOUNG_THRESHOLD
        assert gc.get_freeze_count() > 0  # what start-up made is left out of collections
    finally:
        gc.unfreeze()
        gc.set_threshold(*before)


def test_the_daemon_hands_the_gil_over_every_millisecond() -> None:
    before = sys.getswitchinterval()
    try:
        tune_threads()
        assert sys.getswitchinterval() == pytest.approx(SWITCH_INTERVAL_S)
        assert before > SWITCH_INTERVAL_S  # CPython's default is 5 ms
    finally:
        sys.setswitchinterval(before)


def test_log_lines_carry_their_time_and_requests_are_logged_at_debug(daemon: Daemon) -> None:
    """Not under journald, every line has a timestamp; at DEBUG (as the fixture runs
    the daemon), one access line per request."""
    assert daemon.ledgerctl("put", "notes", "inbox", "k", "v").returncode == 0
    daemon.stop()
    lines = [ln for ln in daemon.log_text().splitlines() if " ledgerd." in ln]
    assert lines and all(re.match(r"\d{4}-\d\d-\d\d \d\d:\d\d:\d\d", ln) for ln in lines), lines
    assert any(
        "ledgerd.daemon.access" in ln and "PUT /v1/ledgers/notes/pages/inbox/keys/k 204" in ln
        for ln in lines
    ), lines
