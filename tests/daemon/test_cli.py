"""``ledgerctl`` end to end: every command, run as a subprocess against the real daemon.

Most tests share one daemon (module scope) and work in a ledger of their own, so the
file stays fast; tests that need exact daemon-wide listings start a fresh one.
Nothing here sleeps: watchers are synchronized by writing sentinels until they show up.
"""

from __future__ import annotations

import base64
import contextlib
import errno
import json
import os
import random
import re
import select
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from ledgerd.daemon.client import Client, Name
from tests.daemon.conftest import ROOT, Daemon, start_daemon

Run = subprocess.CompletedProcess[bytes]
COMMIT_ID = re.compile(r"[0-9a-f]{64}")
MiB = 1024 * 1024


# -- fixtures and helpers ------------------------------------------------------------


def shared_daemon(env: dict[str, str] | None = None, prefix: str = "ld-cli-") -> Iterator[Daemon]:
    """One daemon for a module (with ``env``'s settings); each test uses its own
    ledger (see ``ledger``)."""
    base = Path(tempfile.mkdtemp(prefix=prefix, dir="/tmp"))
    d = start_daemon(base, env=env)
    try:
        yield d
    finally:
        code = d.stop()
        d.notify.close()
        log = d.log_text()
        shutil.rmtree(base, ignore_errors=True)
        assert code == 0, f"ledgerd exited with {code}; log:\n{log}"


@pytest.fixture(scope="module")
def shared() -> Iterator[Daemon]:
    yield from shared_daemon()


@pytest.fixture
def ledger(request: pytest.FixtureRequest) -> str:
    """A ledger name private to the running test."""
    return re.sub(r"[^A-Za-z0-9_-]", "_", request.node.name)


def ctl(d: Daemon, *args: str, input: bytes | None = None) -> bytes:
    """Run ``ledgerctl`` and expect success with nothing on stderr; returns stdout."""
    p = d.ledgerctl(*args, input=input)
    assert (p.returncode, p.stderr) == (0, b""), f"ledgerctl {args}: {p}"
    return p.stdout


def ctl_fails(d: Daemon, code: int, *args: str, input: bytes | None = None) -> str:
    """Run ``ledgerctl``, expect exit status ``code`` and no output; returns stderr."""
    p = d.ledgerctl(*args, input=input)
    assert p.returncode == code, f"ledgerctl {args}: {p}"
    assert p.stdout == b""
    err = p.stderr.decode()
    assert err.startswith("ledgerctl: ") and "Traceback" not in err, err
    return err


def ctl_all(d: Daemon, *commands: Sequence[str]) -> list[Run]:
    """Run independent ``ledgerctl`` commands concurrently (they are slow to start)."""
    with ThreadPoolExecutor(max_workers=len(commands)) as pool:
        return list(pool.map(lambda args: d.ledgerctl(*args), commands))


def outputs(runs: list[Run]) -> list[bytes]:
    for p in runs:
        assert (p.returncode, p.stderr) == (0, b""), p
    return [p.stdout for p in runs]


def cli_env(socket: Path | str) -> dict[str, str]:
    return {**os.environ, "LEDGERD_SOCKET": str(socket)}


def cli_cmd(*args: str) -> list[str]:
    return [sys.executable, "-m", "ledgerd.daemon.cli", *args]


def parse_json_lines(out: bytes) -> list[tuple[bytes, bytes, str]]:
    """``export`` output (or ``ls --json`` of small values) as (key, value, priority),
    checking the format."""
    rows = []
    for key, value, priority in parse_listing(out):
        assert isinstance(value, bytes), key
        rows.append((key, value, priority))
    return rows


def parse_listing(out: bytes) -> list[tuple[bytes, bytes | int, str]]:
    """``ls --json`` output: (key, value or, for a value too large to list, its size, priority)."""
    rows: list[tuple[bytes, bytes | int, str]] = []
    for line in out.decode().splitlines():
        doc = json.loads(line)
        assert list(doc)[:3] == ["key", "priority", "value"], line  # export's layout
        assert doc["priority"] in ("eager", "lazy")
        key = base64.b64decode(doc["key"], validate=True)
        if doc["value"] is None:
            assert set(doc) == {"key", "value", "priority", "size"}, line
            rows.append((key, int(doc["size"]), doc["priority"]))
        else:
            assert set(doc) == {"key", "value", "priority"}, line
            rows.append((key, base64.b64decode(doc["value"], validate=True), doc["priority"]))
    return rows


def json_line(key: bytes, value: bytes, priority: str = "eager") -> bytes:
    doc = {
        "key": base64.b64encode(key).decode(),
        "value": base64.b64encode(value).decode(),
        "priority": priority,
    }
    return json.dumps(doc).encode() + b"\n"


def seed(d: Daemon, ledger: Name, page: Name, entries: Sequence[tuple[bytes, bytes, str]]) -> None:
    """Write test data with the in-process client (cheap: no ledgerctl start-up)."""
    with Client(d.socket) as c:
        c.batch(ledger, page, entries)


def listing(d: Daemon, ledger: Name, page: Name) -> list[tuple[bytes, bytes, str]]:
    """The page's entries, read with the in-process client."""
    with Client(d.socket) as c:
        return [(i.key, c.get(ledger, page, i.key), i.priority) for i in c.entries(ledger, page)]


# -- status, ledgers, pages ----------------------------------------------------------


