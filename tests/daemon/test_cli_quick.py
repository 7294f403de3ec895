"""``ledgerctl``'s quick path (daemon/cli_quick.py): ``get`` of a small value without
asyncio, aiohttp or the store, printing what the full command prints.

The quick path's own reading of the command line is a second parser: a property test
shows that whatever it takes, ledgerctl's parser takes too, as the same command.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ledgerd.daemon.cli import parser
from ledgerd.daemon.cli_quick import quick_args
from ledgerd.daemon.client import Client
from tests.daemon.conftest import ROOT, Daemon

WORDS = [
    "get",
    "put",
    "ls",
    "notes",
    "inbox",
    "k",
    "-",
    "--",
    "--socket",
    "--socket=/tmp/s",
    "/tmp/s",
    "--at",
    "--at=ce72",
    "ce72cb29519f",
    "xyz",
    "",
    "--force",
    "--forc",
    "--hex",
    "--tuple",
    "--json",
    "-q",
    "-o",
    "-h",
    "--so",
    "a=b",
    "-1",
]


@settings(max_examples=3000, deadline=None)
@given(st.lists(st.sampled_from(WORDS), max_size=9))
def test_what_the_quick_path_takes_the_full_parser_takes_alike(argv: list[str]) -> None:
    q = quick_args(argv)
    if q is None:
        return  # the full command runs it (or refuses it)
    args = parser().parse_args(argv)  # no SystemExit: the full parser takes it too
    assert args.command == q.command
    assert (args.ledger, args.page, args.key) == (q.ledger, q.page, q.key)
    assert not (args.hex or args.tuple or args.quiet), args
    if q.command == "put":
        assert (args.socket, args.value) == (q.socket, q.value)
        assert not (args.file or args.lazy), args
        return
    assert (args.socket, args.at, args.force) == (q.socket, q.at, q.force)
    assert not args.output, args


def test_the_plain_get_lines_are_taken() -> None:
    q = quick_args(["--socket", "/s", "get", "notes", "inbox", "k", "--at=ce72", "--force"])
    assert q is not None and (q.socket, q.at, q.force, q.key) == ("/s", "ce72", True, "k")
    assert quick_args(["get", "notes", "inbox", "k"]) is not None
    for argv in (
        ["get", "notes", "inbox"],
        ["get", "--hex", "6e", "69", "6b"],
        ["get", "--socket", "/a", "--socket", "/b", "l", "p", "k"],  # (argparse: the last)
        ["--at", "ce72", "get", "l", "p", "k"],  # (not an option before the command)
        ["get", "--at", "xyz", "l", "p", "k"],  # (the full command says why)
        ["get", "--socket", "", "l", "p", "k"],
        ["put", "l", "p", "k"],  # (the value from standard input)
        ["put", "l", "p", "k", "v", "--lazy"],
        ["put", "--at", "ce72", "l", "p", "k", "v"],
        ["put", "l", "p", "k", "--socket=/s", "v"],  # (argparse: VALUE got nothing before it)
    ):
        assert quick_args(argv) is None, argv
    q = quick_args(["put", "--socket", "/s", "notes", "inbox", "k", "hello world"])
    assert q is not None and (q.command, q.value, q.socket) == ("put", "hello world", "/s")


Run = tuple[int, bytes, bytes]


def run(d: Daemon, module: str, *args: str, python: tuple[str, ...] = ()) -> Run:
    """``python -m module args`` against ``d``: exit status, stdout, stderr."""
    done = subprocess.run(
        [sys.executable, *python, "-m", module, *args],
        capture_output=True,
        cwd=ROOT,
        env={**os.environ, "LEDGERD_SOCKET": str(d.socket)},
        timeout=120,
    )
    return done.returncode, done.stdout, done.stderr


@pytest.mark.parametrize(
    "args",
    [
        ("get", "l", "p", "small"),
        ("get", "l", "p", "empty"),
        ("get", "l", "p", "binary"),  # (not a terminal: every byte)
        ("get", "l", "p", "big"),  # over QUICK_MAX: the full command prints it
        ("get", "l", "p", "nope"),
        ("get", "l", "nopage", "k"),
        ("get", "l", "p", "small", "--at", "0000"),
        ("get", "l", "p", "small", "--at", "xyz"),
        ("get", "--socket", "/nonexistent/dir/s", "l", "p", "small"),
    ],
)
def test_ledgerctl_prints_what_the_full_command_prints(
    daemon: Daemon, args: tuple[str, ...]
) -> None:
    with Client(daemon.socket) as c:
        c.put("l", "p", b"small", b"hello")
        c.put("l", "p", b"empty", b"")
        c.put("l", "p", b"binary", bytes(range(256)))
        c.put("l", "p", b"big", b"x" * (1024 * 1024 + 1))
    quick = run(daemon, "ledgerd.daemon.cli_quick", *args)
    full = run(daemon, "ledgerd.daemon.cli", *args)
    assert quick == full


def test_get_at_a_commit_prefix_on_the_quick_path(daemon: Daemon) -> None:
    with Client(daemon.socket) as c:
        c.put("l", "p", b"k", b"old")
        first = c.heads("l", "p")[0]["id"]
        c.put("l", "p", b"k", b"new")
        c.heads("l", "p")
    assert run(daemon, "ledgerd.daemon.cli_quick", "get", "l", "p", "k", "--at", first[:8]) == (
        0,
        b"old",
        b"",
    )


def test_a_small_get_loads_neither_asyncio_nor_aiohttp(daemon: Daemon) -> None:
    """The point of the quick path: ``ledgerctl get`` took 0.3-1 s, most of it imports.
    (The installed ``ledgerctl`` command, next to this Python: its entry point.)"""
    with Client(daemon.socket) as c:
        c.put("l", "p", b"k", b"v")
    script = Path(sys.executable).parent / "ledgerctl"
    done = subprocess.run(
        [sys.executable, "-X", "importtime", str(script), "get", "l", "p", "k"],
        capture_output=True,
        env={**os.environ, "LEDGERD_SOCKET": str(daemon.socket)},
        timeout=120,
    )
    assert (done.returncode, done.stdout) == (0, b"v"), done.stderr
    imported = {line.split("|")[-1].strip() for line in done.stderr.decode().splitlines()}
    assert "ledgerd.daemon.cli_quick" in imported
    for heavy in (
        "asyncio",
        "aiohttp",
        "socket",
        "ledgerd.store",
        "ledgerd.daemon.cli",
        "argparse",
    ):
        assert heavy not in imported, heavy


@pytest.mark.parametrize(
    "args",
    [
        ("put", "l", "p", "k", "hello world"),
        ("put", "l", "p", "k", ""),
        ("put", "l", "p", "", "v"),  # (an empty key is a key)
        ("put", "l", "", "k", "v"),
        ("put", "--socket", "/nonexistent/dir/s", "l", "p", "k", "v"),
    ],
)
def test_a_quick_put_does_and_prints_what_the_full_command_does(
    daemon: Daemon, args: tuple[str, ...]
) -> None:
    quick = run(daemon, "ledgerd.daemon.cli_quick", *args)
    with Client(daemon.socket) as c:
        ledger, page, key = args[-4:-1]
        stored = c.get(ledger, page, os.fsencode(key)) if quick[0] == 0 else None
        if quick[0] == 0:
            c.put(ledger, page, os.fsencode(key), b"before")
    full = run(daemon, "ledgerd.daemon.cli", *args)
    assert quick == full
    if quick[0] == 0:
        assert stored == os.fsencode(args[-1])


def test_a_small_put_loads_neither_asyncio_nor_aiohttp(daemon: Daemon) -> None:
    """``bench.daemons --run same-keys`` puts 300 keys with ``ledgerctl``: each took
    0.8 s of imports before the quick path."""
    script = Path(sys.executable).parent / "ledgerctl"
    done = subprocess.run(
        [sys.executable, "-X", "importtime", str(script), "put", "l", "p", "k", "v"],
        capture_output=True,
        env={**os.environ, "LEDGERD_SOCKET": str(daemon.socket)},
        timeout=120,
    )
    assert (done.returncode, done.stdout) == (0, b""), done.stderr
    imported = {line.split("|")[-1].strip() for line in done.stderr.decode().splitlines()}
    for heavy in (
        "asyncio",
        "aiohttp",
        "socket",
        "ledgerd.store",
        "ledgerd.daemon.cli",
        "argparse",
    ):
        assert heavy not in imported, heavy
    with Client(daemon.socket) as c:
        assert c.get("l", "p", b"k") == b"v"
