"""``ledgerctl``'s conventions (issue 19): ``--json`` everywhere in one shape, exit statuses,
readable names, no binary on a terminal, options after the command, ``version``,
"did you mean", progress bars, shell completion, ``du`` and the sync part of ``status``.
"""

from __future__ import annotations

import argparse
import array
import base64
import errno
import fcntl
import json
import os
import random
import re
import select
import shutil
import signal
import subprocess
import termios
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from ledgerd.daemon import __version__
from ledgerd.daemon.cli_format import counted, positive_int
from ledgerd.daemon.cli_status import status_lines, sync_lines
from ledgerd.daemon.client import Client
from tests.daemon.conftest import ROOT, Daemon, start_daemon
from tests.daemon.test_cli import (
    MiB,
    Run,
    cli_cmd,
    cli_env,
    ctl,
    ctl_all,
    ctl_fails,
    json_line,
    ledger,
    outputs,
    seed,
    shared_daemon,
)

__all__ = ["ledger"]  # a fixture


@pytest.fixture(scope="module")
def shared() -> Iterator[Daemon]:
    yield from shared_daemon()


def json_lines(out: bytes) -> list[dict[str, Any]]:
    """``--json`` output: one compact object per line, nothing else."""
    docs = []
    for line in out.decode().splitlines():
        doc = json.loads(line)
        assert isinstance(doc, dict), line
        assert json.dumps(doc, separators=(",", ":")) == line  # compact, one line each
        docs.append(doc)
    return docs


def run_tty(
    d: Daemon, *args: str, stdout: bool = False, input: bytes | None = None
) -> tuple[int, bytes, bytes]:
    """Run ``ledgerctl`` with stderr (and with ``stdout``, stdout too) on a pseudo-terminal;
    returns (status, what the terminal showed, stdout when it was a pipe)."""
    master, slave = os.openpty()
    try:
        proc = subprocess.Popen(
            cli_cmd(*args),
            stdin=subprocess.PIPE if input is not None else subprocess.DEVNULL,
            stdout=slave if stdout else subprocess.PIPE,
            stderr=slave,
            env=cli_env(d.socket),
            cwd=ROOT,
        )
        os.close(slave)
        slave = -1
        if input is not None:
            assert proc.stdin is not None
            proc.stdin.write(input)
            proc.stdin.close()
        out = b""
        shown = b""
        deadline = time.monotonic() + 60
        fds = [master] + ([proc.stdout.fileno()] if proc.stdout else [])
        while fds:
            ready, _, _ = select.select(fds, [], [], max(0.0, deadline - time.monotonic()))
            assert ready, f"ledgerctl {args} still running; showed {shown!r}"
            for fd in ready:
                try:
                    chunk = os.read(fd, 65536)
                except OSError as e:  # EIO: every copy of the terminal's slave side is closed
                    assert e.errno == errno.EIO
                    chunk = b""
                if not chunk:
                    fds.remove(fd)
                elif fd == master:
                    shown += chunk
                else:
                    out += chunk
        if proc.stdout:
            proc.stdout.close()
        return proc.wait(60), shown, out
    finally:
        os.close(master)
        if slave >= 0:
            os.close(slave)


# -- --json ------------------------------------------------------------------------


