"""``ledgerctl``'s entry point, and its quick path: ``get`` and ``put`` of a small value.

A ``ledgerctl`` that imports asyncio, aiohttp and the store to read a few bytes spends
most of its time importing (``bench/cli.py`` measures it next to curl). So the
``ledgerctl`` command starts here, with nothing but the standard library's basics
loaded: :func:`quick_args` recognizes the plainest ``get`` and ``put`` command lines
(:func:`main` hands every other one, whole, to :mod:`ledgerd.daemon.cli`), and
:func:`quick_get` asks the daemon for the value with one HTTP/1.1 request on a
blocking socket. Only a 200 answer with a ``Content-Length`` of at most
:data:`QUICK_MAX` bytes is printed here; anything else (an error, a large value, a
connection that fails or drops, a binary value on a terminal) goes to the full
command, which asks again and reports it, so that both paths print the same.
:func:`quick_put` sends ``put LEDGER PAGE KEY VALUE`` (a value given on the command
line) likewise, and ends quietly on a 2xx answer, as the full command does; anything
else goes to the full command, which sends it again (a put of the same value twice
leaves the same value) and reports what it gets. What is shared by both, the terminal
check and the exit statuses, lives here.

Its imports are few on purpose: ``socket`` (with ``enum`` and ``selectors``) and ``re``
took longer to import than the request took to answer, so the request goes through
``_socket``, the C module that ``socket`` wraps, and the terminal check through
``str.translate``.
"""

from __future__ import annotations

import _socket
import codecs
import os
import sys

from ledgerd.daemon.client_urls import quote
from ledgerd.daemon.socketdir import socket_dir_problem, socket_file

EXIT_NOT_FOUND, EXIT_USAGE, EXIT_UNAVAILABLE, EXIT_ERROR, EXIT_DAMAGED = 1, 2, 3, 4, 5
EXIT_INTERRUPTED = 130
QUICK_MAX = 1024 * 1024
"""The largest value the quick path prints (a larger one may want a progress bar)."""
HEX_DIGITS = "0123456789abcdefABCDEF"
_CONTROL = dict.fromkeys([*range(0x00, 0x09), 0x0B, 0x0C, *range(0x0E, 0x20), *range(0x7F, 0xA0)])
"""Characters that a terminal may act on: a value holding any is not written to one
(a ``str.translate`` table that drops them: ``re`` takes longer to import)."""
_VALUED = {"--socket": "socket", "--at": "at"}
"""The options with a value that the quick path takes (``--at`` after ``get`` only)."""


class UsageError(Exception):
    """The command line is wrong (exit status 2)."""


class TerminalGuard:
    """Lets text through to a terminal and stops at the first sign of binary data; text
    that does not end a line is ended with a newline there (a pipe gets the value's
    bytes exactly), so that the shell's prompt starts a line of its own."""

    def __init__(self) -> None:
        self.decoder = codecs.getincrementaldecoder("utf-8")()
        self.last = b""

    def tail(self) -> bytes:
        """What to write after the value: a newline if it did not end with one."""
        return b"\n" if self.last and not self.last.endswith(b"\n") else b""

    def check(self, chunk: bytes, final: bool = False) -> None:
        if chunk:
            self.last = chunk
        try:
            text = self.decoder.decode(chunk, final)
        except UnicodeDecodeError:
            text = "\x00"
        if len(text.translate(_CONTROL)) != len(text):
            raise UsageError(
                "the value is binary: not written to a terminal (use -o FILE, a pipe, or --force)"
            )


class QuickGet:
    """A ``get`` command line the quick path runs: what ``ledgerctl``'s parser would make
    of it (tests/daemon/test_cli_quick.py checks that they agree). A plain class: typing
    and dataclasses each take longer to import than the rest of the quick path."""

    __slots__ = ("command", "ledger", "page", "key", "value", "socket", "at", "force")

    def __init__(
        self,
        ledger: str,
        page: str,
        key: str,
        socket: str | None,
        at: str | None,
        force: bool,
        value: str | None = None,
    ) -> None:
        self.command = "get" if value is None else "put"
        self.ledger, self.page, self.key, self.value = ledger, page, key, value
        self.socket, self.at, self.force = socket, at, force


def quick_args(argv: list[str]) -> QuickGet | None:
    """``argv`` as a :class:`QuickGet` when it is ``get LEDGER PAGE KEY`` with at most
    ``--socket PATH`` (before or after ``get``), ``--at COMMIT`` and ``--force`` (after
    it), each once, or ``put LEDGER PAGE KEY VALUE`` with at most ``--socket PATH``;
    None for every other command line, left to the full parser."""
    values: dict[str, str] = {}
    force, command, put = False, False, False
    positional: list[str] = []
    words = iter(argv)
    for word in words:
        name, given, value = word.partition("=")
        if name in _VALUED:
            if not given:
                value = next(words, "-")
            if value.startswith("-") or _VALUED[name] in values:
                return None  # (an option's value that looks like an option: argparse's call)
            if name == "--at" and not command:
                return None
            if put and 0 < len(positional) < 4:
                return None  # (argparse gives the optional VALUE nothing before an option)
            values[_VALUED[name]] = value
        elif word == "--force" and command and not force:
            force = True
        elif word.startswith("-"):
            return None  # any other option, "-" and "--" included
        elif not command:
            if word not in ("get", "put"):
                return None
            command, put = True, word == "put"
        else:
            positional.append(word)
    at = values.get("at")
    if values.get("socket") == "":
        return None
    if put:
        if len(positional) != 4 or at is not None or force:
            return None
        ledger, page, key, value = positional
        return QuickGet(ledger, page, key, values.get("socket"), None, False, value)
    if len(positional) != 3:
        return None
    if at is not None and (not at or at.strip(HEX_DIGITS)):
        return None
    ledger, page, key = positional
    return QuickGet(ledger, page, key, values.get("socket"), at, force)


