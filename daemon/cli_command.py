"""One ``ledgerctl`` command line being run: :class:`Command`, what every command reaches.

Its arguments as bytes (ledger names, page ids, keys and ranges, ``--at``), the client,
and its output (lines, ``--json`` records, notes and progress bars on stderr). The
commands themselves are :mod:`ledgerd.daemon.cli_commands`'s, ``doc``'s
:mod:`ledgerd.daemon.cli_doc`'s.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from typing import Any

from ledgerd.daemon.cli_exit import HEX_DIGITS
from ledgerd.daemon.cli_format import (
    UsageError,
    arg_bytes,
    pack_tuple,
    show,
    show_key,
    show_name,
    tuple_range,
)
from ledgerd.daemon.cli_progress import Progress
from ledgerd.daemon.client import AsyncClient


class Command:
    """One command line being run: its arguments (as bytes), the client, its output."""

    def __init__(self, args: argparse.Namespace, client: AsyncClient) -> None:
        self.a = args
        self.c = client
        self.out = sys.stdout

    # -- arguments -----------------------------------------------------------------

    def b(self, text: str, what: str = "key") -> bytes:
        """A ledger name or page id (or, without ``--tuple``, a key) as bytes."""
        return arg_bytes(text, self.a.hex, what)

    def key(self, text: str, what: str = "key") -> bytes:
        """A key argument: a packed tuple with ``--tuple``, else as :meth:`b`."""
        return pack_tuple(text, what) if self.a.tuple else self.b(text, what)

    def key_range(self) -> tuple[bytes | None, bytes | None, bytes | None]:
        """``--prefix``, ``--start``, ``--end`` as (prefix, start, end) bytes; with ``--tuple``
        a prefix is its tuple's range, narrowed by ``--start`` and ``--end``."""
        a = self.a
        start = self.key(a.start, "--start") if getattr(a, "start", None) is not None else None
        end = self.key(a.end, "--end") if getattr(a, "end", None) is not None else None
        if a.prefix is None:
            return None, start, end
        if not a.tuple:
            return self.b(a.prefix, "--prefix"), start, end
        lo, hi = tuple_range(a.prefix, "--prefix")
        return None, max(lo, start or lo), min(hi, end or hi)

    @property
    def at(self) -> str | None:
        """``--at``: a commit id or a unique prefix of one (as ``log`` prints them), checked
        to be hex digits before it goes into a URL (the daemon finds the commit)."""
        at: str | None = getattr(self.a, "at", None)
        if at is not None and (not at or at.strip(HEX_DIGITS)):
            raise UsageError(f"--at {at!r} is not a commit id (hex)")
        return at

    @property
    def lp(self) -> tuple[bytes, bytes]:
        return self.b(self.a.ledger, "ledger"), self.b(self.a.page, "page")

    # -- output --------------------------------------------------------------------

    def line(self, text: str) -> None:
        self.out.write(text + "\n")
        self.out.flush()

    def emit(self, doc: dict[str, Any]) -> None:
        """One ``--json`` record: one compact JSON object on a line of its own."""
        self.line(json.dumps(doc, separators=(",", ":")))

    def note(self, text: str, prefix: str = "ledgerctl: ") -> None:
        """An informational line on stderr (``--quiet`` leaves it out)."""
        if not self.a.quiet:
            print(prefix + text, file=sys.stderr)

    def progress(self, what: str, **kw: Any) -> Progress:
        """A progress bar on stderr (when it is a terminal; never with ``--quiet``)."""
        bar = Progress(what, **kw)
        bar.active = bar.active and not self.a.quiet
        return bar

    def show_key(self, key: bytes) -> str:
        return show_key(key, self.a.hex, self.a.tuple)

    def show_name(self, name: bytes) -> str:
        return show_name(name, self.a.hex)


def typed(args: argparse.Namespace, name: str) -> str:
    """An argument as the user typed it, printable whatever its bytes."""
    return show(os.fsencode(getattr(args, name, None) or ""))
