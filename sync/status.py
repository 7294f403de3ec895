"""What sync reports: each page's last upload, what went wrong, and the health that follows.

This module owns :class:`StatusBoard`: per page, when it last synced and why its
last upload failed (:class:`PageState`); the last round's error and figures; the
devices whose download failed; the clocks seen ahead of this one; and the reports
built from them and from the held packs and gaps of :class:`sync.feed.Feed` (sync's
part of ``/v1/status``, the problems ``ledgerctl sync`` prints, the health the
daemon serves). The jobs tell it what happened; it changes nothing it reports on,
and does no I/O.
"""

from __future__ import annotations

import dataclasses
import logging
import time
from collections import Counter
from collections.abc import Sized
from dataclasses import dataclass
from typing import Any

from ledgerd.store import Page
from ledgerd.store import exchange as ex
from ledgerd.store.errors import counted, named
from ledgerd.sync import layout, progress
from ledgerd.sync.checkpoints import Checkpoints
from ledgerd.sync.compaction import Compactor
from ledgerd.sync.context import Key, SyncContext
from ledgerd.sync.feed import Feed

log = logging.getLogger(__name__)


def describe(e: BaseException) -> str:
    """An exception as status shows it: its type and message."""
    return f"{type(e).__name__}: {e}"


def stale_after(poll_interval: float, poll_max: float) -> float:
    """Seconds after the last finished round past which sync is late (not healthy):
    three polls, at least a minute, and twice the longest time between polls, which an
    idle device waits between rounds (with only ``3 * poll_interval``, a device idle
    for a minute turned unhealthy before each of its polls)."""
    return max(60.0, 3 * poll_interval, 2 * poll_max)


@dataclass
class PageState:
    last_sync: float | None = None
    last_error: str | None = None  # why the page could not be uploaded