def test_status_ledgers_and_pages(daemon: Daemon) -> None:
    seed(daemon, "notes", "inbox", [(b"k", b"v", "eager")])
    seed(daemon, "notes", "work", [(b"k", b"v", "eager")])
    seed(daemon, "é", b"\x00\xff", [(b"k", b"v", "eager")])
    status_b, st_json, ledgers, pages, pages_hex = outputs(
        ctl_all(
            daemon,
            ["status"],
            ["status", "--json"],
            ["ledgers"],
            ["pages", "notes"],
            ["--hex", "pages", "c3a9"],
        )
    )
    status = status_b.decode().splitlines()
    assert re.fullmatch(rf"ledgerd \S+ \(pid {daemon.proc.pid}\), up \d+s", status[0]), status
    assert re.fullmatch(r"device   \S+", status[1])
    assert status[2:4] == [
        f"data     {daemon.data}",
        "cloud    off (sync is off: every page is local only)",
    ]
    page_lines = status[4:]
    # A page id that is not UTF-8 is shown in hex; names are padded to one width.
    assert sorted(page_lines) == [
        "page     notes/inbox  open",
        "page     notes/work   open",
        "page     é/hex:00ff   open",
    ]
    assert ledgers.decode() == "notes\né\n"
    assert pages == b"inbox\nwork\n"
    assert pages_hex == b"00ff\n"

    st = json.loads(st_json)
    assert st["pid"] == daemon.proc.pid
    assert st["data_dir"] == str(daemon.data)
    assert st["cloud"] is None
    assert isinstance(st["version"], str) and isinstance(st["uptime_s"], int | float)
    assert sorted(
        (base64.b64decode(p["ledger"]), base64.b64decode(p["page"]), p["page_text"], p["heads"])
        for p in st["open_pages"]
    ) == [
        (b"notes", b"inbox", "inbox", 1),
        (b"notes", b"work", "work", 1),
        ("é".encode(), b"\x00\xff", None, 1),
    ]


# -- put and get ---------------------------------------------------------------------


def test_put_and_get_every_way(shared: Daemon, ledger: str, tmp_path: Path) -> None:
    rng = random.Random(7)
    streamed = bytes(range(256)) + b"\x00\x00\r\n\x1a" + rng.randbytes(600_000) + b"\x00"
    on_disk = rng.randbytes(1_500_000)  # over the daemon's inline limit for listings
    src = tmp_path / "value.bin"
    src.write_bytes(on_disk)

    puts = [
        (["put", ledger, "p", "plain", "hello wörld"], None),
        (["put", ledger, "p", "stdin"], streamed),  # no VALUE: standard input, streamed
        (["put", "--file", str(src), ledger, "p", "file"], None),
        (["put", "--lazy", ledger, "p", "lazy", "later"], None),
    ]
    with ThreadPoolExecutor(len(puts)) as pool:
        outputs(list(pool.map(lambda a: shared.ledgerctl(*a[0], input=a[1]), puts)))

    out = tmp_path / "out.bin"
    get, get_o, ls_json = outputs(
        ctl_all(
            shared,
            ["get", ledger, "p", "stdin"],
            ["get", "-o", str(out), ledger, "p", "file"],
            ["ls", "--json", ledger, "p"],
        )
    )
    assert get == streamed  # byte-exact, NULs and all
    assert get_o == b"" and out.read_bytes() == on_disk
    assert sorted(tmp_path.iterdir()) == sorted([src, out])  # no partial download left
    assert parse_listing(ls_json) == [
        (b"file", len(on_disk), "eager"),  # over 1 MiB: its size, not fetched
        (b"lazy", b"later", "lazy"),
        (b"plain", "hello wörld".encode(), "eager"),
        (b"stdin", streamed, "eager"),
    ]


def test_put_of_a_small_file(shared: Daemon, ledger: str, tmp_path: Path) -> None:
    """The walk-through's `put --file` with a file of a few bytes (it printed a
    RuntimeError traceback and exited 1 after the value was stored)."""
    src = tmp_path / "note.txt"
    src.write_bytes(b"a small file\n")
    for n in range(3):  # into an open page too: its answer comes the soonest
        assert ctl(shared, "put", ledger, "p", f"note{n}", "--file", str(src)) == b""
        assert ctl(shared, "get", ledger, "p", f"note{n}") == b"a small file\n"


def test_put_of_a_pipe(shared: Daemon, ledger: str, tmp_path: Path) -> None:
    """`--file <(command)` names a pipe, not a regular file: it is streamed as standard
    input is (it was refused as 'no such file')."""
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    value = bytes(range(256)) * 2000

    def feed() -> None:
        with contextlib.suppress(BrokenPipeError), fifo.open("wb") as w:
            w.write(value)

    writer = threading.Thread(target=feed)
    writer.start()
    try:
        assert ctl(shared, "put", ledger, "p", "piped", "--file", str(fifo)) == b""
    finally:
        if writer.is_alive():  # unblock the writer if ledgerctl never opened the pipe
            with contextlib.suppress(OSError):
                os.close(os.open(fifo, os.O_RDONLY | os.O_NONBLOCK))
        writer.join(10)
    assert ctl(shared, "get", ledger, "p", "piped") == value


def test_get_of_an_absent_key_exits_1(shared: Daemon, ledger: str, tmp_path: Path) -> None:
    seed(shared, ledger, "p", [(b"here", b"v", "eager")])
    out = tmp_path / "out"
    runs = ctl_all(
        shared,
        ["get", ledger, "p", "absent"],
        ["get", "-o", str(out), ledger, "p", "absent"],
    )
    for p, named in zip(runs, [b"absent", b"absent"], strict=True):
        assert p.returncode == 1, p
        assert p.stdout == b""
        assert p.stderr.startswith(b"ledgerctl: ") and named in p.stderr, p
        assert b"Traceback" not in p.stderr
    assert list(tmp_path.iterdir()) == []  # neither the file nor a partial one


def test_local_path_problems_are_one_line(shared: Daemon, ledger: str, tmp_path: Path) -> None:
    seed(shared, ledger, "p", [(b"k", b"v", "eager")])
    missing = tmp_path / "missing" / "x"
    for args, says in [
        (["get", "-o", str(missing), ledger, "p", "k"], "does not exist"),
        (["get", "-o", str(tmp_path), ledger, "p", "k"], "is a directory"),
        (["import", ledger, "p", str(missing)], "No such file"),
        (["ls", "--at", "\udcff", ledger, "p"], "not a commit id"),
        (["ls", "--at", "", ledger, "p"], "not a commit id"),  # (it read the head)
        (["ls", "--socket", "", ledger, "p"], "the path is empty"),  # (the default socket)
    ]:
        err = ctl_fails(shared, 2, *args)
        assert says in err and err.count("\n") == 1, err
    assert list(tmp_path.iterdir()) == []