def test_json_on_every_command_that_prints_data(shared: Daemon, ledger: str) -> None:
    seed(shared, ledger, "p", [(b"k", b"v", "eager"), (b"\xff", b"w", "lazy")])
    seed(shared, ledger, b"\x00\xff", [(b"k", b"v", "eager")])
    runs = ctl_all(
        shared,
        ["--json", "status"],
        ["version", "--json"],
        ["ledgers", "--json"],
        ["pages", ledger, "--json"],
        ["du", ledger, "--json"],
        ["ls", ledger, "p", "--json"],
        ["heads", ledger, "p", "--json"],
        ["log", ledger, "p", "--json"],
        ["policy", ledger, "p", "--json"],
        ["export", ledger, "p", "--json"],
    )
    status, version, ledgers, pages, du, ls, heads, log, policy, export = (
        json_lines(o) for o in outputs(runs)
    )
    assert status[0]["pid"] == shared.proc.pid and len(status) == 1
    assert version == [{"client": __version__, "daemon": __version__}]
    assert {"ledger": base64.b64encode(ledger.encode()).decode(), "ledger_text": ledger} in ledgers
    lb = base64.b64encode(ledger.encode()).decode()
    assert pages == [
        {"ledger": lb, "ledger_text": ledger, "page": "AP8=", "page_text": None},
        {"ledger": lb, "ledger_text": ledger, "page": "cA==", "page_text": "p"},
    ]
    assert [{k: d[k] for k in [*pages[0], "entries", "key_bytes", "value_bytes"]} for d in du] == [
        {**pages[0], "entries": 1, "key_bytes": 1, "value_bytes": 1},
        {**pages[1], "entries": 2, "key_bytes": 2, "value_bytes": 2},
    ]
    assert all(d["file_bytes"] > 0 and d["commits"] >= 1 for d in du)  # and the disk side
    assert (
        ls
        == export
        == [
            {"key": "aw==", "priority": "eager", "value": "dg=="},
            {"key": "/w==", "priority": "lazy", "value": "dw=="},
        ]
    )
    assert len(heads) == 1 and re.fullmatch(r"[0-9a-f]{64}", heads[0]["id"])
    assert log[0]["id"] == heads[0]["id"]
    assert policy[0]["policy"] == "last_one_wins"

    # import reports on stdout with --json, watch prints one entry per change (see
    # test_cli's watch test); commands that print no data print nothing.
    p = shared.ledgerctl("import", ledger, "q", "--json", input=json_line(b"a", b"1"))
    assert (p.returncode, p.stdout, p.stderr) == (0, b'{"imported":1}\n', b""), p
    assert ctl(shared, "put", ledger, "q", "b", "2", "--json") == b""


# -- exit statuses -----------------------------------------------------------------


def test_exit_status_4_is_a_refusal_by_the_daemon(shared: Daemon, ledger: str) -> None:
    err = ctl_fails(shared, 4, "sync")  # this daemon has no cloud
    assert "cloud sync is off" in err and "(conflict)" in err, err


def test_not_found_names_things_as_given(shared: Daemon, ledger: str) -> None:
    seed(shared, ledger, "p", [(b"k", b"v", "eager")])
    runs = ctl_all(
        shared,
        ["get", ledger, "p", "nope"],
        ["get", ledger, "nopage", "k"],
        ["get", "no-such-ledger-\u00e9", "p", "k"],
        ["--hex", "get", ledger.encode().hex(), "70", "ff00"],
        ["get", ledger, "p", "k", "--at", "00ff"],
        ["ls", ledger, "p", "--at", "00ff"],
        ["ls", "hex:ff01", "p"],  # a name ledgerctl printed, pasted back without --hex
    )
    errs = []
    for p in runs:
        assert p.returncode == 1 and p.stdout == b"", p
        errs.append(p.stderr.decode())
    assert errs == [
        f"ledgerctl: key nope is not in {ledger}/p\n",
        f"ledgerctl: no page nopage in ledger {ledger}\n",
        "ledgerctl: no ledger no-such-ledger-é\n",
        f"ledgerctl: key ff00 is not in {ledger.encode().hex()}/70\n",
        f"ledgerctl: commit 00ff is not in {ledger}/p\n",
        f"ledgerctl: commit 00ff is not in {ledger}/p\n",
        "ledgerctl: no ledger hex:ff01 (to name hex:ff01, give ff01 with --hex)\n",
    ]
    assert not any("b'" in e for e in errs)


