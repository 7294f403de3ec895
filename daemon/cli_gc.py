"""``ledgerctl gc [LEDGER [PAGE]] [--json]`` and ``ledgerctl evict LEDGER PAGE [--json]``.

This module owns the ``gc`` and ``evict`` subcommands: their arguments
(:func:`register`, called once by :mod:`ledgerd.daemon.cli_parser` when it builds
its parser) and their summaries. Both run in the daemon (``POST /v1/gc``,
``POST /v1/evict``). Exit status 0, or 1 when a page could not be collected (the
other statuses are ``ledgerctl``'s own: 2 bad usage, 3 daemon unreachable, 4 daemon
error: a page that cannot be evicted is 409 ``not_evictable``). ``ledgerctl du`` (in
:mod:`ledgerd.daemon.cli_commands`) shows the disk figures (``GET /v1/du``).
"""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any, TextIO

from ledgerd.daemon.cli_format import arg_bytes, counted, human_bytes
from ledgerd.daemon.client import AsyncClient

EXIT_FAILED = 1
SHOWN_PAGES = 50
"""Pages listed in a summary (``--json`` has them all)."""


def register(sub: Any) -> None:
    """Add ``gc`` and ``evict`` to ``ledgerctl``'s subcommands (``sub``: its
    ``add_subparsers()``)."""
    text = "prune history past its retention and collect garbage now; print what was freed"
    p: argparse.ArgumentParser = sub.add_parser("gc", help=text, description=text)
    p.add_argument("ledger", nargs="?", help="only this ledger")
    p.add_argument("page", nargs="?", help="only this page of the ledger")
    p.add_argument("--json", action="store_true", help="print the whole answer as JSON")
    p.set_defaults(handler=run_gc)
    text = "delete the local copy of a closed, fully synced page (its next use fetches it)"
    p = sub.add_parser("evict", help=text, description=text)
    p.add_argument("ledger")
    p.add_argument("page")
    p.add_argument("--json", action="store_true", help="print the answer as JSON")
    p.set_defaults(handler=run_evict)


def _arg(text: str | None, hex_mode: bool, what: str) -> bytes | None:
    """An optional LEDGER or PAGE argument's bytes (:func:`cli_format.arg_bytes`)."""
    return None if text is None else arg_bytes(text, hex_mode, what)


def _name(p: dict[str, Any]) -> str:
    ledger = p["ledger_text"] if p["ledger_text"] is not None else "base64:" + p["ledger"]
    page = p["page_text"] if p["page_text"] is not None else "base64:" + p["page"]
    return f"{ledger} {page}"


def size(n: int) -> str:
    """Bytes for people: ``512 B``, ``3.4 KiB``, ``12.0 MiB``."""
    return f"{n} B" if n < 1024 else human_bytes(n)


async def run_gc(args: argparse.Namespace, client: AsyncClient) -> int:
    doc = await client.gc(_arg(args.ledger, args.hex, "ledger"), _arg(args.page, args.hex, "page"))
    if args.json:
        sys.stdout.write(json.dumps(doc, separators=(",", ":")) + "\n")
    else:
        gc_summary(doc, sys.stdout)
    return EXIT_FAILED if doc["errors"] else 0


def gc_summary(doc: dict[str, Any], out: TextIO) -> None:
    for p in [p for p in doc["pages"] if p["pieces_freed"] or p["commits_pruned"]][:SHOWN_PAGES]:
        out.write(
            f"{_name(p)}: {p['commits_pruned']} commits pruned, freed {size(p['bytes_freed'])}; "
            f"files {size(p['file_bytes_before'])} -> {size(p['file_bytes_after'])}\n"
        )
    for e in doc["errors"]:
        out.write(f"{_name(e)}: FAILED: {e['message']}\n")
    out.write(
        f"collected {counted(doc['collected_pages'], 'page')}: "
        f"{counted(doc['commits_pruned'], 'commit')} pruned, "
        f"{doc['pieces_freed']} pieces ({size(doc['bytes_freed'])}) freed; files "
        f"{size(doc['file_bytes_before'])} -> {size(doc['file_bytes_after'])}\n"
    )


async def run_evict(args: argparse.Namespace, client: AsyncClient) -> int:
    ledger, page = _arg(args.ledger, args.hex, "ledger"), _arg(args.page, args.hex, "page")
    assert ledger is not None and page is not None
    doc = await client.evict(ledger, page)
    if args.json:
        sys.stdout.write(json.dumps(doc, separators=(",", ":")) + "\n")
    else:
        sys.stdout.write(f"{_name(doc)}: evicted, {size(doc['freed_bytes'])} freed\n")
    return 0