def test_arguments_that_are_not_utf8_are_raw_key_bytes(shared: Daemon, ledger: str) -> None:
    """argv bytes are the key's bytes (os.fsencode), as with --hex ff."""
    raw = os.fsdecode(b"\xff\xfek")  # what Python makes of those argv bytes
    ctl(shared, "put", ledger, "p", raw, os.fsdecode(b"v\xff"))
    assert listing(shared, ledger, "p") == [(b"\xff\xfek", b"v\xff", "eager")]
    assert ctl(shared, "get", ledger, "p", raw) == b"v\xff"
    assert ctl(shared, "--hex", "get", ledger.encode().hex(), "70", "fffe6b") == b"v\xff"
    assert (
        ctl(shared, "ls", ledger, "p", "--prefix", os.fsdecode(b"\xff")) == b"\\xff\\xfek\tv\\xff\n"
    )


# -- delete and clear ----------------------------------------------------------------


def test_delete_and_clear(shared: Daemon, ledger: str) -> None:
    seed(shared, ledger, "p", [(b"a", b"A", "eager"), (b"b", b"B", "eager"), (b"c", b"C", "eager")])
    seed(shared, ledger, "q", [(b"x", b"X", "eager"), (b"y", b"Y", "lazy")])
    outputs(ctl_all(shared, ["delete", ledger, "p", "b"], ["clear", ledger, "q"]))
    assert ctl(shared, "ls", ledger, "p") == b"a\tA\nc\tC\n"
    assert listing(shared, ledger, "q") == []
    with Client(shared.socket) as c:
        assert c.pages(ledger) == [b"p", b"q"]  # clearing empties a page, it does not drop it


# -- ls ------------------------------------------------------------------------------


def test_ls_text_format_and_ranges(shared: Daemon, ledger: str) -> None:
    entries = [
        (b"a/1", b"one"),
        (b"a/2", b"two"),
        (b"a/3", b"three"),
        (b"b/1", b"tab\there"),
        (b"b/2", b"line\nbreak\r"),
        (b"back\\slash", b"c:\\dir"),
        (b"c", "é ü".encode()),
    ]
    entries += [(b"n/%04d" % i, b"%d" % i) for i in range(1500)]  # more than one page of results
    seed(shared, ledger, "p", [(k, v, "lazy" if k == b"a/2" else "eager") for k, v in entries])
    whole, prefix, start_end, combined, ls_json = outputs(
        ctl_all(
            shared,
            ["ls", ledger, "p"],
            ["ls", ledger, "p", "--prefix", "a/"],
            ["ls", ledger, "p", "--start", "a/2", "--end", "b/2"],
            ["ls", ledger, "p", "--prefix", "n/", "--start", "n/0998", "--limit", "3"],
            ["ls", "--json", ledger, "p"],
        )
    )
    assert whole.decode().splitlines() == [
        "a/1\tone",
        "a/2\ttwo",
        "a/3\tthree",
        "b/1\ttab\\there",
        "b/2\tline\\nbreak\\r",
        "back\\\\slash\tc:\\\\dir",
        "c\té ü",
    ] + [f"n/{i:04d}\t{i}" for i in range(1500)]
    assert prefix == b"a/1\tone\na/2\ttwo\na/3\tthree\n"
    assert start_end == b"a/2\ttwo\na/3\tthree\nb/1\ttab\\there\n"  # the end is exclusive
    assert combined == b"n/0998\t998\nn/0999\t999\nn/1000\t1000\n"
    assert parse_json_lines(ls_json) == [
        (k, v, "lazy" if k == b"a/2" else "eager") for k, v in sorted(entries)
    ]


def test_ls_text_escapes_non_printable_bytes(shared: Daemon, ledger: str) -> None:
    seed(shared, ledger, "p", [(b"\x00\x01x", b"nul", "eager"), (b"y", b"\xff\x1b", "eager")])
    assert ctl(shared, "ls", ledger, "p") == b"\\x00\\x01x\tnul\ny\t\\xff\\x1b\n"


# -- hex mode ------------------------------------------------------------------------


def test_hex_mode(shared: Daemon, ledger: str) -> None:
    lh = ledger.encode().hex()  # page b"\x00", keys b"\x00\xff", b"\x01\x00", b"\xff"
    seed(
        shared,
        ledger,
        b"\x00",
        [(b"\x01\x00", b"\x00\xff\x00", "eager"), (b"\xff", b"L", "lazy"), (b"\xfe", b"", "eager")],
    )
    outputs(
        ctl_all(
            shared,
            ["--hex", "put", lh, "00", "00ff", "text value"],  # VALUE itself stays text
            ["--hex", "delete", lh, "00", "fe"],
        )
    )
    get, ls_hex, ls_range = outputs(
        ctl_all(
            shared,
            ["--hex", "get", lh, "00", "0100"],
            ["--hex", "ls", lh, "00"],
            ["--hex", "ls", lh, "00", "--prefix", "01", "--start", "0100", "--end", "ff"],
        )
    )
    assert get == b"\x00\xff\x00"
    assert ls_hex == b"00ff\t" + b"text value".hex().encode() + b"\n0100\t00ff00\nff\t4c\n"
    assert ls_range == b"0100\t00ff00\n"
    assert listing(shared, ledger, b"\x00") == [
        (b"\x00\xff", b"text value", "eager"),
        (b"\x01\x00", b"\x00\xff\x00", "eager"),
        (b"\xff", b"L", "lazy"),
    ]


# -- export and import ---------------------------------------------------------------


def test_import_counts_in_words(shared: Daemon, ledger: str) -> None:
    """``imported 1 entry``, not ``imported 1 entries``."""
    line = b'{"key":"aw==","priority":"eager","value":"dg=="}\n'
    p = shared.ledgerctl("import", ledger, "one", input=line)
    assert (p.returncode, p.stdout, p.stderr) == (0, b"", b"imported 1 entry\n"), p
    p = shared.ledgerctl("import", ledger, "two", input=line + line.replace(b"aw", b"bA"))
    assert (p.returncode, p.stdout, p.stderr) == (0, b"", b"imported 2 entries\n"), p
    assert shared.ledgerctl("get", ledger, "one", "k").stdout == b"v"


