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
leaves the same value) and reports what it gets. What both share, the terminal check
and the exit statuses, is :mod:`ledgerd.daemon.cli_exit`'s.

Its imports are few on purpose: ``socket`` (with ``enum`` and ``selectors``) and ``re``
took longer to import than the request took to answer, so the request goes through
``_socket``, the C module that ``socket`` wraps, and the terminal check through
``str.translate``.
"""

from __future__ import annotations

import _socket
import os
import sys

from ledgerd.daemon.cli_exit import (
    EXIT_INTERRUPTED,
    HEX_DIGITS,
    TerminalGuard,
    UsageError,
    output_failed,
)
from ledgerd.daemon.client_urls import quote
from ledgerd.daemon.socketdir import socket_dir_problem, socket_file

QUICK_MAX = 1024 * 1024
"""The largest value the quick path prints (a larger one may want a progress bar)."""
_VALUED = {"--socket": "socket", "--at": "at"}
"""The options with a value that the quick path takes (``--at`` after ``get`` only)."""


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
    scanned = _scan(argv)
    if scanned is None:
        return None
    put, values, force, positional = scanned
    at, sock = values.get("at"), values.get("socket")
    if sock == "":
        return None
    if put:
        if len(positional) != 4 or at is not None or force:
            return None
        ledger, page, key, value = positional
        return QuickGet(ledger, page, key, sock, None, False, value)
    if len(positional) != 3:
        return None
    if at is not None and (not at or at.strip(HEX_DIGITS)):
        return None
    ledger, page, key = positional
    return QuickGet(ledger, page, key, sock, at, force)


def _scan(argv: list[str]) -> tuple[bool, dict[str, str], bool, list[str]] | None:
    """``argv``'s words as (a put, the options' values, ``--force``, the positionals), or
    None when a word is one the quick path does not take."""
    values: dict[str, str] = {}
    force, command, put = False, False, False
    positional: list[str] = []
    words = iter(argv)
    for word in words:
        name, given, value = word.partition("=")
        if name in _VALUED:
            if not given:
                value = next(words, "-")
            if not _option_taken(name, value, values, command, put, len(positional)):
                return None
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
    return put, values, force, positional


def _option_taken(
    name: str, value: str, values: dict[str, str], command: bool, put: bool, given: int
) -> bool:
    """Whether option ``name`` with ``value`` is one the quick path takes where it stands
    (after ``command``, if any, and ``given`` positionals)."""
    if value.startswith("-") or _VALUED[name] in values:
        return False  # (an option's value that looks like an option: argparse's call)
    if name == "--at" and not command:
        return False
    # (argparse gives put's optional VALUE nothing before an option)
    return not (put and 0 < given < 4)


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
        s.sendall(_request(target, put))
        answer = _read_head(s)
        if answer is None:
            return None
        status, headers, body = answer
        if put is not None:
            code = status[9:13]  # "2xx "
            ok = code[:1] == b"2" and code[1:3].isdigit() and code[3:] == b" "
            return b"" if status.startswith(b"HTTP/1.1 ") and ok else None
        if not status.startswith(b"HTTP/1.1 200 "):
            return None
        length = _content_length(headers)
        if length is None or length > QUICK_MAX:
            return None
        return _read_body(s, body, length)
    finally:
        s.close()


def _request(target: str, put: bytes | None) -> bytes:
    """The request's bytes: a GET of ``target``, or a PUT of ``put`` there."""
    if put is None:
        request = f"GET {target} HTTP/1.1\r\nHost: ledgerd\r\nConnection: close\r\n\r\n"
    else:
        request = (
            f"PUT {target} HTTP/1.1\r\nHost: ledgerd\r\nConnection: close\r\n"
            "Content-Type: application/octet-stream\r\n"
            f"Content-Length: {len(put)}\r\n\r\n"
        )
    return request.encode("ascii") + (put or b"")


def _read_head(s: _socket.socket) -> tuple[bytes, list[bytes], bytes] | None:
    """The answer's status line, header lines and the body's first bytes; None when the
    connection ends first or the head is too long."""
    data = b""
    while b"\r\n\r\n" not in data:
        chunk = s.recv(65536)
        if not chunk or len(data) > 65536:
            return None
        data += chunk
    head, _, body = data.partition(b"\r\n\r\n")
    status, *headers = head.split(b"\r\n")
    return status, headers, body


def _content_length(headers: list[bytes]) -> int | None:
    """The one ``Content-Length`` of ``headers``; None without one, with two, with a
    ``Transfer-Encoding`` or a line that is not a header."""
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
    return length


def _read_body(s: _socket.socket, body: bytes, length: int) -> bytes | None:
    """The body, ``length`` bytes of which ``body`` came with the head; None when the
    connection ends short of it or the daemon sends more."""
    while len(body) < length:
        chunk = s.recv(65536)
        if not chunk:
            return None  # cut short: the full path asks again and says why
        body += chunk
    return body if len(body) == length else None


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
    # (imported here for start-up speed: the quick path never loads the full command)
    from ledgerd.daemon import cli

    return cli.main(argv)


if __name__ == "__main__":
    sys.exit(main())