def test_local_standard_input_and_output_errors_are_one_line_exit_2(
    shared: Daemon, ledger: str
) -> None:
    """Standard output that cannot be written (a full disk, a closed descriptor) and
    standard input that cannot be read are local files that cannot be read or written:
    one line and exit status 2, never a traceback (with exit status 1, "not found"), nor
    "cannot reach ledgerd" (3); a put whose standard input fails stores nothing. A pipe
    closed by its reader (``ledgerctl ls | head -1``) is still a success."""
    seed(shared, ledger, "p", [(b"k%03d" % i, b"v", "eager") for i in range(300)])
    ctl(shared, "doc", "put", ledger, "d", "c", "{}")

    def run(args: list[str], stdin: Any = None, stdout: Any = None, close: int = -1) -> Run:
        return subprocess.run(
            cli_cmd(*args),
            stdin=stdin,
            stdout=stdout,
            stderr=subprocess.PIPE,
            env=cli_env(shared.socket),
            cwd=ROOT,
            timeout=120,
            preexec_fn=(lambda: os.close(close)) if close >= 0 else None,
        )

    reads = (["ls", ledger, "p"], ["get", ledger, "p", "k001"], ["ledgers"])
    with open("/dev/full", "wb") as full, open(os.devnull, "wb") as write_only:
        runs = [run(list(a), stdout=full) for a in reads]
        runs += [
            run(["ls", ledger, "p", "--json"], close=1),
            run(["doc", "ls", ledger, "d", "c"], close=1),
        ]
        writes = (["put", ledger, "p", "from-stdin"], ["import", ledger, "q"])
        runs += [run(list(a), stdin=write_only) for a in writes]
        runs += [run(["doc", "put", ledger, "d", "c", "-"], stdin=write_only)]
        runs += [run(["put", ledger, "p", "closed-stdin"], close=0)]
    for p in runs:
        err = p.stderr.decode()
        assert p.returncode == 2, (p.args, p.returncode, err)
        assert err.startswith("ledgerctl: ") and err.count("\n") == 1, (p.args, err)
        assert "Traceback" not in err and "cannot reach" not in err, (p.args, err)
    assert "No space left on device" in runs[0].stderr.decode()
    keys = ctl(shared, "ls", ledger, "p", "--prefix", "from-stdin").split()
    assert keys == [] and ctl(shared, "ls", ledger, "p", "--prefix", "closed").split() == []
    with subprocess.Popen(
        cli_cmd("ls", ledger, "p"),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        env=cli_env(shared.socket),
        cwd=ROOT,
    ) as head:
        assert head.stdout is not None and head.stderr is not None
        assert head.stdout.readline() == b"k000\tv\n"
        head.stdout.close()
        assert head.wait(120) == 0 and head.stderr.read() == b""


def test_ctrl_c_while_reading_a_terminal_or_a_pipe_exits_130(shared: Daemon, ledger: str) -> None:
    """Ctrl-C at ``rm``'s question, or during a ``put`` waiting for more of standard input,
    exits 130 at once. Before, the read went on in a thread that the interpreter joined at
    exit: ``ledgerctl`` hung until the terminal or pipe gave it a line or an end."""
    seed(shared, ledger, "p", [(b"k", b"v", "eager")])
    master, slave = os.openpty()
    r, w = os.pipe()
    procs: list[subprocess.Popen[bytes]] = []
    try:
        rm = subprocess.Popen(
            cli_cmd("rm", ledger), stdin=slave, stderr=slave, env=cli_env(shared.socket), cwd=ROOT
        )
        procs.append(rm)
        shown, deadline = b"", time.monotonic() + 60
        while b"[y/N]" not in shown:
            ready, _, _ = select.select([master], [], [], max(0.0, deadline - time.monotonic()))
            assert ready, f"no question; showed {shown!r}"
            shown += os.read(master, 4096)
        rm.send_signal(signal.SIGINT)
        assert rm.wait(30) == 130

        put = subprocess.Popen(
            cli_cmd("put", ledger, "p", "typed"),
            stdin=r,
            stderr=subprocess.DEVNULL,
            env=cli_env(shared.socket),
            cwd=ROOT,
        )
        procs.append(put)
        os.write(w, b"the first part")
        unread, deadline = array.array("i", [1]), time.monotonic() + 60
        while unread[0]:  # until ledgerctl has read it, and waits for more
            assert time.monotonic() < deadline and put.poll() is None
            fcntl.ioctl(w, termios.FIONREAD, unread)
            time.sleep(0.01)
        put.send_signal(signal.SIGINT)
        assert put.wait(30) == 130
    finally:
        for p in procs:
            p.kill()
            p.wait()
        for fd in (master, slave, r, w):
            os.close(fd)
    assert ctl(shared, "pages", ledger) == b"p\n"  # nothing deleted, nothing put
    ctl_fails(shared, 1, "get", ledger, "p", "typed")


# -- readable names ----------------------------------------------------------------


