"""What ``ledgerctl status`` prints: ``/v1/status`` as lines a person reads.

The daemon's document is shown, not interpreted: one line per fact, names as text
(hex when they are not UTF-8), times in UTC, and every sync problem the ``sync``
object reports (per-page errors, held packs, gaps in device logs, devices that fail,
clock skew, the bucket) on a line of its own. ``--json`` prints the document itself.
"""

from __future__ import annotations

from typing import Any

from ledgerd.daemon.cli_format import counted, show_b64_name, when_s


def _page(doc: dict[str, Any]) -> str:
    return f"{show_b64_name(doc['ledger'])}/{show_b64_name(doc['page'])}"


def _since(t: float | None) -> str:
    return f" since {when_s(t)}" if t else ""


def status_lines(st: dict[str, Any]) -> list[str]:
    lines = [
        f"ledgerd {st['version']} (pid {st['pid']}), up {st['uptime_s']:.0f}s",
        f"device   {st['device_id']}",
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
    for p in st.get("open_pages", []):
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
        lines.append(f"page     {_page(p)}{extra}")
    return lines


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
