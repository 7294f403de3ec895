"""``ledgerctl``'s command line: the parser of every command, "did you mean", the
examples and positionals' help, and shell completion (argcomplete).

The commands that live in modules of their own (``doc``, ``check``, ``gc``, ``evict``,
``conflicts``, ``resolve``) register their parsers here through those modules.
"""

from __future__ import annotations

import argparse
import contextlib
import difflib
import re
from collections.abc import Callable
from typing import Any, NoReturn

from ledgerd.daemon import __version__, cli_check, cli_conflicts, cli_doc, cli_gc
from ledgerd.daemon.cli_format import arg_bytes, positive_int, show_name
from ledgerd.daemon.cli_status import pages_arg
from ledgerd.daemon.client import Client


class _Parser(argparse.ArgumentParser):
    """argparse, with "did you mean" on a mistyped command or option."""

    commands: tuple[str, ...] = ()
    options: frozenset[str] = frozenset()

    def error(self, message: str) -> NoReturn:
        bad = re.search(r"invalid choice: '([^']*)'", message)
        if bad and "COMMAND" in message:
            # A subcommand's parser (doc's) has no list of its own: argparse names them.
            choices = self.commands or tuple(
                re.findall(r"'([^']*)'", message.partition("choose from")[2])
            )
            message = f"no command {bad[1]!r}"
            near = difflib.get_close_matches(bad[1], choices, n=3, cutoff=0.6)
            if near:
                message += f"; did you mean {' or '.join(repr(n) for n in near)}?"
        elif message.startswith("unrecognized arguments: "):
            for word in message.split()[2:]:
                option = word.split("=")[0]
                near = difflib.get_close_matches(option, self.options, n=1)
                if word.startswith("--") and near:
                    if near[0] == option:  # (self.options: every command's)
                        message += f" ({option!r} is not an option of this command)"
                    else:
                        message += f" (did you mean {near[0]!r}?)"
                    break
        super().error(message)


def _complete_ledger(prefix: str, parsed_args: argparse.Namespace, **_: Any) -> list[str]:
    """Shell completion of a ledger name: the daemon's ledgers (none if it is not running)."""

    with contextlib.suppress(Exception), Client(getattr(parsed_args, "socket", None)) as c:
        return [show_name(n, parsed_args.hex) for n in c.ledgers()]
    return []


def _complete_page(prefix: str, parsed_args: argparse.Namespace, **_: Any) -> list[str]:

    with contextlib.suppress(Exception), Client(getattr(parsed_args, "socket", None)) as c:
        ledger = arg_bytes(parsed_args.ledger, parsed_args.hex, "ledger")
        return [show_name(n, parsed_args.hex) for n in c.pages(ledger)]
    return []


def _common(p: argparse.ArgumentParser, top: bool) -> None:
    """The options every command takes, before or after its name. After it they default
    to nothing (``SUPPRESS``), so that they never undo the same option given before it;
    a command's own ``--json`` (its own help) is kept, with that default."""
    kw: dict[str, Any] = {} if top else {"default": argparse.SUPPRESS}
    p.add_argument(
        "--socket",
        help="daemon socket (default: $LEDGERD_SOCKET or the daemon's default)",
        **kw,
    )
    p.add_argument(
        "--hex", action="store_true", help="keys, ledger names and page ids are hex", **kw
    )
    p.add_argument(
        "-q",
        "--quiet",
        action="store_true",
        help="leave out informational lines on stderr (progress, counts, waiting)",
        **kw,
    )
    p.add_argument(
        "--tuple",
        action="store_true",
        help="keys are tuple literals, e.g. '(\"user\", 42)'; listings show keys as tuples",
        **kw,
    )
    own = p._option_string_actions.get("--json")
    if own is not None:
        own.default = kw.get("default", own.default)
        return
    p.add_argument(
        "--json", action="store_true", help="print data as JSON lines (see docs/cli.md)", **kw
    )


def _common_below(p: argparse.ArgumentParser) -> None:
    """:func:`_common` on the commands that other modules register (``doc``, ``check``,
    ``gc``, ``evict``) and on their own subcommands (``doc ls``, ...)."""
    if "--socket" not in p._option_string_actions:
        _common(p, top=False)
    for action in p._actions:
        if isinstance(action, argparse._SubParsersAction):
            for q in action.choices.values():
                _common_below(q)