class StatusBoard:
    """What went wrong and when things last went right.

    ``pending`` is the pages with uploads pending (counted, never changed here).
    """

    def __init__(
        self,
        ctx: SyncContext,
        feed: Feed,
        pending: Sized,
        checkpoints: Checkpoints,
        compactor: Compactor,
    ) -> None:
        self.ctx = ctx
        self.feed = feed
        self.pending = pending
        self.checkpoints = checkpoints
        self.compactor = compactor
        self.states: dict[Key, PageState] = {}
        self.round_error: str | None = None
        self.last_round_ok: float | None = None
        """When a round last finished without failing as a whole (UNIX time)."""
        self.last_round: dict[str, Any] | None = None
        self.device_errors: dict[str, str] = {}
        self.skew: dict[str, dict[str, Any]] = {}

    # -- what the jobs tell ------------------------------------------------------------

    def synced(self, page: Page) -> None:
        """The page's upload is recorded."""
        st = self.states.setdefault((page.ledger, page.id), PageState())
        st.last_sync, st.last_error = time.time(), None

    def page_failed(self, key: Key, e: BaseException) -> None:
        st = self.states.setdefault(key, PageState())
        message = describe(e)
        level = logging.DEBUG if st.last_error == message else logging.WARNING
        st.last_error = message
        log.log(
            level,
            "upload of page %s of ledger %s failed: %s",
            named(key[1]),
            named(key[0]),
            message,
        )

    def no_error(self, key: Key) -> None:
        self.states.setdefault(key, PageState()).last_error = None

    def imported(self, key: Key) -> None:
        self.states.setdefault(key, PageState()).last_sync = time.time()

    def forget(self, key: Key) -> None:
        """The page is gone from this device (deleted or evicted)."""
        self.states.pop(key, None)

    def device_failed(self, device: str, e: BaseException) -> None:
        self.device_errors[device] = describe(e)

    def device_ok(self, device: str) -> None:
        self.device_errors.pop(device, None)

    def clock_ahead(self, device: str, ahead: float) -> None:
        """Writes of ``device`` are stamped ``ahead`` seconds ahead of this device's clock."""
        if device not in self.skew:
            log.warning("device %s's clock is %.0fs ahead of this one", device, ahead)
        self.skew[device] = {"device": device, "ahead_s": round(ahead, 1), "seen_at": time.time()}

    # -- reports -----------------------------------------------------------------------

    def upload_error(self, key: Key) -> str | None:
        """Why the page's last upload failed, or None."""
        st = self.states.get(key)
        return st.last_error if st is not None else None

    def pack_error(self, key: Key) -> str | None:
        for h in self.feed.held():
            if h.key == key and h.state != progress.RETRY:
                return f"pack {h.ln.name}: {h.reason}"
        return None

    @property
    def last_error(self) -> str | None:
        """The first thing in the way of sync, if any (``sync_error`` in status)."""
        problems = self.problems()
        return str(problems[0]["error"]) if problems else None

    def problems(
        self, ledger: bytes | None = None, page: bytes | None = None
    ) -> list[dict[str, Any]]:
        """What sync could not do, of the page or ledger given (plus whole-bucket ones)."""

        def mine(key: Key | None) -> bool:
            if key is None:  # a whole pack: it concerns every page
                return True
            return (ledger is None or key[0] == ledger) and (page is None or key[1] == page)

        out: list[dict[str, Any]] = []
        if self.ctx.bucket_error:
            out.append({"error": self.ctx.bucket_error})
        elif self.round_error:
            out.append({"error": self.round_error})
        for device, err in sorted(self.device_errors.items()):
            out.append({"device": device, "error": f"device {device}: {err}"})
        for key, st in sorted(self.states.items()):
            if st.last_error and mine(key):
                out.append(
                    {
                        "ledger": layout.b64(key[0]),
                        "page": layout.b64(key[1]),
                        "error": st.last_error,
                    }
                )
        for h in self.feed.held():
            if h.state != progress.RETRY and mine(h.key):
                out.append(
                    {
                        "ledger": layout.b64(h.key[0]) if h.key else None,
                        "page": layout.b64(h.key[1]) if h.key else None,
                        "pack": h.ln.name,
                        "error": f"pack {h.ln.name}: {h.reason}",
                    }
                )
        return out

    def status(self, interval: float, poll_interval: float, poll_max: float) -> dict[str, Any]:
        """Sync's part of ``/v1/status``: every problem, for open and closed pages
        (``interval``: the seconds to the next background poll; the others: see
        :meth:`health`)."""
        pages = []
        for key, st in sorted(self.states.items()):
            if st.last_error:
                pages.append(
                    {
                        "ledger": layout.b64(key[0]),
                        "page": layout.b64(key[1]),
                        "ledger_text": layout.text_or_none(key[0]),
                        "page_text": layout.text_or_none(key[1]),
                        "error": st.last_error,
                        "last_sync": st.last_sync,
                    }
                )
        packs = []
        for h in self.feed.held():
            packs.append(
                {
                    **h.json(),
                    "ledger": layout.b64(h.key[0]) if h.key else None,
                    "page": layout.b64(h.key[1]) if h.key else None,
                    "ledger_text": layout.text_or_none(h.key[0]) if h.key else None,
                    "page_text": layout.text_or_none(h.key[1]) if h.key else None,
                }
            )
        gaps = [
            {"device": dl.device, "first_seq": g.first, "last_seq": g.last, "since": g.since}
            for _, dl in sorted(self.feed.logs.items())
            for g in dl.missing()
        ]
        health = self.health(poll_interval, poll_max)
        return {
            "healthy": health["healthy"],
            "synced": health["synced"],
            "reasons": health["reasons"],
            "last_round_ok": self.last_round_ok,
            "bucket_error": self.ctx.bucket_error,
            "bucket_error_code": self.ctx.bucket_error_code,
            "encryption": self._encryption(),
            "round_error": self.round_error,
            "pending_uploads": len(self.pending),
            "pages": pages,
            "packs": packs,
            "gaps": gaps,
            "devices": [{"device": d, "error": e} for d, e in sorted(self.device_errors.items())],
            "clock_skew": [self.skew[d] for d in sorted(self.skew)],
            "poll_interval_s": interval,
            "last_round": self.last_round,
            "checkpoints": self.checkpoints.status(),
            "last_compaction": (
                dataclasses.asdict(self.compactor.last) if self.compactor.last else None
            ),
            "requests": self.ctx.store.since(Counter()),
        }

    def _encryption(self) -> dict[str, Any]:
        """Whether this device encrypts, and its key ids (never a key)."""
        codec = self.ctx.codec
        if codec is not None:
            return {"on": True, "write_key": codec.write_kid.hex(), "keys": codec.key_ids}
        return {"on": self.ctx.keys is not None, "write_key": None, "keys": []}

    def health(self, poll_interval: float, poll_max: float) -> dict[str, Any]:
        """Whether sync works, and whether this device is synced, with every reason why
        not: a problem (see :meth:`problems`: the bucket, a device's log, a page's
        upload, a held pack: waiting for parents, refused, failed), a gap in a device's
        log, no round finished lately (see :func:`stale_after`: ``poll_interval`` and
        ``poll_max`` are the shortest and longest times between polls); and for
        ``synced``, uploads still pending."""
        reasons = [str(p["error"]) for p in self.problems()]
        for _, dl in sorted(self.feed.logs.items()):
            for g in dl.missing():
                reasons.append(
                    f"device {dl.device}: packs {g.first}-{g.last} are missing from its log"
                )
        stale = stale_after(poll_interval, poll_max)
        late = True
        if self.last_round_ok is None:
            reasons.append("no sync round has finished yet")
        elif time.time() - self.last_round_ok > stale:
            reasons.append(
                f"no sync round has finished for {time.time() - self.last_round_ok:.0f}s"
            )
        else:
            late = False
        # A round retries transient failures up to its deadline (a minute) before it
        # fails: until then, what it is retrying is the reason it has not finished.
        if late and (failure := self.ctx.store.last_failure()) is not None:
            retrying = f"retrying: {failure}"
            if not any(failure in r for r in reasons):
                reasons.append(retrying)
        pending = len(self.pending)
        healthy = not reasons
        if pending:  # (a reason not to be synced, which leaves it healthy)
            reasons.append(f"{counted(pending, 'page')} waiting for upload")
        return {
            "healthy": healthy,
            "synced": healthy and pending == 0,
            "reasons": reasons,
            "pending_uploads": pending,
            "last_round_ok": self.last_round_ok,
        }

    def gauges(self, poll_interval: float, poll_max: float) -> dict[str, Any]:
        """What the metrics show of sync when scraped: whether it is healthy and
        synced (see :meth:`health`), the pages waiting for upload, the held packs by
        state, the gaps in device logs, and when a round last finished."""
        health = self.health(poll_interval, poll_max)
        return {
            "healthy": health["healthy"],
            "synced": health["synced"],
            "pending_uploads": health["pending_uploads"],
            "held": Counter(h.state for h in self.feed.held()),
            "gaps": sum(len(dl.missing()) for dl in self.feed.logs.values()),
            "last_round_ok": self.last_round_ok,
        }

    async def page_status(self, page: Page) -> dict[str, Any]:
        key = (page.ledger, page.id)
        st = self.states.get(key, PageState())
        unsynced = await ex.has_unuploaded(page)
        # A write acknowledged in the journal is no commit yet, and waits as well (as
        # du's 'sync' says: nothing waits for upload and no journal is open).
        waiting = unsynced or page.writer.uncommitted
        return {
            "sync": "pending" if waiting else "synced",
            "unuploaded_writes": unsynced,
            "last_sync": st.last_sync,
            "last_error": st.last_error or self.pack_error(key),
        }