def test_names_print_as_text_or_hex(shared: Daemon, ledger: str) -> None:
    for page in (b"\xff\xfe", "é".encode(), b"tab\there", b"hex:1"):
        seed(shared, ledger, page, [(b"k", b"v", "eager")])
    pages, pages_hex, du = outputs(
        ctl_all(
            shared, ["pages", ledger], ["pages", ledger.encode().hex(), "--hex"], ["du", ledger]
        )
    )
    # Printable UTF-8 as text; anything else (or text that could be read as hex) as hex.
    assert pages.decode().splitlines() == [
        "hex:6865783a31",  # "hex:1"
        "hex:7461620968657265",  # "tab\there"
        "é",
        "hex:fffe",
    ]
    assert pages_hex.decode().splitlines() == ["6865783a31", "7461620968657265", "c3a9", "fffe"]
    lines = du.decode().splitlines()
    assert lines[-1].split()[:5] == ["8", "bytes", "4", "entries", "total"]
    # A page's one entry is "1 entry", and the names still start in one column.
    assert [line.split()[:4] for line in lines[:-1]] == [["2", "bytes", "1", "entry"]] * 4
    assert len({line.index(ledger) for line in lines[:-1]} | {lines[-1].index("total")}) == 1
    # What was printed, given back with --hex, is the page.
    assert ctl(shared, "--hex", "get", ledger.encode().hex(), "fffe", "6b") == b"v"


# -- no binary on a terminal -------------------------------------------------------


def test_get_writes_no_binary_to_a_terminal(shared: Daemon, ledger: str, tmp_path: Path) -> None:
    seed(
        shared,
        ledger,
        "p",
        [
            (b"bin", b"\x1b]0;owned\x07\x00\xff", "eager"),
            (b"text", "héllo\n".encode(), "eager"),
            (b"bare", b"hello world", "eager"),
            (b"empty", b"", "eager"),
        ],
    )
    code, shown, _ = run_tty(shared, "get", ledger, "p", "bin", stdout=True)
    assert code == 2, shown
    assert shown == (
        b"ledgerctl: the value is binary: not written to a terminal "
        b"(use -o FILE, a pipe, or --force)\r\n"
    )
    code, shown, _ = run_tty(shared, "get", ledger, "p", "text", stdout=True)
    assert (code, shown) == (0, "héllo\r\n".encode())
    # Text without a final newline gets one on a terminal (so the prompt starts a line
    # of its own); a pipe gets the value's bytes exactly.
    code, shown, _ = run_tty(shared, "get", ledger, "p", "bare", stdout=True)
    assert (code, shown) == (0, b"hello world\r\n")
    assert ctl(shared, "get", ledger, "p", "bare") == b"hello world"
    code, shown, _ = run_tty(shared, "get", ledger, "p", "empty", stdout=True)
    assert (code, shown) == (0, b"")
    code, shown, _ = run_tty(shared, "get", ledger, "p", "bin", "--force", stdout=True)
    assert (code, shown) == (0, b"\x1b]0;owned\x07\x00\xff")
    assert ctl(shared, "get", ledger, "p", "bin") == b"\x1b]0;owned\x07\x00\xff"  # a pipe


# -- the command line --------------------------------------------------------------


def test_options_after_the_command(shared: Daemon, ledger: str) -> None:
    seed(shared, ledger, b"\x00", [(b"\x01", b"v", "eager")])
    lh = ledger.encode().hex()
    got, listed = outputs(
        ctl_all(
            shared,
            ["get", lh, "00", "01", "--hex"],
            ["ls", lh, "00", "--hex", "--socket", str(shared.socket)],
        )
    )
    assert (got, listed) == (b"v", b"01\t76\n")


