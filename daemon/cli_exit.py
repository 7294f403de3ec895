"""What both paths of ``ledgerctl`` share: the exit statuses, the usage error, the check
that keeps binary data off a terminal, and a failed write to standard output.

:mod:`ledgerd.daemon.cli_quick` (the quick path) and :mod:`ledgerd.daemon.cli` (the full
command) both import this module, so its imports are as few as the quick path's: no
``re`` (the terminal check is a ``str.translate``), no ``contextlib``.
"""

from __future__ import annotations

import codecs
import os
import sys

EXIT_NOT_FOUND, EXIT_USAGE, EXIT_UNAVAILABLE, EXIT_ERROR, EXIT_DAMAGED = 1, 2, 3, 4, 5
EXIT_INTERRUPTED = 130
HEX_DIGITS = "0123456789abcdefABCDEF"
_CONTROL = dict.fromkeys([*range(0x00, 0x09), 0x0B, 0x0C, *range(0x0E, 0x20), *range(0x7F, 0xA0)])
"""Characters that a terminal may act on: a value holding any is not written to one
(a ``str.translate`` table that drops them: ``re`` takes longer to import)."""


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
