"""What ``ledgerctl status`` prints: ``/v1/status`` as lines a person reads.

The daemon's document is shown, not interpreted: one line per fact, names as text
(hex when they are not UTF-8), times in UTC, and every sync problem the ``sync``
object reports (per-page errors, held packs, gaps in device logs, devices that fail,
clock skew, the bucket) on a line of its own; then the devices sharing the bucket,
every page with its sync state (the first ones: the daemon says how many follow) and
each conflict with the commands that resolve it. ``--json`` prints the document itself.
"""

from __future__ import annotations

import argparse
import base64
import math
import shlex
import time
from datetime import UTC, datetime
from typing import Any

from ledgerd.daemon.cli_format import counted, positive_int, show_b64_name, when_s
from ledgerd.daemon.client import AsyncClient

PAGES_SHOWN, PAGES_JSON = 20, 1000
"""Pages ``status`` shows by default (``--pages``), as lines and with ``--json``."""
PAGES_PER_REQUEST = 10_000
"""Pages asked for at a time with ``--pages all`` (the daemon's most)."""


def pages_arg(text: str) -> int:
    """``--pages``: a positive number (at most the daemon's most), or ``all`` (0)."""
    if text == "all":
        return 0
    n = positive_int(text)
    if n > PAGES_PER_REQUEST:
        raise argparse.ArgumentTypeError(f"at most {PAGES_PER_REQUEST}, or all")
    return n


async def fetch_status(client: AsyncClient, pages: int | None, json: bool) -> dict[str, Any]:
    """``/v1/status`` with its first ``pages`` pages (None: the default; 0: all of them,
    fetched a batch at a time and put in one document)."""
    if pages is None:
        pages = PAGES_JSON if json else PAGES_SHOWN
    st = await client.status(pages_limit=pages or PAGES_PER_REQUEST)
    while not pages and st.get("pages_next"):
        more = await client.status(pages_limit=PAGES_PER_REQUEST, pages_after=st["pages_next"])
        st["pages"] += more.get("pages", [])
        st["pages_next"] = more.get("pages_next")
    return st


def _page(doc: dict[str, Any]) -> str:
    return f"{show_b64_name(doc['ledger'])}/{show_b64_name(doc['page'])}"


def _since(t: float | None) -> str:
    return f" since {when_s(t)}" if t else ""


def at(t: float, now: float) -> str:
    """A time as ``2026-12-07 09:10:03 UTC (12 s ago)``."""
    text = datetime.fromtimestamp(t, UTC).strftime("%Y-%m-%d %H:%M:%S UTC")
    return f"{text} ({ago(now - t)})"


def ago(s: float) -> str:
    """Seconds elapsed as ``12 s ago``, ``5 min ago``, ``3 h ago``, ``2 days ago``
    (``in 3 s`` for a time ahead of this clock)."""
    n = abs(s)
    if n < 120:
        amount = f"{n:.0f} s"
    elif n < 7200:
        amount = f"{n / 60:.0f} min"
    elif n < 172800:
        amount = f"{n / 3600:.0f} h"
    else:
        amount = f"{n / 86400:.0f} days"
    return f"{amount} ago" if s >= -0.5 else f"in {amount}"


def status_lines(st: dict[str, Any], now: float | None = None) -> list[str]:
    now = time.time() if now is None else now
    devices = st.get("devices") or []
    own = next((d for d in devices if d.get("this_device")), None)
    lines = [
        f"ledgerd {st['version']} (pid {st['pid']}), up {st['uptime_s']:.0f}s",
        f"device   {st['device_id']}" + (f"  {_device(own, now)}" if own else ""),
        f"data     {st['data_dir']}",
        f"cloud    {st.get('cloud') or 'off (sync is off: every page is local only)'}",
    ]
    sync = st.get("sync") or {}
    # sync_error is the first thing in the way: often the bucket's or the last round's
    # error, which sync_lines shows already.
    if st.get("sync_error") and st["sync_error"] not in (
        sync.get("bucket_error"),
        sync.get("round_error"),
    ):
        lines.append(f"sync     error: {st['sync_error']}")
    lines += sync_lines(sync)
    for reason in sync.get("reasons", []):  # rounds late, and what they are retrying
        if reason.startswith(("no sync round", "retrying: ")):
            lines.append(f"sync     {reason}")
    for d in devices:
        if not d.get("this_device"):
            lines.append(f"device   {d['device']}  {_device(d, now)}")
    if "pages" in st:
        lines += page_lines(st, now)
        lines += conflict_lines(st.get("conflicts") or [])
        return lines
    for p in st.get("open_pages", []):  # (an older daemon: it lists the open pages only)
        lines.append(f"page     {_page(p)}{_open_page_extra(p)}")
    return lines