def parser() -> argparse.ArgumentParser:
    ap = _Parser(
        prog="ledgerctl",
        description="Command-line client of ledgerd.",
        epilog="Exit status: 0 success, 1 not found, 2 bad usage or input, 3 the daemon "
        "cannot be reached, 4 refused by the daemon (conflict, unavailable, ...), "
        "5 the data read is damaged, 130 interrupted.",
    )
    ap.add_argument("--version", action="version", version=f"ledgerctl {__version__}")
    _common(ap, top=True)
    sub = ap.add_subparsers(dest="command", required=True, metavar="COMMAND")

    def cmd(name: str, help: str, *names: str) -> argparse.ArgumentParser:
        p = sub.add_parser(name, help=help, description=help)
        for n in names:
            arg = p.add_argument(n)
            if n in ("ledger", "page"):
                arg.completer = _complete_ledger if n == "ledger" else _complete_page  # type: ignore[attr-defined]
        _common(p, top=False)
        return p

    _add_daemon_commands(cmd)
    _add_value_commands(cmd)
    _add_sync_commands(cmd)
    cli_doc.add_parser(sub)  # ledgerctl doc ... (daemon/cli_doc.py)
    # -- subcommands of their own modules (each sets a handler(args, client)) ---------
    cli_check.register(sub)
    cli_gc.register(sub)
    cli_conflicts.register(sub)
    for q in sub.choices.values():
        _common_below(q)
    _explain(ap, "")

    ap.commands = tuple(sub.choices)
    ap.options = frozenset(
        o for q in [ap, *sub.choices.values()] for a in q._actions for o in a.option_strings
    )
    return ap


_Cmd = Callable[..., argparse.ArgumentParser]
"""``cmd(name, help, *positionals)``: a command's parser, with the options every command
takes and completion of its ledger and page."""


def _add_daemon_commands(cmd: _Cmd) -> None:
    """``status``, ``version``, ``ledgers``, ``pages`` and ``du``."""
    p = cmd("status", "show the daemon's state: sync, devices, every page, conflicts")
    p.add_argument(
        "--pages",
        type=pages_arg,
        default=None,
        metavar="N|all",
        help="show at most N pages (default: 20, with --json 1000), or all",
    )
    cmd("version", "show the versions of ledgerctl and of the daemon")
    cmd("ledgers", "list ledgers")
    cmd("pages", "list the pages of a ledger", "ledger")
    p = cmd("du", "entries and bytes (keys and values) per page, and its disk use")
    p.add_argument("ledger", nargs="?").completer = _complete_ledger  # type: ignore[attr-defined]
    p.add_argument("page", nargs="?").completer = _complete_page  # type: ignore[attr-defined]


def _add_value_commands(cmd: _Cmd) -> None:
    """``put``, ``get``, ``delete``, ``clear``, ``rm``, ``ls``, ``watch``, ``import`` and
    ``export``."""
    p = cmd(
        "put", "set a key (value from VALUE, --file or standard input)", "ledger", "page", "key"
    )
    p.add_argument("value", nargs="?")
    p.add_argument("--file", help="read the value from this file ('-': standard input)")
    p.add_argument(
        "--lazy", action="store_true", help="LAZY priority: other devices fetch on first read"
    )
    p = cmd("get", "write a value to standard output (or -o FILE)", "ledger", "page", "key")
    p.add_argument("-o", "--output", help="write the value to this file ('-': standard output)")
    p.add_argument("--at", help="read at this commit (hex id, or a unique prefix: 4+ digits)")
    p.add_argument(
        "--force", action="store_true", help="write a binary value to a terminal all the same"
    )
    cmd("delete", "delete a key", "ledger", "page", "key")
    cmd("clear", "delete every entry of a page", "ledger", "page")
    p = cmd("rm", "delete a page, or a whole ledger, on every device", "ledger")
    p.add_argument("page", nargs="?").completer = _complete_page  # type: ignore[attr-defined]
    p.add_argument("-y", "--yes", action="store_true", help="delete a whole ledger without asking")
    p = cmd("ls", "list entries: key<TAB>value per line (or --json)", "ledger", "page")
    for opt, what in (
        ("--prefix", "only keys that start with P (with --tuple: a tuple prefix)"),
        ("--start", "only keys from S on"),
        ("--end", "only keys before E"),
    ):
        p.add_argument(opt, metavar=opt[2].upper(), help=what)
    p.add_argument("--limit", type=positive_int, metavar="N", help="at most N entries")
    p.add_argument(
        "--at", metavar="COMMIT", help="list at this commit (hex id, or a unique prefix)"
    )
    p = cmd("watch", "print every change until interrupted", "ledger", "page")
    p.add_argument("--prefix", metavar="P", help="only keys that start with P")
    p = cmd("import", "write entries in the 'ls --json' format in large batches", "ledger", "page")
    p.add_argument("file", nargs="?", help="(default, or '-': standard input)")
    cmd("export", "the whole page in the 'ls --json' format", "ledger", "page")


def _add_sync_commands(cmd: _Cmd) -> None:
    """``sync``, ``policy``, ``heads`` and ``log``."""
    p = cmd("sync", "upload pending writes, fetch and join other devices', until quiet")
    p.add_argument("ledger", nargs="?").completer = _complete_ledger  # type: ignore[attr-defined]
    p.add_argument("page", nargs="?").completer = _complete_page  # type: ignore[attr-defined]
    p.add_argument("--timeout", type=float, default=60.0, help="give up after S seconds")
    p = cmd("policy", "show or set the page's merge policy", "ledger", "page")
    p.add_argument(
        "policy", nargs="?", choices=["last_one_wins", "automatic_with_fallback", "custom"]
    )
    cmd("heads", "the page's head commit (history is a line: one head)", "ledger", "page")
    p = cmd("log", "commit history, newest first", "ledger", "page")
    p.add_argument("--limit", type=positive_int, default=20, metavar="N", help="(default 20)")