def test_common_options_after_doc_check_and_gc(shared: Daemon, ledger: str) -> None:
    """``--socket``, ``--hex``, ``--tuple`` and ``--json`` go after ``doc`` (and its
    subcommands), ``check``, ``gc`` and ``evict`` too, and a ``--json`` given before the
    command is not undone by the command's own. Before, these commands refused them after
    their name (``unrecognized arguments: --socket (did you mean '--socket'?)``), and
    ``ledgerctl --json check`` printed the summary."""
    sock = str(shared.socket)
    doc_id = ctl(shared, "doc", "put", ledger, "p", "c", '{"v": 1}').split()[0].decode()
    lh = ledger.encode().hex()
    listed, hexed, under, checked, checked_json, collected = outputs(
        ctl_all(
            shared,
            ["doc", "ls", ledger, "p", "c", "--socket", sock, "--json"],
            ["doc", "ls", lh, "70", "c", "--hex"],
            ["doc", "--socket", sock, "get", ledger, "p", "c", doc_id],
            ["check", ledger, "p", "--socket", sock],
            ["--json", "check", ledger, "p"],
            ["--json", "gc", ledger, "p"],
        )
    )
    assert json_lines(listed)[0]["_meta"]["_id"] == doc_id
    assert hexed.decode().split("\t")[0] == doc_id
    assert json.loads(under)["_data"] == {"v": 1}
    assert checked.startswith(b"checked 1 page: healthy; 0 problems, 0 repaired\n")  # (1 page)
    assert json.loads(checked_json)["healthy"] is True
    assert json.loads(collected)["collected_pages"] == 1
    err = ctl_fails(shared, 4, "evict", ledger, "p", "--socket", sock)
    assert "(not_evictable)" in err


def test_check_and_gc_json_is_one_compact_line(shared: Daemon, ledger: str) -> None:
    """``check --json``, ``gc --json`` and ``doc get --json`` print one thing, so one
    compact line (as docs/cli.md's ``--json`` convention says); before, they printed
    indented JSON. ``doc get`` without ``--json`` still indents the document."""
    doc_id = ctl(shared, "doc", "put", ledger, "p", "c", '{"v": 1}').split()[0].decode()
    checked, collected, got, shown = outputs(
        ctl_all(
            shared,
            ["check", ledger, "p", "--json"],
            ["--json", "gc", ledger, "p"],
            ["doc", "get", ledger, "p", "c", doc_id, "--json"],
            ["doc", "get", ledger, "p", "c", doc_id],
        )
    )
    assert [d["healthy"] for d in json_lines(checked)] == [True]
    assert [d["collected_pages"] for d in json_lines(collected)] == [1]
    assert [d["_data"] for d in json_lines(got)] == [{"v": 1}]
    assert json.loads(shown) == json.loads(got) and shown.count(b"\n") > 1


def test_version_without_a_daemon(tmp_path: Path) -> None:
    p = subprocess.run(
        cli_cmd("version"),
        capture_output=True,
        env=cli_env(tmp_path / "none.sock"),
        cwd=ROOT,
        timeout=60,
    )
    assert p.returncode == 3, p
    assert p.stdout.decode() == f"ledgerctl {__version__}\nledgerd   not reachable\n"


def test_did_you_mean(tmp_path: Path) -> None:
    def run(*args: str) -> subprocess.CompletedProcess[bytes]:
        return subprocess.run(
            cli_cmd(*args), capture_output=True, env=cli_env(tmp_path / "s"), cwd=ROOT, timeout=60
        )

    p = run("lss", "l", "p")
    assert p.returncode == 2 and p.stdout == b""
    assert p.stderr.decode().endswith("ledgerctl: error: no command 'lss'; did you mean 'ls'?\n")
    p = run("ls", "l", "p", "--prfix", "a")
    assert p.returncode == 2
    assert "unrecognized arguments: --prfix a (did you mean '--prefix'?)" in p.stderr.decode()
    p = run("frobnicate")
    assert p.returncode == 2 and p.stderr.decode().endswith("no command 'frobnicate'\n")
    p = run("doc", "lss", "l", "p", "c")  # a subcommand, too
    assert p.stderr.decode().endswith(
        "ledgerctl doc: error: no command 'lss'; did you mean 'ls'?\n"
    )
    # An option of another command: no "did you mean" naming the option as typed.
    p = run("ls", "l", "p", "--lazy")
    assert p.returncode == 2
    assert p.stderr.decode().endswith(
        "unrecognized arguments: --lazy ('--lazy' is not an option of this command)\n"
    )


def test_no_arguments_print_the_help(tmp_path: Path) -> None:
    p = subprocess.run(
        cli_cmd(), capture_output=True, env=cli_env(tmp_path / "s"), cwd=ROOT, timeout=60
    )
    assert (p.returncode, p.stderr) == (0, b""), p
    out = p.stdout.decode()
    assert out.startswith("usage: ledgerctl") and "positional arguments:" in out
    assert "status" in out and "watch" in out and "Exit status:" in out


