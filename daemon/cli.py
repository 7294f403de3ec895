# PYTHON_ARGCOMPLETE_OK  (argcomplete looks for this in the first 1024 bytes)
"""``ledgerctl``: the command-line client of ledgerd.

The ``ledgerctl`` command starts in :mod:`ledgerd.daemon.cli_quick`, which prints a small
``get`` itself and hands every other command line to :func:`main` here. This module runs
one command line: it parses it (:mod:`ledgerd.daemon.cli_parser`), runs its command
(:mod:`ledgerd.daemon.cli_commands`, or a module of its own such as
:mod:`ledgerd.daemon.cli_doc`) and turns what fails into one line on stderr and an exit
status (:mod:`ledgerd.daemon.cli_exit`). How arguments become bytes and bytes become
text or JSON is :mod:`ledgerd.daemon.cli_format`'s.

Keys, ledger names and page ids are the exact bytes given on the command line
(``os.fsencode``: UTF-8, or raw bytes that are not), hex with ``--hex``, or, for keys,
tuple literals with ``--tuple``. The daemon is found through ``--socket``,
``$LEDGERD_SOCKET`` or the daemon's default socket path.

Exit status: 0 success, 1 not found, 2 bad usage or bad input (local files and an
unsafe socket directory included), 3 the daemon cannot be reached or went away
mid-request, 4 any other error reported by the daemon (a conflict, data unavailable,
a full disk...), 5 the data read is damaged (``corrupt``), 130 interrupted.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import sys

from ledgerd.daemon import cli_doc
from ledgerd.daemon.cli_command import typed
from ledgerd.daemon.cli_commands import Cli
from ledgerd.daemon.cli_exit import (
    EXIT_DAMAGED,
    EXIT_ERROR,
    EXIT_INTERRUPTED,
    EXIT_NOT_FOUND,
    EXIT_UNAVAILABLE,
    EXIT_USAGE,
    output_failed,
)
from ledgerd.daemon.cli_format import UsageError
from ledgerd.daemon.cli_parser import parser as parser  # (the tests' and docs' parser, from here)
from ledgerd.daemon.client import (
    AsyncClient,
    DaemonUnavailableError,
    LedgerError,
    NotFoundError,
    UnsafeSocketError,
)
from ledgerd.daemon.client_types import NOT_A_SOCKET

REPAIR_HINT = (
    "'ledgerctl check --repair' fetches damaged synced data again from the bucket "
    "(see docs/operations.md, Check and repair)"
)


def _not_found(e: NotFoundError, args: argparse.Namespace) -> str:
    """What was not found, named as the user gave it, with a hint when it looks like a
    name ledgerctl printed as ``hex:...`` pasted back without ``--hex``."""
    return _not_found_text(e, args) + _hex_hint(args)


def _hex_hint(args: argparse.Namespace) -> str:
    if getattr(args, "hex", False):
        return ""
    for name in ("ledger", "page", "key"):
        given = getattr(args, name, None)
        if isinstance(given, str) and given.startswith("hex:"):
            return f" (to name {given}, give {given[4:]} with --hex)"
    return ""


def _not_found_text(e: NotFoundError, args: argparse.Namespace) -> str:
    where = f"{typed(args, 'ledger')}/{typed(args, 'page')}"
    if e.code == "key_not_found" and getattr(args, "key", None) is not None:
        return f"key {typed(args, 'key')} is not in {where}"
    if e.code == "page_not_found" and getattr(args, "page", None) is not None:
        return f"no page {typed(args, 'page')} in ledger {typed(args, 'ledger')}"
    if e.code == "ledger_not_found" and getattr(args, "ledger", None) is not None:
        return f"no ledger {typed(args, 'ledger')}"
    if e.code == "commit_not_found" and getattr(args, "at", None) is not None:
        return f"commit {args.at} is not in {where}"
    return f"{e} ({e.code})"


async def run(args: argparse.Namespace) -> int:
    if args.socket == "":  # (not left out: given empty, e.g. an unset variable)
        raise UsageError("--socket: the path is empty")
    async with AsyncClient(args.socket) as client:
        if (handler := getattr(args, "handler", None)) is not None:  # see parser()
            return int(await handler(args, client))
        cli = Cli(args, client)
        if args.command == "doc":  # ledgerctl doc ... (daemon/cli_doc.py)
            return await cli_doc.run(cli, UsageError)
        name = {"import": "import_"}.get(args.command, args.command)
        return int(await getattr(cli, name)())


def _unreachable(e: DaemonUnavailableError, args: argparse.Namespace) -> str:
    """The message for a daemon that cannot be reached (what failed: the clients leave
    out aiohttp's host and TLS details) and a hint that names the socket the user gave,
    if any."""
    text = str(e)
    if NOT_A_SOCKET in text:  # (ledgerd would not start there: the reason says what to do)
        return text
    if args.socket:
        hint = f"is ledgerd running there? start it with: ledgerd --socket {args.socket}"
    elif os.environ.get("LEDGERD_SOCKET"):
        hint = "is ledgerd running there? $LEDGERD_SOCKET chose it; start it with: ledgerd"
    else:
        hint = "is ledgerd running? start it with: ledgerd"
    return f"{text} ({hint})"


def _claim_closed_streams() -> None:
    """Standard input or output closed (``<&-``, ``>&-``): Python leaves it None. Its
    descriptor gets /dev/null opened the other way round, so that reading (or writing)
    it fails as a closed one does, with EBADF, and no socket opened later takes it."""
    for fd, name, flags, mode in ((0, "stdin", os.O_WRONLY, "r"), (1, "stdout", os.O_RDONLY, "w")):
        if getattr(sys, name) is None:
            with contextlib.suppress(OSError):
                null = os.open(os.devnull, flags)
                if null != fd:
                    os.dup2(null, fd)
                    os.close(null)
                setattr(sys, name, open(fd, mode, closefd=False))  # noqa: SIM115


def main(argv: list[str] | None = None) -> int:
    _claim_closed_streams()
    ap = parser()
    if "_ARGCOMPLETE" in os.environ:  # the shell asks for completions (docs/cli.md)
        import argcomplete  # (here: only completion needs it, and it slows start-up)

        argcomplete.autocomplete(ap)
    if not (sys.argv[1:] if argv is None else argv):  # no command: what there is to say
        ap.print_help()
        return 0
    args = ap.parse_args(argv)
    try:
        return asyncio.run(run(args))
    except (UsageError, UnsafeSocketError) as e:
        print(f"ledgerctl: {e}", file=sys.stderr)
        return EXIT_USAGE
    except DaemonUnavailableError as e:
        print(f"ledgerctl: {_unreachable(e, args)}", file=sys.stderr)
        return EXIT_UNAVAILABLE
    except NotFoundError as e:
        print(f"ledgerctl: {_not_found(e, args)}", file=sys.stderr)
        return EXIT_NOT_FOUND
    except LedgerError as e:
        if e.code == "corrupt":  # the daemon runs, and found the data damaged
            print(f"ledgerctl: damaged data: {e} (corrupt); {REPAIR_HINT}", file=sys.stderr)
            return EXIT_DAMAGED
        print(f"ledgerctl: {e} ({e.code})", file=sys.stderr)
        return EXIT_USAGE if e.status in (400, 413, 414, 416) else EXIT_ERROR
    except KeyboardInterrupt:
        return EXIT_INTERRUPTED
    except OSError as e:  # standard input or output (or a local file) failed
        return output_failed(e)


if __name__ == "__main__":
    sys.exit(main())