def test_export_import_round_trip(shared: Daemon, ledger: str, tmp_path: Path) -> None:
    rng = random.Random(3)
    seed(
        shared,
        ledger,
        "src",
        [(b"k%03d" % i, rng.randbytes(i), "lazy" if i % 3 == 0 else "eager") for i in range(300)]
        + [(b"\x00\xff\n\t", b"\x00bin\xff", "eager"), (b"empty", b"", "lazy")],
    )
    huge = tmp_path / "huge"
    huge.write_bytes(rng.randbytes(1_200_000))  # not inline in listings: fetched on its own
    with Client(shared.socket) as c:
        c.put(ledger, "src", b"huge", huge)

    env = cli_env(shared.socket)
    exporter = subprocess.Popen(
        cli_cmd("export", ledger, "src"), stdout=subprocess.PIPE, env=env, cwd=ROOT
    )
    assert exporter.stdout is not None
    with ThreadPoolExecutor(1) as pool:
        src_listing = pool.submit(ctl, shared, "export", ledger, "src")
        # A real pipe: ledgerctl export | ledgerctl import
        importer = subprocess.run(
            cli_cmd("import", ledger, "dst"),
            stdin=exporter.stdout,
            capture_output=True,
            env=env,
            cwd=ROOT,
            timeout=60,
        )
        exporter.stdout.close()
        assert exporter.wait(60) == 0
        src = src_listing.result()
    assert (importer.returncode, importer.stdout) == (0, b""), importer
    assert importer.stderr == b"imported 303 entries\n"

    dump = tmp_path / "dump.jsonl"
    dump.write_bytes(b"\n" + src + b"\n  \n")  # blank lines are skipped
    p = shared.ledgerctl("import", ledger, "from-file", str(dump))
    assert (p.returncode, p.stdout, p.stderr) == (0, b"", b"imported 303 entries\n"), p

    dst, from_file = outputs(
        ctl_all(shared, ["export", ledger, "dst"], ["export", ledger, "from-file"])
    )
    assert dst == src
    assert from_file == src
    rows = parse_json_lines(src)
    assert len(rows) == 303 and [r[0] for r in rows] == sorted(r[0] for r in rows)
    assert sum(r[2] == "lazy" for r in rows) == 101
    assert (b"huge", huge.read_bytes(), "eager") in rows


def test_export_is_one_commit_while_the_page_changes(shared: Daemon, ledger: str) -> None:
    # export listed the live page 100 entries a request: a key moved from the first
    # listing's range to the last one's while it ran was exported twice (and one moved
    # the other way, not at all): a copy that the page never held.
    with Client(shared.socket) as c:
        c.batch(ledger, "p", [(b"k%04d" % i, b"v" * 100, "eager") for i in range(3000)])
        env = {**os.environ, "LEDGERD_SOCKET": str(shared.socket)}
        proc = subprocess.Popen(
            [sys.executable, "-m", "ledgerd.daemon.cli", "export", ledger, "p"],
            stdout=subprocess.PIPE,
            env=env,
            cwd=ROOT,
        )
        assert proc.stdout is not None
        first = proc.stdout.readline()  # the first listing is read; the pipe holds it back
        c.batch(ledger, "p", [(b"z", b"moved")], deletes=[b"k0000"])  # one commit
        rest = proc.stdout.read()
        proc.stdout.close()
        assert proc.wait(60) == 0
    keys = [base64.b64decode(json.loads(line)["key"]) for line in [first, *rest.splitlines()]]
    assert len(keys) == 3000 and len(set(keys)) == 3000
    assert (b"k0000" in keys) != (b"z" in keys)


def test_import_rejects_a_malformed_line(shared: Daemon, ledger: str, tmp_path: Path) -> None:
    good = json_line(b"a", b"1") + b'{"key": "Yg==", "value": "Mg=="}\n'  # priority optional
    bad_file = tmp_path / "in.jsonl"
    bad_file.write_bytes(good + b'{"key": "%%%", "value": "YQ=="}\n' + good)
    cases = [
        (b"not json", "line 4:", "Expecting value"),
        (b'{"key": "YQ==", "value": "YQ==", "priority": "urgent"}', "line 4:", "urgent"),
        (None, "line 3:", ""),
    ]
    commands: list[tuple[list[str], bytes | None]] = [
        (["import", ledger, "p"], good + b"\n" + bad + b"\n" + good)
        for bad, _, _ in cases
        if bad is not None
    ] + [(["import", ledger, "p", str(bad_file)], None)]
    with ThreadPoolExecutor(len(commands)) as pool:
        runs = list(pool.map(lambda c: shared.ledgerctl(*c[0], input=c[1]), commands))
    for p, (_, where, why) in zip(runs, cases, strict=True):
        assert p.returncode == 2, p
        assert p.stdout == b""
        err = p.stderr.decode()
        assert err.startswith(f"ledgerctl: {where} not an entry in the 'ls --json' format"), err
        assert why in err and "Traceback" not in err
    with Client(shared.socket) as c:
        assert ledger.encode() not in c.ledgers()  # the lines before the bad one: not written


def test_import_of_a_non_utf8_file_is_a_usage_error(
    shared: Daemon, ledger: str, tmp_path: Path
) -> None:
    f = tmp_path / "in.jsonl"
    f.write_bytes(json_line(b"a", b"1") + b"\xff\xfe\n")
    err = ctl_fails(shared, 2, "import", ledger, "p", str(f))
    assert "line 2" in err


def peak_rss(d: Daemon, out: Path, *args: str, input: Path | None = None) -> float:
    """Run ``ledgerctl`` (stdout to ``out``) and return its peak memory in MiB."""
    wrapper = (
        "import resource, subprocess, sys\n"
        "stdin = open(sys.argv[2], 'rb') if sys.argv[2] else None\n"
        "with open(sys.argv[1], 'wb') as f:\n"
        "    r = subprocess.run(sys.argv[3:], stdout=f, stdin=stdin)\n"
        "assert r.returncode == 0, r\n"
        "print(resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 1024)\n"
    )
    p = subprocess.run(
        [sys.executable, "-c", wrapper, str(out), str(input or ""), *cli_cmd(*args)],
        capture_output=True,
        env=cli_env(d.socket),
        cwd=ROOT,
        timeout=120,
        check=True,
    )
    return float(p.stdout)


