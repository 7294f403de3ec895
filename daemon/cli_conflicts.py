"""``ledgerctl conflicts [LEDGER [PAGE]]`` and ``ledgerctl resolve LEDGER PAGE [KEY]``.

This module owns the two subcommands: their arguments (:func:`register`, called once by
:mod:`ledgerd.daemon.cli_parser` when it builds its parser), the listing of conflicts (each
key's siblings shown as ``ls`` shows values, and the command that resolves it) and
what a resolution prints. Both run in the daemon (``GET .../conflicts``,
``POST .../conflicts/resolve``; see docs/merging.md). Exit status 0 (``conflicts`` with
none to show too); the others are ``ledgerctl``'s own: a resolution the daemon refuses
(``no_conflict``, ``siblings_changed``, ``ambiguous_theirs``) is 4.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import shlex
import sys
from typing import Any, TextIO

from ledgerd.daemon.cli_exit import EXIT_ERROR
from ledgerd.daemon.cli_format import (
    arg_bytes,
    counted,
    pack_tuple,
    positive_int,
    show,
    show_key,
    show_name,
    size_text,
    when,
)
from ledgerd.daemon.client import (
    AsyncClient,
    LedgerError,
    PageConflicts,
    PendingConflict,
    Sibling,
)
from ledgerd.daemon.client_conflicts import TakeName
from ledgerd.daemon.client_types import b64

SHOWN_VALUE = 60
"""Characters of a value a listing shows; a longer one is cut, with its size."""
PAGE_KEYS = 100
"""Conflicting keys per page when listing several pages (the daemon's default)."""
REQUEST_KEYS = 1000
"""Conflicting keys per request for one page's listing (it follows ``next``); a page
with up to this many gets the whole page's ``expect`` (a listing in one request)."""
EXAMPLES = {
    "conflicts": "ledgerctl conflicts\nledgerctl conflicts notes inbox --json",
    "resolve": "ledgerctl resolve notes inbox greeting --take theirs\n"
    "ledgerctl resolve notes inbox --take ours   # every conflict of the page\n"
    "ledgerctl resolve notes inbox greeting --value 'hello, both'",
}
"""``--help`` examples (:data:`ledgerd.daemon.cli_parser.EXAMPLES` takes them)."""


def register(sub: Any) -> None:
    """Add ``conflicts`` and ``resolve`` to ``ledgerctl``'s subcommands (``sub``: its
    ``add_subparsers()``)."""
    text = "list pending conflicts: each key's siblings, and the command that resolves it"
    p: argparse.ArgumentParser = sub.add_parser("conflicts", help=text, description=text)
    p.add_argument("ledger", nargs="?", help="every page of this ledger (default: open pages)")
    p.add_argument("page", nargs="?", help="only this page of the ledger")
    p.add_argument(
        "--limit", type=positive_int, metavar="N", help="at most N keys per page (default: all)"
    )
    p.set_defaults(handler=run_conflicts)
    text = (
        "resolve a key's conflict (every conflict of the page without KEY): a write that "
        "supersedes exactly the siblings 'conflicts' shows, synced like any write"
    )
    p = sub.add_parser("resolve", help=text, description=text)
    p.add_argument("ledger")
    p.add_argument("page")
    p.add_argument("key", nargs="?", help="the key (default: every conflicting key)")
    how = p.add_mutually_exclusive_group(required=True)
    how.add_argument(
        "--take",
        metavar="ours|theirs|VALUE",
        help="ours: what reads show now; theirs: the other sibling (only when there is "
        "one); anything else: that literal value",
    )
    how.add_argument("--value", help="this literal value (even 'ours' or 'theirs')")
    how.add_argument("--delete", action="store_true", help="delete the key")
    p.add_argument(
        "--expect",
        metavar="TOKEN",
        help="refuse (siblings_changed) unless the siblings are still those 'conflicts' "
        "listed with this token",
    )
    p.set_defaults(handler=run_resolve)


# -- conflicts -----------------------------------------------------------------------


def _opt(text: str | None, args: argparse.Namespace, what: str) -> bytes | None:
    return None if text is None else arg_bytes(text, args.hex, what)


async def _listing(args: argparse.Namespace, client: AsyncClient) -> list[PageConflicts]:
    """The pages' conflicts; one page's whole (up to ``--limit``), a few requests long."""
    ledger = _opt(args.ledger, args, "ledger")
    page = _opt(args.page, args, "page")
    if ledger is None or page is None:
        return await client.conflicts(ledger, limit=args.limit or PAGE_KEYS)
    want = args.limit or sys.maxsize
    docs = await client.conflicts(ledger, page, limit=min(want, REQUEST_KEYS))
    doc, listed = docs[0], list(docs[0].conflicts)
    while doc.next is not None and len(listed) < want:
        (doc,) = await client.conflicts(ledger, page, limit=REQUEST_KEYS, start=doc.next)
        listed.extend(doc.conflicts)
    nxt = listed[want].key if len(listed) > want else doc.next
    return [dataclasses.replace(docs[0], conflicts=listed[:want], next=nxt)]


async def run_conflicts(args: argparse.Namespace, client: AsyncClient) -> int:
    pages = [p for p in await _listing(args, client) if p.conflicts]
    out = sys.stdout
    if args.json:
        for doc in pages:
            out.write(json.dumps(_json(doc), separators=(",", ":")) + "\n")
        if not pages and not args.quiet:
            print("ledgerctl: no conflicts", file=sys.stderr)
        return 0
    if not pages:
        where = "on open pages (give LEDGER to look at every page of it)"
        if args.ledger is not None:
            where = f"in {show_name(_opt(args.ledger, args, 'ledger') or b'')}"
            if args.page is not None:
                where += f" {show_name(_opt(args.page, args, 'page') or b'')}"
        out.write(f"no conflicts {where}\n")
        return 0
    for i, doc in enumerate(pages):
        if i:
            out.write("\n")
        _show_page(doc, args, out)
    return 0


def _json(doc: PageConflicts) -> dict[str, Any]:
    """A page's listing as one ``--json`` record: keys and values base64, names with
    their text, as the daemon's JSON has them."""

    def side(s: Sibling) -> dict[str, Any]:
        d = dataclasses.asdict(s)
        d["value"] = None if s.value is None else b64(s.value)
        return d

    return {
        "ledger": b64(doc.ledger),
        "page": b64(doc.page),
        "ledger_text": _text(doc.ledger),
        "page_text": _text(doc.page),
        "device": doc.device,
        "policy": doc.policy,
        "count": doc.count,
        "conflict": doc.conflict,
        "expect": doc.expect,
        "conflicts": [
            {
                "key": b64(c.key),
                "expect": c.expect,
                "ours": side(c.ours),
                "theirs": [side(t) for t in c.theirs],
            }
            for c in doc.conflicts
        ],
        "next": None if doc.next is None else b64(doc.next),
    }


def _text(data: bytes) -> str | None:
    try:
        return data.decode()
    except UnicodeDecodeError:
        return None


def _show_page(doc: PageConflicts, args: argparse.Namespace, out: TextIO) -> None:
    waiting = f"; {doc.conflict}" if doc.conflict else ""
    out.write(
        f"{show_name(doc.ledger, args.hex)} {show_name(doc.page, args.hex)}: "
        f"{counted(doc.count, 'conflict')} ({doc.policy}{waiting})\n"
    )
    for c in doc.conflicts:
        _show_key(doc, c, args, out)
    if doc.next is not None:
        left = doc.count - len(doc.conflicts)
        more = command_line(args, "conflicts", doc.ledger, doc.page, None)
        out.write(f"  ... {counted(left, 'more key')}: {more}\n")
    elif doc.expect is not None and len(doc.conflicts) > 1:
        every = command_line(args, "resolve", doc.ledger, doc.page, None)
        alt = "--take theirs, " if all(len(c.theirs) == 1 for c in doc.conflicts) else ""
        out.write(
            f"  every key: {every} --take ours --expect {doc.expect}   # or {alt}--value NEW\n"
        )


def _show_key(
    doc: PageConflicts, c: PendingConflict, args: argparse.Namespace, out: TextIO
) -> None:
    out.write(f"  {show_key(c.key, args.hex, args.tuple)}\n")
    out.write(f"    ours    {_side(c.ours, doc.device, args.hex)}\n")
    for t in c.theirs:
        out.write(f"    theirs  {_side(t, doc.device, args.hex)}\n")
    cmd = command_line(args, "resolve", doc.ledger, doc.page, c.key)
    alt = "--take theirs, " if len(c.theirs) == 1 else ""
    out.write(f"    resolve: {cmd} --take ours --expect {c.expect}   # or {alt}--value NEW\n")


def _side(s: Sibling, device: str, hex_mode: bool) -> str:
    """A sibling as ``ls`` shows a value (escaped text, hex with ``--hex``; cut past
    :data:`SHOWN_VALUE` characters with its size), when and where it was written."""
    if s.deleted:
        shown = "<deleted>"
    elif s.value is None:
        shown = size_text(s.size)
    else:
        shown = s.value.hex() if hex_mode else show(s.value)
        if len(shown) > SHOWN_VALUE:
            shown = f"{shown[: SHOWN_VALUE - 3]}... {size_text(len(s.value))}"
    lazy = ", lazy" if s.priority == "lazy" else ""
    by = "this device" if s.device == device else f"device {s.device}"
    return f"{shown}   ({when(s.time)}, {by}{lazy})"


def command_line(
    args: argparse.Namespace, name: str, ledger: bytes, page: bytes, key: bytes | None
) -> str:
    """The ledgerctl command line naming ``ledger``, ``page`` (and ``key``) as it reads
    them back: as text when they are printable text, a key as a tuple with ``--tuple``,
    else every name in ``--hex``."""
    names = [ledger, page] if key is None else [ledger, page, key]
    words = ["ledgerctl", name]
    if args.socket:
        words += ["--socket", args.socket]
    as_tuple = key is not None and args.tuple and show_key(key, False, True) != key.hex()
    plain = names[:2] if as_tuple else names
    if args.hex or any(_text(n) is None or show(n) != _text(n) for n in plain):
        return " ".join([*words, "--hex", *(n.hex() for n in names)])
    texts = [show(n) for n in plain]
    if as_tuple:
        assert key is not None
        words.append("--tuple")
        texts.append(show_key(key, False, True))
    return " ".join([*words, *(_quote(t) for t in texts)])


def _quote(text: str) -> str:
    """``text`` as one shell word: in double quotes when it holds a single quote and
    nothing a shell expands there (a tuple key: ``"('user', 42)"``), else shlex's."""
    if "'" in text and not any(c in text for c in '"$`\\!'):
        return f'"{text}"'
    return shlex.quote(text)


# -- resolve -------------------------------------------------------------------------


async def run_resolve(args: argparse.Namespace, client: AsyncClient) -> int:
    ledger = arg_bytes(args.ledger, args.hex, "ledger")
    page = arg_bytes(args.page, args.hex, "page")
    key = None
    if args.key is not None:
        key = pack_tuple(args.key, "key") if args.tuple else arg_bytes(args.key, args.hex, "key")
    take: TakeName | None = None
    value: bytes | None = None
    if args.delete:
        take = "delete"
    elif args.take in ("ours", "theirs"):
        take = args.take
    else:
        # A literal value: the exact bytes given, as ``ledgerctl put`` takes VALUE.
        value = os.fsencode(args.take if args.value is None else args.value)
    try:
        done = await client.resolve(ledger, page, key, take=take, value=value, expect=args.expect)
    except LedgerError as e:
        if e.code != "ambiguous_theirs" or key is None:
            raise
        print(f"ledgerctl: {e} ({e.code})", file=sys.stderr)
        (doc,) = await client.conflicts(ledger, page, limit=1, start=key)
        for c in doc.conflicts:
            if c.key == key:
                _show_key(doc, c, args, sys.stderr)
        return EXIT_ERROR
    if args.json:
        sys.stdout.write(
            json.dumps(
                {"resolved": [b64(k) for k in done.keys], "conflicts": done.conflicts},
                separators=(",", ":"),
            )
            + "\n"
        )
        return 0
    shown = ", ".join(show_key(k, args.hex, args.tuple) for k in done.keys[:5])
    more = f" and {len(done.keys) - 5} more" if len(done.keys) > 5 else ""
    sys.stdout.write(
        f"resolved {counted(len(done.keys), 'key')} ({shown}{more}); "
        f"{counted(done.conflicts, 'conflict')} left on "
        f"{show_name(ledger, args.hex)} {show_name(page, args.hex)}\n"
    )
    return 0