def _commands(p: argparse.ArgumentParser, path: str = "") -> Iterator[tuple[str, Any]]:
    for action in p._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, q in action.choices.items():
                yield f"{path} {name}".strip(), q
                yield from _commands(q, f"{path} {name}")


def test_every_commands_help_has_an_example_and_describes_its_arguments() -> None:
    from ledgerd.daemon.cli import parser

    commands = dict(_commands(parser()))
    assert {"get", "watch", "doc", "doc find", "check", "gc", "evict"} <= set(commands)
    for path, q in commands.items():
        text = q.format_help()
        assert re.search(f"\nexample:\n  ledgerctl {path}\\s", text), (path, text)
        for action in q._actions:
            if not action.option_strings and not isinstance(action, argparse._SubParsersAction):
                assert action.help, (path, action.dest)
    p = subprocess.run(cli_cmd("get", "--help"), capture_output=True, cwd=ROOT, timeout=60)
    assert p.returncode == 0 and b"  key    " in p.stdout and b"example:" in p.stdout, p


def test_quiet_leaves_out_informational_lines(shared: Daemon, ledger: str) -> None:
    line = json_line(b"k", b"v")
    p = shared.ledgerctl("import", ledger, "p", input=line)
    assert (p.returncode, p.stderr) == (0, b"imported 1 entry\n"), p
    for args in (["-q", "import", ledger, "p"], ["import", "--quiet", ledger, "p"]):
        p = shared.ledgerctl(*args, input=line)
        assert (p.returncode, p.stdout, p.stderr) == (0, b"", b""), p


def test_shell_completion(shared: Daemon, ledger: str, tmp_path: Path) -> None:
    """argcomplete: commands, options, and ledger names asked of the running daemon."""
    seed(shared, ledger, "page-one", [(b"k", b"v", "eager")])

    def complete(line: str) -> set[str]:
        out = tmp_path / "completions"
        env = {
            **cli_env(shared.socket),
            "_ARGCOMPLETE": "1",
            "_ARGCOMPLETE_IFS": "\n",
            "COMP_LINE": line,
            "COMP_POINT": str(len(line)),
            "_ARGCOMPLETE_STDOUT_FILENAME": str(out),
        }
        p = subprocess.run(cli_cmd(), capture_output=True, env=env, cwd=ROOT, timeout=60)
        assert p.returncode == 0, p
        return {c.strip() for c in out.read_text().split("\n")} - {""}

    assert {"ls", "log"} <= complete("ledgerctl l")
    assert complete("ledgerctl ls x y --pre") == {"--prefix"}
    assert complete(f"ledgerctl pages {ledger[:-2]}") == {ledger}
    assert complete(f"ledgerctl ls {ledger} page-") == {"page-one"}


# -- progress ----------------------------------------------------------------------


def test_progress_on_a_terminal_for_import_and_export(
    shared: Daemon, ledger: str, tmp_path: Path
) -> None:
    rng = random.Random(4)
    dump = tmp_path / "dump.jsonl"
    dump.write_bytes(b"".join(json_line(b"k%05d" % i, rng.randbytes(4000)) for i in range(2200)))
    assert dump.stat().st_size > 8 * MiB

    code, shown, _ = run_tty(shared, "import", ledger, "p", str(dump))
    text = shown.decode()
    assert code == 0, text
    assert re.search(r"import: 100%\|█+\| [\d.]+M/[\d.]+M \[.*B/s, 2200 entries\]", text), text
    assert text.endswith("imported 2200 entries\r\n"), text

    code, shown, out = run_tty(shared, "export", ledger, "p")
    text = shown.decode()
    assert code == 0 and re.search(r"export: 2200 entries \[\d\d:\d\d, [\d.]+ entries/s\]", text)
    assert json_lines(out) == [json.loads(x) for x in dump.read_bytes().splitlines()]

    # Not a terminal: nothing but the command's own output.
    p = shared.ledgerctl("import", ledger, "q", str(dump))
    assert (p.returncode, p.stderr) == (0, b"imported 2200 entries\n"), p
    assert ctl(shared, "export", ledger, "q") == out