def _open_page_extra(p: dict[str, Any]) -> str:
    """What an older daemon's ``open_pages`` says of a page, after its name."""
    extra = f"  conflicts={p['conflicts']}" if p.get("conflicts") else ""
    if p.get("unuploaded_writes"):
        extra += "  writes not uploaded"
    if p.get("last_sync"):
        extra += f"  synced {when_s(p['last_sync'])}"
    elif p.get("sync") == "synced":  # (nothing moved since the daemon started)
        extra += "  synced"
    if p.get("conflict"):
        extra += f"  conflict: {p['conflict']}"
    if p.get("last_error"):
        extra += f"  error: {p['last_error']}"
    return extra


def sync_lines(sync: dict[str, Any]) -> list[str]:
    """The ``sync`` object: a line per problem, nothing when sync is healthy (or off)."""
    lines = []
    if sync.get("bucket_error"):
        lines.append(f"bucket   error: {sync['bucket_error']}")
    if sync.get("round_error") and not (
        sync.get("bucket_error") and sync["bucket_error"] in sync["round_error"]
    ):
        lines.append(f"sync     last round failed: {sync['round_error']}")
    if sync.get("pending_uploads"):
        lines.append(f"sync     {counted(sync['pending_uploads'], 'page')} waiting to upload")
    for p in sync.get("pages", []):
        lines.append(f"sync     page {_page(p)}: {p['error']}")
    for h in sync.get("packs", []):
        retry = f", retry in {h['retry_in_s']:.0f}s" if h.get("retry_in_s") else ""
        why = f": {h['error']}" if h.get("error") else ""
        # A pack refused before its index was read names no page.
        page = f" for {_page(h)}" if h.get("ledger") is not None else ""
        lines.append(
            f"held     pack {h['pack']}{page} ({h['state']}, "
            f"{counted(h['attempts'], 'attempt')}{retry}){why}"
        )
    for g in sync.get("gaps", []):
        seqs = (
            str(g["first_seq"])
            if g["first_seq"] == g["last_seq"]
            else (f"{g['first_seq']}-{g['last_seq']}")
        )
        lines.append(f"gap      device {g['device']} packs {seqs} missing{_since(g['since'])}")
    for d in sync.get("devices", []):
        lines.append(f"device   {d['device']}: {d['error']}")
    for s in sync.get("clock_skew", []):
        lines.append(
            f"clock    device {s['device']} is {s['ahead_s']:.0f}s ahead of this one "
            f"(seen {when_s(s['seen_at'])})"
        )
    return lines


def retry_line(sync: dict[str, Any]) -> str:
    """What the daemon's requests to the bucket retry, and when next (``ledgerctl sync``
    prints it while it waits)."""
    line = f"retrying: {sync['retrying']}"
    if sync.get("next_try_in_s"):
        line += f"; next try in {math.ceil(sync['next_try_in_s'])} s"
    elif sync.get("next_try_in_s") is not None:
        line += "; trying again now"
    return line