def test_ls_and_export_of_large_values_stream_in_bounded_memory(
    shared: Daemon, ledger: str, tmp_path: Path
) -> None:
    """ls prints a placeholder for a value too large to list and never fetches it; export
    and import stream it, a chunk at a time, both ways."""
    big = random.Random(8).randbytes(96 * MiB)
    src = tmp_path / "big"
    src.write_bytes(big)
    with Client(shared.socket) as c:
        c.put(ledger, "p", b"big", src, lazy=True)
        c.batch(ledger, "p", [(b"a", b"1"), (b"z", b"2")])
    del big

    listed = tmp_path / "ls.txt"
    assert peak_rss(shared, listed, "ls", ledger, "p") < 80
    assert listed.read_bytes() == b"a\t1\nbig\t<96.0 MiB>\nz\t2\n"
    assert parse_listing(ctl(shared, "ls", "--json", ledger, "p")) == [
        (b"a", b"1", "eager"),
        (b"big", 96 * MiB, "lazy"),
        (b"z", b"2", "eager"),
    ]
    assert ctl(shared, "--hex", "ls", ledger.encode().hex(), "70", "--prefix", "62") == (
        b"626967\t<96.0 MiB>\n"
    )

    dump = tmp_path / "dump.jsonl"
    assert peak_rss(shared, dump, "export", ledger, "p") < 80
    lines = dump.read_bytes().splitlines()
    assert len(lines) == 3 and len(lines[1]) > 128 * MiB
    # The long line goes back in streamed, as a PUT, without ever being held whole.
    assert peak_rss(shared, tmp_path / "none", "import", ledger, "copy", input=dump) < 80
    with Client(shared.socket) as c:
        items = list(c.entries(ledger, "copy", values=False))
        assert [(i.key, i.priority, i.size) for i in items] == [
            (b"a", "eager", 1),
            (b"big", "lazy", 96 * MiB),
            (b"z", "eager", 1),
        ]
        assert c.get(ledger, "copy", b"big") == src.read_bytes()


def test_a_long_import_line_in_another_layout_is_a_usage_error(
    shared: Daemon, ledger: str, tmp_path: Path
) -> None:
    value = base64.b64encode(b"v" * 3 * MiB).decode()
    f = tmp_path / "in.jsonl"
    f.write_text(json.dumps({"value": value, "key": "aw=="}) + "\n")
    err = ctl_fails(shared, 2, "import", ledger, "p", str(f))
    assert "line 1: a line over" in err and err.count("\n") == 1
    f.write_text('{"key":"aw==","priority":"eager","value":"' + value[:-5] + '!!!!"}\n')
    err = ctl_fails(shared, 2, "import", ledger, "p", str(f))
    assert "line 1: the value is not valid base64" in err and err.count("\n") == 1
    f.write_text('{"key":"aw==","priority":"eager","value":"' + value + '"')  # no '}'
    err = ctl_fails(shared, 2, "import", ledger, "p", str(f))
    assert "line 1: a long line must end with" in err
    with Client(shared.socket) as c:
        assert ledger.encode() not in c.ledgers()  # no half-imported value, and no page