def test_progress_of_a_put_from_stdin(shared: Daemon, ledger: str) -> None:
    data = random.Random(6).randbytes(9 * MiB)
    code, shown, _ = run_tty(shared, "put", ledger, "p", "k", input=data)
    assert code == 0, shown
    # The size is not known: the amount and the rate.
    assert re.search(r"put: [\d.]+MB \[\d\d:\d\d, .*B/s\]", shown.decode()), shown
    with Client(shared.socket) as c:
        assert c.get(ledger, "p", b"k") == data


# -- status: the sync object -------------------------------------------------------


def test_status_shows_every_sync_problem() -> None:
    def b(x: bytes) -> str:
        return base64.b64encode(x).decode()

    page = {"ledger": b(b"notes"), "page": b(b"\xff"), "ledger_text": "notes", "page_text": None}
    st = {
        "version": "0.1.0",
        "pid": 7,
        "device_id": "d" * 32,
        "data_dir": "/data",
        "uptime_s": 3.2,
        "cloud": "s3://b/p",
        "sync_error": None,
        "sync": {
            "bucket_error": "no bucket at s3://b/p",
            "round_error": "timed out",
            "pending_uploads": 2,
            "pages": [{**page, "error": "corrupt pack x", "last_sync": None}],
            "packs": [
                {
                    **page,
                    "pack": "packs/aa/1.pack",
                    "device": "aa",
                    "seq": 1,
                    "state": "waiting",
                    "error": "needs objects",
                    "since": 0.0,
                    "attempts": 3,
                    "retry_in_s": 12.4,
                }
            ],
            "gaps": [{"device": "bb", "first_seq": 4, "last_seq": 6, "since": 86400.0}],
            "devices": [{"device": "cc", "error": "unreadable log"}],
            "clock_skew": [{"device": "dd", "ahead_s": 3600.2, "seen_at": 60.0}],
        },
        "open_pages": [
            {
                **page,
                "heads": 1,
                "conflicts": 2,
                "policy": "automatic_with_fallback",
                "conflict": "2 keys need a conflict resolver",
                "sync": "pending",
                "unuploaded_writes": True,
                "last_sync": None,
                "last_error": None,
            }
        ],
    }
    assert status_lines(st)[4:] == [
        "bucket   error: no bucket at s3://b/p",
        "sync     last round failed: timed out",
        "sync     2 pages waiting to upload",
        "sync     page notes/hex:ff: corrupt pack x",
        "held     pack packs/aa/1.pack for notes/hex:ff (waiting, 3 attempts, retry in 12s):"
        " needs objects",
        "gap      device bb packs 4-6 missing since 1970-01-02T00:00:00+00:00",
        "device   cc: unreadable log",
        # Writes, not commits, carry the other device's clock (commits stay local).
        "clock    device dd is 3600s ahead of this one (seen 1970-01-01T00:01:00+00:00)",
        "page     notes/hex:ff  conflicts=2  writes not uploaded"
        "  conflict: 2 keys need a conflict resolver",
    ]


def test_status_says_a_failed_round_once() -> None:
    # The daemon's sync_error is the last round's error: one line, not two.
    st = {
        "version": "0",
        "pid": 1,
        "device_id": "d",
        "data_dir": "/data",
        "uptime_s": 1.0,
        "cloud": "s3://b/p",
        "sync_error": "Connection refused",
        "sync": {"bucket_error": None, "round_error": "Connection refused"},
        "open_pages": [],
    }
    assert status_lines(st)[4:] == ["sync     last round failed: Connection refused"]
    st["sync"] = {"bucket_error": None, "round_error": None}
    assert status_lines(st)[4:] == ["sync     error: Connection refused"]


def test_status_of_a_held_pack_whose_pages_are_unknown() -> None:
    # A pack refused before its index was read (a corrupt object, or another
    # device's sealed pack) names no ledger or page: status says so, no traceback.
    held = {
        "pack": "packs/1.aa.1.10.20",
        "device": "aa",
        "seq": 1,
        "state": "refused",
        "error": "refused: CorruptPackError: not a pack",
        "since": 0.0,
        "attempts": 1,
        "retry_in_s": 0.0,
        "ledger": None,
        "page": None,
        "ledger_text": None,
        "page_text": None,
    }
    assert sync_lines({"packs": [held]}) == [
        "held     pack packs/1.aa.1.10.20 (refused, 1 attempt): "
        "refused: CorruptPackError: not a pack"
    ]