DOC_ID = "01M845D77GCBCEDRNYKWHJ1QF9"
EXAMPLES = {
    "status": "ledgerctl status\nledgerctl status --pages all --json   # every page, one document",
    "version": "ledgerctl version --json",
    "ledgers": "ledgerctl ledgers",
    "pages": "ledgerctl pages notes",
    "du": "ledgerctl du notes inbox",
    "put": "ledgerctl put notes inbox greeting 'hello world'\n"
    "echo 'from stdin' | ledgerctl put notes inbox note/1\n"
    "ledgerctl put notes inbox photo --file photo.bin --lazy",
    "get": "ledgerctl get notes inbox greeting\n"
    "ledgerctl get notes inbox photo -o photo.bin\n"
    "ledgerctl get --at ce72cb29519f notes inbox greeting   # a commit id (prefix) from log",
    "delete": "ledgerctl delete notes inbox greeting",
    "clear": "ledgerctl clear notes inbox",
    "rm": "ledgerctl rm notes inbox\nledgerctl rm notes --yes   # every page of the ledger",
    "ls": "ledgerctl ls notes inbox --prefix note/ --limit 10\nledgerctl ls notes inbox --json",
    "watch": "ledgerctl watch notes inbox --prefix note/",
    "import": "ledgerctl import notes backup inbox.jsonl\n"
    "ledgerctl export notes inbox | ledgerctl import notes backup",
    "export": "ledgerctl export notes inbox > inbox.jsonl",
    "sync": "ledgerctl sync\nledgerctl sync notes inbox --timeout 30",
    "policy": "ledgerctl policy notes inbox\nledgerctl policy notes inbox automatic_with_fallback",
    "heads": "ledgerctl heads notes inbox",
    "log": "ledgerctl log notes inbox --limit 5",
    "doc": 'ledgerctl doc put app people people \'{"name": "Ann"}\'',
    "doc put": 'ledgerctl doc put app people people \'{"name": "Ann", "age": 41}\'',
    "doc get": f"ledgerctl doc get app people people {DOC_ID}",
    "doc ls": "ledgerctl doc ls app people people --json",
    "doc rm": f"ledgerctl doc rm app people people {DOC_ID}",
    "doc purge": f"ledgerctl doc purge app people people {DOC_ID}",
    "doc index": "ledgerctl doc index app people people by_city --partition address.city "
    "--sort age",
    "doc indexes": "ledgerctl doc indexes app people people",
    "doc drop-index": "ledgerctl doc drop-index app people people by_city",
    "doc rebuild-index": "ledgerctl doc rebuild-index app people people by_city",
    "doc find": "ledgerctl doc find app people people by_city --eq Oslo --start 30",
    "doc attach": f"ledgerctl doc attach app people people {DOC_ID} photo.jpg",
    "doc detach": f"ledgerctl doc detach app people people {DOC_ID} ATTACHMENT_ID",
    "doc attachment": f"ledgerctl doc attachment app people people {DOC_ID} ATTACHMENT_ID "
    "-o copy.jpg",
    "doc changes": "ledgerctl doc changes app people --since COMMIT --follow",
    "check": "ledgerctl check notes\nledgerctl check --cloud --repair",
    "gc": "ledgerctl gc notes inbox",
    "evict": "ledgerctl evict notes inbox",
    **cli_conflicts.EXAMPLES,
}
"""An example for each command's ``--help`` (tests/daemon/test_cli_conventions.py
checks that every command has one)."""
POSITIONALS = {
    "ledger": "ledger name (hex with --hex)",
    "page": "page id in the ledger (hex with --hex)",
    "key": "the key (hex with --hex, a tuple literal with --tuple)",
    "value": "the value (default: --file, or else standard input)",
    "policy": "the policy to set (default: show the current one)",
    "collection": "the collection of documents",
    "id": "a document's _id",
    "name": "the index's name",
    "attachment_id": "the attachment's id (as attach printed it)",
    "file": "the file to read",
}
"""What a positional argument is, by name, where its command does not say."""


def _explain(p: argparse.ArgumentParser, path: str) -> None:
    """Give ``p`` (the command ``path``) and its subcommands their example and a line for
    every positional argument."""
    example = EXAMPLES.get(path)
    if example is not None:
        p.formatter_class = argparse.RawDescriptionHelpFormatter
        p.epilog = "example:\n" + "\n".join("  " + line for line in example.splitlines())
    for action in p._actions:
        if not action.option_strings and action.help is None and action.dest in POSITIONALS:
            action.help = POSITIONALS[action.dest]
        if isinstance(action, argparse._SubParsersAction):
            for name, q in action.choices.items():
                _explain(q, f"{path} {name}".strip())