def _device(d: dict[str, Any], now: float) -> str:
    """A device of ``devices``: its newest pack, its clock, its error."""
    if d.get("this_device"):
        parts = ["this device"]
    else:
        a = d.get("clock_ahead_s")
        if a is None:
            clock = "clock unknown (none of its writes imported since ledgerd started)"
        elif a >= 1:
            clock = f"clock at least {a:.0f} s ahead of this one"
        elif a > -1:
            clock = "clock not behind this one"
        else:
            clock = f"clock at most {-a:.0f} s behind this one"
        parts = [clock]
    if d.get("last_pack_at"):
        parts.append(f"newest pack {at(d['last_pack_at'], now)}")
    elif not d.get("this_device"):
        parts.append("no pack listed")
    else:
        parts.append("no pack uploaded yet")
    if d.get("error"):
        parts.append(f"error: {d['error']}")
    return ", ".join(parts)


def page_lines(st: dict[str, Any], now: float) -> list[str]:
    """A line per page of ``pages`` (name, state, what else), and how many were left out."""
    names = [_page(p) for p in st["pages"]]
    width = max(map(len, names), default=0)
    lines = []
    for name, p in zip(names, st["pages"], strict=True):
        lines.append(f"page     {name:<{width}}  {_page_state(p, now)}".rstrip())
    more = int(st.get("pages_total") or 0) - len(st["pages"])
    if more > 0:
        lines.append(
            f"page     ... and {counted(more, 'more page')} "
            "(ledgerctl status --pages all, or --json --pages all)"
        )
    return lines


def _page_state(p: dict[str, Any], now: float) -> str:
    """``synced``, ``pending``, ``error``, ``local`` (nothing when sync is off) and what
    else is known: when it last synced, why it failed, evicted, open, conflicts."""
    last = f"last synced {at(p['last_sync'], now)}" if p.get("last_sync") else ""
    state = p.get("sync")
    if state == "off":
        parts = []
    elif state == "local":
        parts = ["local    the _local ledger is never uploaded"]
    elif state == "synced":
        parts = [f"synced   {last or 'nothing waits for upload (no sync time recorded)'}"]
    elif state == "pending":
        parts = [f"pending  waiting for upload{'; ' + last if last else ', never synced'}"]
    else:
        parts = [f"error    {p.get('last_error')}{'; ' + last if last else ''}"]
    if p.get("evicted"):
        parts.append("evicted (its next use fetches it)")
    if p.get("open"):
        parts.append("open")
    if p.get("conflicts"):
        parts.append(f"conflicts={p['conflicts']}")
    return "  ".join(parts)


def _arg(b64: str) -> tuple[str, bool]:
    """A name as a ``ledgerctl`` argument (hex when it is not UTF-8), and whether it is hex."""
    raw = base64.b64decode(b64)
    try:
        text: str | None = raw.decode()
    except UnicodeDecodeError:
        text = None
    return (
        (shlex.quote(text), False)
        if text is not None and text.isprintable()
        else (
            raw.hex(),
            True,
        )
    )


def conflict_lines(conflicts: list[dict[str, Any]]) -> list[str]:
    """A line per page whose keys hold concurrent values, with the commands that show and
    resolve them."""
    lines = []
    for c in conflicts:
        keys, one = counted(c["keys"], "key"), c["keys"] == 1
        if c.get("waiting"):
            why = "" if c.get("resolver_connected") else " (no resolver connected)"
            state = f"{keys} {'waits' if one else 'wait'} for a resolver{why}"
        else:
            policy = f", {c['policy']}" if c.get("policy") else ""
            state = (
                f"{keys} {'holds' if one else 'hold'} concurrent values "
                f"(reads show the winner{policy})"
            )
        if not c.get("open", True):
            state += " at its last sync"
        (ledger, hex_l), (page, hex_p) = _arg(c["ledger"]), _arg(c["page"])
        ctl = "ledgerctl --hex" if hex_l or hex_p else "ledgerctl"
        if hex_l != hex_p:  # --hex takes both names in hex
            ledger = base64.b64decode(c["ledger"]).hex()
            page = base64.b64decode(c["page"]).hex()
        lines.append(
            f"conflict {_page(c)}  {state}  \u2192 {ctl} conflicts {ledger} {page}; "
            f"{ctl} resolve {ledger} {page} KEY --take ours|theirs|VALUE"
        )
    return lines
