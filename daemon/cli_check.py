"""``ledgerctl check [LEDGER [PAGE]] [--cloud] [--repair] [--json]``.

This module owns the ``check`` subcommand: its arguments (:func:`register`, called
once by :mod:`ledgerd.daemon.cli_parser` when it builds its parser) and its one-screen
summary. The check runs in the daemon (``POST /v1/check``). Exit status 0 when
every page checked is healthy or was repaired, 1 otherwise (the other statuses
are ``ledgerctl``'s own: 2 bad usage, 3 daemon unreachable, 4 daemon error).
"""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any, TextIO

from ledgerd.daemon.cli_format import arg_bytes, counted
from ledgerd.daemon.client import AsyncClient

EXIT_UNHEALTHY = 1
SHOWN_PROBLEMS = 5
"""Problems printed per page in the summary (``--json`` has them all)."""
SHOWN_PAGES = 20
"""Unhealthy pages printed in the summary."""
DOCUMENT_CODES = frozenset({"damaged_document", "unsupported_layout", "damaged_index_definition"})
"""Problems of document records and index definitions whose pieces are sound
(``store.page.check.DOCUMENT_CODES``): a page with only these is not called damaged."""


def register(sub: Any) -> None:
    """Add ``check`` to ``ledgerctl``'s subcommands (``sub``: its ``add_subparsers()``)."""
    help = "check (and --repair) pages: SQLite, pieces, commits, heads, journals, the bucket"
    p: argparse.ArgumentParser = sub.add_parser("check", help=help, description=help)
    p.add_argument("ledger", nargs="?", help="only this ledger")
    p.add_argument("page", nargs="?", help="only this page of the ledger")
    p.add_argument(
        "--cloud", action="store_true", help="also check this device's packs in the bucket"
    )
    p.add_argument(
        "--repair",
        action="store_true",
        help="fetch corrupt or missing pieces from the bucket, upload what it lacks",
    )
    p.add_argument("--json", action="store_true", help="print the whole report as JSON")
    p.set_defaults(handler=run)


def _arg(text: str | None, hex_mode: bool, what: str) -> bytes | None:
    """An optional LEDGER or PAGE argument's bytes (:func:`cli_format.arg_bytes`)."""
    return None if text is None else arg_bytes(text, hex_mode, what)


async def run(args: argparse.Namespace, client: AsyncClient) -> int:
    ledger = _arg(args.ledger, args.hex, "ledger")
    page = _arg(args.page, args.hex, "page")
    report = await client.check(ledger, page, cloud=args.cloud, repair=args.repair)
    if args.json:
        sys.stdout.write(json.dumps(report, separators=(",", ":")) + "\n")
    else:
        summary(report, sys.stdout)
    return 0 if report["healthy"] else EXIT_UNHEALTHY


def _page_name(p: dict[str, Any]) -> str:
    ledger = p["ledger_text"] if p["ledger_text"] is not None else "base64:" + p["ledger"]
    page = p["page_text"] if p["page_text"] is not None else "base64:" + p["page"]
    return f"{ledger} {page}"


def summary(report: dict[str, Any], out: TextIO) -> None:
    """One screen: a line per unhealthy page with its first problems, then totals."""
    pages = report["pages"]
    bad = [p for p in pages if not p["healthy"] or any(x["repaired"] for x in p["problems"])]
    for p in bad[:SHOWN_PAGES]:
        _page_summary(p, out)
    if len(bad) > SHOWN_PAGES:
        out.write(f"... and {len(bad) - SHOWN_PAGES} more pages (--json lists them)\n")
    # The healthy pages' notes (such as "cloud sync is off"), each once.
    for note in dict.fromkeys(n for p in pages if p not in bad for n in p["notes"]):
        out.write(f"note: {note}\n")
    cloud = " and the bucket" if report["cloud"] else ""
    verdict = "healthy" if report["healthy"] else "NOT healthy"
    out.write(
        f"checked {counted(report['checked_pages'], 'page')}{cloud}: {verdict}; "
        f"{counted(report['problems'], 'problem')}, {report['repaired']} repaired\n"
    )


def _page_summary(p: dict[str, Any], out: TextIO) -> None:
    """A page's line, its first problems and its notes."""
    out.write(f"{_page_name(p)}: {_page_state(p)}\n")
    shown = [x for x in p["problems"] if not x["repaired"]] or p["problems"]
    for x in shown[:SHOWN_PROBLEMS]:
        mark = "repaired" if x["repaired"] else x["code"]
        piece = f" piece {x['digest']}" if x["digest"] else ""
        out.write(f"  {mark}: {x['message']}{piece}\n")
    more = len(shown) - SHOWN_PROBLEMS + p["more_problems"]
    if more > 0:
        out.write(f"  ... and {more} more (--json lists them)\n")
    for note in p["notes"]:
        out.write(f"  note: {note}\n")


def _page_state(p: dict[str, Any]) -> str:
    codes = {x["code"] for x in p["problems"] if not x["repaired"]}
    if p["healthy"]:
        return "ok (repaired)"
    if codes == {"not_checked"}:
        return "NOT CHECKED (busy)"
    if codes and codes <= DOCUMENT_CODES:
        return "DOCUMENTS NOT READABLE"
    return "DAMAGED"