def test_status_with_a_corrupt_object_in_the_bucket(short_tmp: Path) -> None:
    bucket = short_tmp / "bucket"
    d = start_daemon(short_tmp / "d", "--cloud", f"file://{bucket}")
    try:
        ctl(d, "put", "notes", "inbox", "k", "v")
        assert d.ledgerctl("sync").returncode == 0
        name = f"packs/{int(time.time() * 1000):013d}.{'ab' * 16}.{1:016d}.96.200"
        (bucket / name).write_bytes(b"not a pack at all, by hand")
        ctl_fails(d, 4, "sync")
        out = d.ledgerctl("status")
        assert out.returncode == 0, out.stderr
        assert f"held     pack {name} (refused, " in out.stdout.decode(), out.stdout
    finally:
        assert d.stop() == 0


def test_status_of_a_daemon_whose_bucket_went_away(short_tmp: Path) -> None:
    bucket = short_tmp / "bucket"
    d = start_daemon(short_tmp / "d", "--cloud", f"file://{bucket}")
    try:
        assert d.ledgerctl("sync").returncode == 0
        shutil.rmtree(bucket)
        err = ctl_fails(d, 4, "sync")
        assert "sync failed: the bucket has no ledgerd-bucket marker" in err, err
        st = json.loads(ctl(d, "status", "--json"))
        problem = st["sync"]["bucket_error"]
        assert problem.startswith("the bucket has no ledgerd-bucket marker"), st
        text = ctl(d, "status").decode()
        assert text.count(problem) == 1, text  # said once, on its own line
        assert f"\nbucket   error: {problem}\n" in text, text
    finally:
        assert d.stop() == 0


def test_progress_of_sync(short_tmp: Path) -> None:
    """``sync`` on a terminal: pages uploaded out of those waiting; on a pipe, no bar."""
    env = {  # left to sync (but for the round the first write starts at once)
        "LEDGERD_SYNC_DEBOUNCE": "600",
        "LEDGERD_SYNC_INTERVAL": "600",
        "LEDGERD_SYNC_INTERVAL_MAX": "600",
    }
    d = start_daemon(short_tmp / "d", "--cloud", f"file://{short_tmp}/bucket", env=env)
    try:

        def pending() -> int:
            return int(json.loads(ctl(d, "status", "--json"))["sync"]["pending_uploads"])

        seed(d, "l", "a", [(b"k", b"v", "eager")])
        deadline = time.monotonic() + 60
        while pending():  # the round the first write starts, done: the rest wait
            assert time.monotonic() < deadline, "the first write's round never ended"
            time.sleep(0.05)
        for page in ("b", "c"):
            seed(d, "l", page, [(b"k", b"v", "eager")])
        assert pending() == 2
        code, shown, _ = run_tty(d, "sync")
        text = shown.decode()
        assert code == 0, text
        assert re.search(r"sync: 100%\|█+\| (\d)/\1 \[.* pages/s\]", text), text
        assert re.search(r"\r\nsynced: \d+ packs? up, 0 down, \d+ rounds?\r\n$", text), text
        seed(d, "l", "a", [(b"k2", b"v", "eager")])
        p = d.ledgerctl("sync")
        assert p.returncode == 0 and re.fullmatch(rb"synced: [^\r]*\n", p.stderr), p
    finally:
        assert d.stop() == 0


@pytest.mark.parametrize("text", ["1_0", "١", "１", " 2", "+2", "2 ", "0x10"])
def test_a_limit_is_ascii_digits(text: str) -> None:
    """`--limit 1_0` listed 10 entries and `--limit ١` one: int() reads underscores,
    blanks and every script's digits, and the daemon's ?limit= takes none of them."""
    with pytest.raises(argparse.ArgumentTypeError, match="is not an integer"):
        positive_int(text)
    assert positive_int("10") == 10


def test_counts_in_messages_agree_with_their_number() -> None:
    assert [counted(n, "page") for n in (0, 1, 2)] == ["0 pages", "1 page", "2 pages"]