def test_a_failed_streamed_import_leaves_no_page_behind(
    shared: Daemon, ledger: str, tmp_path: Path
) -> None:
    # The streamed PUT of a long line made its page before the body failed: a truncated
    # export left an empty page (and ledger) listed, where a short bad input leaves none.
    value = base64.b64encode(random.Random(7).randbytes(3 * MiB)).decode()
    line = '{"key":"aw==","priority":"eager","value":"' + value + '"}\n'
    f = tmp_path / "in.jsonl"
    f.write_text(line[: len(line) // 2])  # an export cut off inside its value
    err = ctl_fails(shared, 2, "import", ledger, "fresh", str(f))
    assert "line 1: the input ends inside the value" in err
    assert ledger.encode() not in ctl(shared, "ledgers").split()
    ctl_fails(shared, 1, "ls", ledger, "fresh")
    ctl(shared, "put", ledger, "kept", "k", "v")  # a page that was there stays, with its data
    ctl_fails(shared, 2, "import", ledger, "kept", str(f))
    assert ctl(shared, "pages", ledger).split() == [b"kept"]
    assert ctl(shared, "get", ledger, "kept", "k") == b"v"
    f.write_text(line)  # the same page made again, whole this time
    assert shared.ledgerctl("import", ledger, "fresh", str(f)).returncode == 0
    assert sorted(ctl(shared, "pages", ledger).split()) == [b"fresh", b"kept"]


def test_import_fits_the_daemons_batch_limit(short_tmp: Path) -> None:
    """Batches are split to the daemon's max_batch_bytes; a value over it goes on its own."""
    d = start_daemon(short_tmp, env={"LEDGERD_MAX_BATCH_BYTES": str(256 * 1024)})
    try:
        rng = random.Random(9)
        entries = [(b"s%04d" % i, rng.randbytes(2000), "eager") for i in range(400)]
        entries += [(b"mid", rng.randbytes(700_000), "lazy"), (b"big", rng.randbytes(MiB), "eager")]
        dump = b"".join(json_line(*e) for e in entries)
        p = d.ledgerctl("import", "l", "p", input=dump)
        assert (p.returncode, p.stderr) == (0, b"imported 402 entries\n"), p
        assert sorted(listing(d, "l", "p")) == sorted(entries)
    finally:
        assert d.stop() == 0


# -- heads, log and reads at a commit ------------------------------------------------


def test_heads_log_and_reads_at_a_commit(shared: Daemon, ledger: str) -> None:
    with Client(shared.socket) as c:
        c.put(ledger, "p", b"k", b"v1")
        first = c.heads(ledger, "p")[0]["id"]  # heads commits acknowledged writes first
        c.put(ledger, "p", b"k", b"v2")
        c.heads(ledger, "p")
        c.put(ledger, "p", b"other", b"x")
        head = c.heads(ledger, "p")[0]["id"]
    heads, log, log2, at_get = outputs(
        ctl_all(
            shared,
            ["heads", ledger, "p"],
            ["log", ledger, "p"],
            ["log", "--limit", "2", ledger, "p"],
            ["get", "--at", first, ledger, "p", "k"],
        )
    )
    assert heads.decode() == f"{head}\n" and COMMIT_ID.fullmatch(head)

    pattern = re.compile(
        r"(?P<id>[0-9a-f]{64})  gen (?P<gen>\d+)  "
        r"(?P<when>\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}\+00:00)"
        r"  parents (?P<parents>-|[0-9a-f]{12})"  # history is a line: one parent at most
    )
    commits = []
    for line in log.decode().splitlines():
        m = pattern.fullmatch(line)
        assert m, line
        commits.append(m)
    assert [int(m["gen"]) for m in commits] == [3, 2, 1, 0]  # newest first
    assert commits[0]["id"] == head and commits[2]["id"] == first
    assert commits[-1]["parents"] == "-"  # the page's first commit: generation 0
    for newer, older in zip(commits, commits[1:], strict=False):
        assert newer["parents"] == older["id"][:12]
    assert log2.decode().splitlines() == log.decode().splitlines()[:2]

    assert at_get == b"v1"
    # The 12 digits log prints for a parent (or any unique prefix) name the commit.
    short = commits[1]["parents"]
    assert short == first[:12]
    at_ls, at_get7 = outputs(
        ctl_all(
            shared, ["ls", "--at", short, ledger, "p"], ["get", "--at", first[:7], ledger, "p", "k"]
        )
    )
    assert at_ls == b"k\tv1\n" and at_get7 == b"v1"
    taken = {m["id"][:6] for m in commits}
    unknown = next(p for p in (f"{i:06x}" for i in range(2**24)) if p not in taken)
    err = ctl_fails(shared, 1, "ls", "--at", unknown, ledger, "p")
    assert err == f"ledgerctl: commit {unknown} is not in {ledger}/p\n", err
    err = ctl_fails(shared, 2, "ls", "--at", "abc", ledger, "p")  # fewer than 4 digits
    assert "is not a commit id: 4 to 64 hex digits (bad_request)" in err, err


def test_get_to_file_at_a_commit(shared: Daemon, ledger: str, tmp_path: Path) -> None:
    with Client(shared.socket) as c:
        c.put(ledger, "p", b"k", b"old")
        first = c.heads(ledger, "p")[0]["id"]
        c.put(ledger, "p", b"k", b"new")
    out = tmp_path / "o"
    ctl(shared, "get", "--at", first, "-o", str(out), ledger, "p", "k")
    assert out.read_bytes() == b"old"


# -- watch ---------------------------------------------------------------------------


class Watcher:
    """A ``ledgerctl watch`` subprocess whose stdout is read line by line with timeouts."""

    def __init__(self, d: Daemon, *args: str) -> None:
        self.proc = subprocess.Popen(
            cli_cmd("watch", *args),
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            env=cli_env(d.socket),
            cwd=ROOT,
        )
        assert self.proc.stdout is not None
        self.fd = self.proc.stdout.fileno()
        self.buf = b""
        self.lines: list[str] = []

    def next_line(self, deadline: float) -> str | None:
        """The next line of output, or None if none is complete by ``deadline``."""
        while not self.lines:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                return None
            ready, _, _ = select.select([self.fd], [], [], remaining)
            if not ready:
                return None
            chunk = os.read(self.fd, 65536)
            if not chunk:
                self.proc.wait(10)
                assert self.proc.stderr is not None
                pytest.fail(
                    f"watch exited with {self.proc.returncode}: {self.proc.stderr.read()!r}"
                )
            self.buf += chunk
            *complete, self.buf = self.buf.split(b"\n")
            self.lines.extend(x.decode() for x in complete)
        return self.lines.pop(0)

    def read_until(self, match: Callable[[str], bool], deadline: float) -> list[str] | None:
        """The lines before the first that ``match``es (consumed too); None at the deadline."""
        before: list[str] = []
        while (line := self.next_line(deadline)) is not None:
            if match(line):
                return before
            before.append(line)
        self.lines[:0] = before  # keep them for the next attempt
        return None

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
        self.proc.wait(10)
        for f in (self.proc.stdout, self.proc.stderr):
            if f is not None:
                f.close()


def json_events(line: str) -> list[tuple[str, bytes, bytes | None]]:
    """One ``watch --json`` line (a change) as ("put", key, value) / ("delete", key, None)."""
    doc = json.loads(line)
    assert COMMIT_ID.fullmatch(doc["commit"]), line
    key = base64.b64decode(doc["key"])
    if doc["op"] == "delete":
        assert list(doc) == ["op", "commit", "key"], line
        return [("delete", key, None)]
    assert list(doc) == ["op", "commit", "key", "priority", "value"], line  # ls's entry
    assert doc["op"] == "put" and doc["priority"] == "eager", line
    return [("put", key, base64.b64decode(doc["value"]))]


def test_watch_prints_changes_in_order(shared: Daemon, ledger: str) -> None:
    client = Client(shared.socket)

    def commit(key: bytes, value: bytes | None) -> None:
        """One write in a commit of its own (heads commits acknowledged writes first)."""
        if value is None:
            client.delete(ledger, "p", key)
        else:
            client.put(ledger, "p", key, value)
        client.heads(ledger, "p")

    commit(b"init", b"0")  # the page exists before anyone watches
    watchers = [
        Watcher(shared, ledger, "p"),
        Watcher(shared, ledger, "p", "--prefix", "w/"),
        Watcher(shared, ledger, "p", "--json"),
    ]
    *text_watchers, json_watcher = watchers

    def text_is(want: str) -> Callable[[str], bool]:
        return lambda line: line == want

    def json_is(*events: tuple[str, bytes, bytes | None]) -> Callable[[str], bool]:
        return lambda line: json_events(line) == list(events)

    try:
        # Subscribed yet? Write sentinels under the watched prefix until every watcher
        # shows the latest one; earlier sentinels, if any, arrive in order before it.
        for attempt in range(100):
            commit(b"w/sentinel", b"s%d" % attempt)
            deadline = time.monotonic() + 0.5
            matches = [text_is(f"put\tw/sentinel\ts{attempt}")] * len(text_watchers) + [
                json_is(("put", b"w/sentinel", b"s%d" % attempt))
            ]
            seen = [w.read_until(m, deadline) for w, m in zip(watchers, matches, strict=True)]
            if all(s is not None for s in seen):
                for s in seen[:-1]:
                    assert s is not None and all(x.startswith("put\tw/sentinel\ts") for x in s)
                break
        else:
            pytest.fail("the watchers never reported the sentinel")

        commit(b"w/a", b"1")
        commit(b"other", b"2")  # outside the prefix
        commit(b"w/b", b"tab\there\nnl")
        commit(b"w/a", None)
        commit(b"other", None)
        commit(b"w/end", b"done")

        deadline = time.monotonic() + 20
        everything, prefixed = (
            w.read_until(text_is("put\tw/end\tdone"), deadline) for w in text_watchers
        )
        assert everything == [
            "put\tw/a\t1",
            "put\tother\t2",
            "put\tw/b\ttab\\there\\nnl",
            "delete\tw/a",
            "delete\tother",
        ]
        assert prefixed == ["put\tw/a\t1", "put\tw/b\ttab\\there\\nnl", "delete\tw/a"]

        commits = json_watcher.read_until(json_is(("put", b"w/end", b"done")), deadline)
        assert commits is not None
        assert [json_events(c) for c in commits] == [
            [("put", b"w/a", b"1")],
            [("put", b"other", b"2")],
            [("put", b"w/b", b"tab\there\nnl")],
            [("delete", b"w/a", None)],
            [("delete", b"other", None)],
        ]
        for w in watchers:
            assert w.proc.poll() is None  # still watching
    finally:
        for w in watchers:
            w.stop()
        client.close()


def test_watch_of_a_missing_page_says_it_waits_for_it(shared: Daemon, ledger: str) -> None:
    """``watch`` of a page that does not exist yet says so on stderr (it waited silently),
    then prints the page's changes once it is made; ``--quiet`` leaves the line out."""
    watcher, quiet = Watcher(shared, ledger, "nosuchpage"), Watcher(shared, "-q", ledger, "p2")
    try:
        assert watcher.proc.stderr is not None
        fd, line, until = watcher.proc.stderr.fileno(), "", time.monotonic() + 60
        while not line.endswith("\n"):  # (print may write the line and its end apart)
            ready, _, _ = select.select([fd], [], [], max(0.0, until - time.monotonic()))
            assert ready, f"no whole line on stderr: {line!r}"
            line += os.read(fd, 4096).decode()
        assert line == (
            f"ledgerctl: no page nosuchpage in ledger {ledger} yet: "
            "waiting for it (Ctrl-C to stop)\n"
        )
        deadline = time.monotonic() + 60
        for attempt in range(1000):  # the watch is registered: the first put is seen
            ctl(shared, "put", ledger, "nosuchpage", "k", f"v{attempt}")
            ctl(shared, "put", ledger, "p2", "k", f"v{attempt}")
            if watcher.read_until(lambda x: x.startswith("put\tk\tv"), deadline) is not None:
                break
        assert quiet.read_until(lambda x: x.startswith("put\tk\tv"), deadline) is not None
        assert quiet.proc.stderr is not None  # (its note would have come before the change)
        assert select.select([quiet.proc.stderr.fileno()], [], [], 0)[0] == []
    finally:
        watcher.stop()
        quiet.stop()


# -- exit statuses -------------------------------------------------------------------


def test_a_socket_path_too_long_to_connect_to_is_named(tmp_path: Path) -> None:
    """A socket path over the 107 bytes of sockaddr_un: aiohttp's error has no errno,
    and the line ended in ``: None`` (the Python clients' said ``ssl:default [None]``)."""
    sock = tmp_path / ("s" * 200)
    p = subprocess.run(
        cli_cmd("--socket", str(sock), "ls", "l", "p"),
        capture_output=True,
        env=cli_env(sock),
        cwd=ROOT,
        timeout=60,
    )
    err = p.stderr.decode()
    assert p.returncode == 3 and p.stdout == b"", p
    assert f"cannot reach ledgerd at {sock}: AF_UNIX path too long (" in err, err
    assert "None" not in err and "Traceback" not in err and err.count("\n") == 1, err


def test_a_file_in_the_sockets_place_is_named_not_a_daemon_to_start(tmp_path: Path) -> None:
    """A regular file or a directory at the socket path: connect() says "Connection
    refused", and ledgerctl's hint was to start ledgerd there, which refuses such a path
    ("exists and is not a socket; not removing it"). The line says what is there instead;
    the Python clients' DaemonUnavailableError says the same."""
    f = tmp_path / "file.sock"
    f.write_bytes(b"")
    d = tmp_path / "dir.sock"
    d.mkdir()
    for path, kind in ((f, "a regular file"), (d, "a directory")):
        p = subprocess.run(
            cli_cmd("--socket", str(path), "status"),
            capture_output=True,
            env=cli_env(path),
            cwd=ROOT,
            timeout=60,
        )
        err = p.stderr.decode()
        assert p.returncode == 3 and p.stdout == b"", p
        assert err.startswith(f"ledgerctl: cannot reach ledgerd at {path}: "), err
        assert f"{path} is {kind}, not a socket" in err and "start it with" not in err, err
        assert "Traceback" not in err and err.count("\n") == 1, err


def test_exit_statuses_without_a_daemon(tmp_path: Path) -> None:
    """Bad usage exits 2 before any connection; an unreachable daemon exits 3 with a hint."""
    sock = tmp_path / "missing.sock"
    f = tmp_path / "f"
    f.write_bytes(b"x")
    cases: list[tuple[list[str], int, str]] = [
        (["--hex", "get", "6c", "70", "zz"], 2, "ledgerctl: key 'zz' is not valid hex\n"),
        (["--hex", "ls", "abc", "70"], 2, "ledgerctl: ledger 'abc' is not valid hex\n"),
        (["put", "--file", str(f), "l", "p", "k", "v"], 2, "ledgerctl: give either VALUE or"),
        (["put", "--file", str(tmp_path / "nope"), "l", "p", "k"], 2, "ledgerctl: --file "),
        (["status"], 3, f"ledgerctl: cannot reach ledgerd at {sock}: "),  # $LEDGERD_SOCKET
        (["--socket", str(tmp_path / "x"), "watch", "l", "p"], 3, "ledgerctl: cannot reach"),
        (["ls", "l", "p", "--socket", str(tmp_path / "y")], 3, "ledgerctl: cannot reach"),
        (["put", "--file", str(tmp_path), "l", "p", "k"], 2, f"ledgerctl: --file {tmp_path}: is a"),
    ]

    def run(args: list[str]) -> Run:
        return subprocess.run(
            cli_cmd(*args), capture_output=True, env=cli_env(sock), cwd=ROOT, timeout=60
        )

    with ThreadPoolExecutor(len(cases)) as pool:
        runs = list(pool.map(run, [c[0] for c in cases]))
    for p, (_, code, message) in zip(runs, cases, strict=True):
        assert p.returncode == code, p
        assert p.stdout == b""
        err = p.stderr.decode()
        assert message in err and "Traceback" not in err, err
        if code == 3:  # what failed, without aiohttp's internals
            assert "No such file or directory" in err and "ssl:" not in err, err
            assert "host" not in err and "ledgerd:80" not in err, err
    assert "no such file" in runs[3].stderr.decode()
    assert (
        runs[4]
        .stderr.decode()
        .endswith("(is ledgerd running there? $LEDGERD_SOCKET chose it; start it with: ledgerd)\n")
    )
    for p, given in [(runs[5], tmp_path / "x"), (runs[6], tmp_path / "y")]:  # --socket
        assert p.stderr.decode().endswith(
            f"(is ledgerd running there? start it with: ledgerd --socket {given})\n"
        ), p


# -- progress bar --------------------------------------------------------------------


def run_on_pty(d: Daemon, *args: str) -> tuple[int, bytes]:
    """Run ``ledgerctl`` with stderr on a pseudo-terminal; returns (status, what it showed)."""
    master, slave = os.openpty()
    try:
        proc = subprocess.Popen(
            cli_cmd(*args),
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=slave,
            env=cli_env(d.socket),
            cwd=ROOT,
        )
        os.close(slave)
        slave = -1
        shown = b""
        deadline = time.monotonic() + 60
        while True:
            ready, _, _ = select.select([master], [], [], max(0.0, deadline - time.monotonic()))
            assert ready, f"ledgerctl {args} still running; showed {shown!r}"
            try:
                chunk = os.read(master, 65536)
            except OSError as e:  # EIO: every copy of the terminal's slave side is closed
                assert e.errno == errno.EIO
                break
            if not chunk:
                break
            shown += chunk
        return proc.wait(60), shown
    finally:
        os.close(master)
        if slave >= 0:
            os.close(slave)


def test_progress_bar_only_on_a_terminal_for_large_transfers(
    shared: Daemon, ledger: str, tmp_path: Path
) -> None:
    big = tmp_path / "big"
    big.write_bytes(random.Random(5).randbytes(8 * MiB + 12345))
    small = tmp_path / "small"
    small.write_bytes(b"s" * (8 * MiB - 1))
    with ThreadPoolExecutor(3) as pool:
        on_tty = pool.submit(run_on_pty, shared, "put", "--file", str(big), ledger, "p", "big")
        small_on_tty = pool.submit(
            run_on_pty, shared, "put", "--file", str(small), ledger, "p", "small"
        )
        # Not a terminal: nothing at all on stderr (ctl checks).
        no_tty = pool.submit(ctl, shared, "put", "--file", str(big), ledger, "p", "big2")
        code, shown = on_tty.result()
        assert small_on_tty.result() == (0, b"")  # under 8 MiB: silent even on a terminal
        assert no_tty.result() == b""

    assert code == 0, shown
    text = shown.decode()
    # tqdm's bar: done/total, elapsed<remaining, rate; it ends complete.
    assert re.search(r"put: +\d+%\|.*\| [\d.]+M?/8\.01M \[\d\d:\d\d<\d\d:\d\d, ", text), text
    assert re.search(r"put: 100%\|█+\| 8\.01M/8\.01M \[.*B/s\]\r?\n$", text), text
    assert "Traceback" not in text
    with Client(shared.socket) as c:
        assert c.get(ledger, "p", b"big") == c.get(ledger, "p", b"big2") == big.read_bytes()

    out = tmp_path / "out"
    code, shown = run_on_pty(shared, "get", "-o", str(out), ledger, "p", "big")
    assert code == 0 and re.search(r"get: 100%\|█+\| 8\.01M/8\.01M", shown.decode()), shown
    assert out.read_bytes() == big.read_bytes()


def test_watch_says_so_when_the_daemon_ends_it(daemon: Daemon) -> None:
    """``watch`` runs until interrupted; if the daemon goes away first it says so and
    fails, rather than exiting 0 as if interrupted."""
    client = Client(daemon.socket)
    client.put("l", "p", b"init", b"0")
    watcher = Watcher(daemon, "l", "p")
    try:
        for attempt in range(100):  # subscribed once a sentinel shows
            client.put("l", "p", b"sentinel", b"s%d" % attempt)
            client.heads("l", "p")
            want = f"put\tsentinel\ts{attempt}"
            if watcher.read_until(want.__eq__, time.monotonic() + 0.5) is not None:
                break
        else:
            pytest.fail("the watcher never showed a change")
        assert daemon.stop() == 0
        assert watcher.proc.wait(30) == 1
        assert watcher.proc.stderr is not None
        assert "the daemon ended the watch" in watcher.proc.stderr.read().decode()
    finally:
        watcher.stop()
        client.close()


def test_a_dash_is_standard_input_or_output(daemon: Daemon, ledger: str, tmp_path: Path) -> None:
    """``put --file -``, ``get -o -`` and ``import L P -`` are standard input and output
    (as ``doc put``'s ``-`` is): ``--file -`` and ``import`` said "no such file", and
    ``-o -`` (``doc attachment``'s too) wrote to a file named ``-``, nothing to standard
    output."""

    def run(*args: str, input: bytes | None = None) -> bytes:
        p = subprocess.run(
            cli_cmd(*args), input=input, capture_output=True, env=cli_env(daemon.socket),
            cwd=tmp_path, timeout=60,
        )  # fmt: skip
        assert (p.returncode, p.stderr) == (0, b""), p
        return p.stdout

    run("put", ledger, "p", "k", "--file", "-", input=b"from stdin")
    assert run("get", ledger, "p", "k", "-o", "-") == b"from stdin"
    b64 = base64.b64encode
    line = json.dumps(
        {"key": b64(b"i").decode(), "priority": "eager", "value": b64(b"imported").decode()}
    )
    assert run("--json", "import", ledger, "p", "-", input=line.encode()) == b'{"imported":1}\n'
    assert run("get", ledger, "p", "i") == b"imported"
    doc_id = run("doc", "put", ledger, "d", "c", "{}").split(b"\t")[0].decode()
    f = tmp_path / "f"
    f.write_bytes(b"attached")
    att = run("doc", "attach", ledger, "d", "c", doc_id, str(f)).split(b"\t")[0].decode()
    f.unlink()
    assert run("doc", "attachment", ledger, "d", "c", doc_id, att, "-o", "-") == b"attached"
    assert list(tmp_path.iterdir()) == []  # no file named "-"