def _fetch(path: str, target: str, put: bytes | None = None) -> bytes | None:
    """The body of the daemon's 200 answer to ``GET target``, when it has a
    ``Content-Length`` of at most :data:`QUICK_MAX`; None for anything else. With
    ``put``, a ``PUT target`` of those bytes instead: ``b""`` on a 2xx answer."""
    s = _socket.socket(_socket.AF_UNIX, _socket.SOCK_STREAM)
    try:
        s.settimeout(10)  # to connect (as the clients' sock_connect); then no limit
        try:
            s.connect(path)
        except OSError:
            return None
        s.settimeout(None)
        if put is None:
            request = f"GET {target} HTTP/1.1\r\nHost: ledgerd\r\nConnection: close\r\n\r\n"
        else:
            request = (
                f"PUT {target} HTTP/1.1\r\nHost: ledgerd\r\nConnection: close\r\n"
                "Content-Type: application/octet-stream\r\n"
                f"Content-Length: {len(put)}\r\n\r\n"
            )
        s.sendall(request.encode("ascii") + (put or b""))
        data = b""
        while b"\r\n\r\n" not in data:
            chunk = s.recv(65536)
            if not chunk or len(data) > 65536:
                return None
            data += chunk
        head, _, body = data.partition(b"\r\n\r\n")
        status, *headers = head.split(b"\r\n")
        if put is not None:
            code = status[9:13]  # "2xx "
            ok = code[:1] == b"2" and code[1:3].isdigit() and code[3:] == b" "
            return b"" if status.startswith(b"HTTP/1.1 ") and ok else None
        if not status.startswith(b"HTTP/1.1 200 "):
            return None
        length: int | None = None
        for line in headers:
            name, colon, value = line.partition(b":")
            name, value = name.strip().lower(), value.strip()
            if not colon or name == b"transfer-encoding":
                return None
            if name == b"content-length":
                if length is not None or not value.isdigit():
                    return None
                length = int(value)
        if length is None or length > QUICK_MAX:
            return None
        while len(body) < length:
            chunk = s.recv(65536)
            if not chunk:
                return None  # cut short: the full path asks again and says why
            body += chunk
        return body if len(body) == length else None
    finally:
        s.close()


def quick_get(q: QuickGet) -> int | None:
    """Run ``q``: its exit status, or None to leave it to the full command."""
    out = sys.stdout
    if out is None:
        return None
    sock = socket_file(q.socket)
    if socket_dir_problem(sock):
        return None
    target = "/v1/ledgers/{}/pages/{}/keys/{}".format(
        *(quote(os.fsencode(x)) for x in (q.ledger, q.page, q.key))
    )
    if q.value is not None:
        return None if _fetch(sock, target, os.fsencode(q.value)) is None else 0
    if q.at is not None:
        target += "?at=" + quote(q.at)
    value = _fetch(sock, target)
    if value is None:
        return None
    tail = b""
    if not q.force and out.isatty():
        guard = TerminalGuard()
        try:
            guard.check(value, final=True)
        except UsageError:
            return None
        tail = guard.tail()
    try:
        out.buffer.write(value + tail)
        out.flush()
    except OSError as e:
        return output_failed(e)
    return 0


def output_failed(e: OSError) -> int:
    """The exit status of a failed write to standard output (or another local file):
    a closed pipe (``ledgerctl get | head``) is a normal end; anything else is one line
    on stderr."""
    try:
        if isinstance(e, BrokenPipeError):
            sys.stdout.close()
        else:  # what is still buffered goes to /dev/null, so that Python's flush at exit
            # does not fail again (and print a traceback)
            os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
    except Exception:  # (contextlib.suppress: an import the quick path does without)
        pass
    if isinstance(e, BrokenPipeError):
        return 0
    where = f"{e.filename}: " if e.filename else ""
    print(f"ledgerctl: {where}a local read or write failed: {e.strerror or e}", file=sys.stderr)
    return EXIT_USAGE


def main(argv: list[str] | None = None) -> int:
    """``ledgerctl``: the quick path when it applies, else the full command."""
    args = sys.argv[1:] if argv is None else argv
    if "_ARGCOMPLETE" not in os.environ and (q := quick_args(args)) is not None:
        try:
            code = quick_get(q)
        except KeyboardInterrupt:
            return EXIT_INTERRUPTED
        if code is not None:
            return code
    from ledgerd.daemon import cli

    return cli.main(argv)


if __name__ == "__main__":
    sys.exit(main())
