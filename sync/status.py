"""What sync reports: each page's last upload, what went wrong, and the health that follows.

This module owns :class:`StatusBoard`: per page, when it last synced and why its
last upload failed (:class:`PageState`); the last round's error and figures; the
devices whose download failed; the clocks seen ahead of this one; and the reports
built from them and from the held packs and gaps of :class:`sync.feed.Feed` (sync's
part of ``/v1/status``, the problems ``ledgerctl sync`` prints, the health the
daemon serves), each page's sync state and every device the feed showed. The jobs
tell it what happened; it changes nothing it reports on, and its only I/O is the
pages' last sync times, kept in repository meta (:mod:`sync.pagestate`).
"""

from __future__ import annotations

import dataclasses
import logging
import time
from collections import Counter
from collections.abc import Iterable
from typing import Any, Protocol

from ledgerd.store import Page
from ledgerd.store.errors import counted, named
from ledgerd.store.page import exchange as ex
from ledgerd.store.tree.merge import needs_resolver
from ledgerd.sync import layout, progress
from ledgerd.sync.checkpoints import Checkpoints
from ledgerd.sync.compaction import Compactor
from ledgerd.sync.context import LOCAL, Key, SyncContext
from ledgerd.sync.feed import Feed
from ledgerd.sync.pagestate import SYNCED_PREFIX, PageState, meta_key, meta_name, waiting_reason

log = logging.getLogger(__name__)

CLOCK_WINDOW = 3600.0
"""Seconds a device's clock bound stands before a smaller one replaces it (a clock
set right is seen within the hour)."""


class PendingPages(Protocol):
    """The pages with uploads pending (:class:`sync.pending.Pending`)."""

    def __len__(self) -> int: ...

    def __contains__(self, key: object) -> bool: ...


def describe(e: BaseException) -> str:
    """An exception as status shows it: its type and message."""
    return f"{type(e).__name__}: {e}"


def stale_after(poll_interval: float, poll_max: float) -> float:
    """Seconds after the last finished round past which sync is late (not healthy):
    three polls, at least a minute, and twice the longest time between polls, which an
    idle device waits between rounds (with only ``3 * poll_interval``, a device idle
    for a minute turned unhealthy before each of its polls)."""
    return max(60.0, 3 * poll_interval, 2 * poll_max)


class StatusBoard:
    """What went wrong and when things last went right.

    ``pending`` is the pages with uploads pending (looked at, never changed here).
    """

    def __init__(
        self,
        ctx: SyncContext,
        feed: Feed,
        pending: PendingPages,
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
        self.clocks: dict[str, tuple[float, float]] = {}
        """Per device: (the largest ``ahead`` seen lately, when): see :meth:`clock_seen`."""
        self._unsaved: set[Key] = set()  # pages whose last sync time changed since save()

    # -- the pages' last sync times, kept across restarts -------------------------------

    async def load(self) -> None:
        """The pages' last sync times saved by :meth:`save` (before this process's)."""
        for name, raw in (await self.ctx.repo.metas(SYNCED_PREFIX)).items():
            key = meta_key(name)
            try:
                saved = PageState.decode(raw)
            except (ValueError, TypeError):  # (json's errors are ValueErrors)
                continue
            if key is not None and key not in self.states:
                self.states[key] = saved

    async def save(self) -> None:
        """Record the last sync times that changed (one transaction)."""
        keys, self._unsaved = self._unsaved, set()
        values: dict[str, bytes | None] = {}
        for key in keys:
            st = self.states.get(key)
            values[meta_name(key)] = None if st is None else st.encode()
        try:
            await self.ctx.repo.set_metas(values)
        except Exception:
            self._unsaved |= keys  # (tried again after the next round)
            raise

    # -- what the jobs tell ------------------------------------------------------------

    def synced(self, page: Page) -> None:
        """The page's upload is recorded."""
        key = (page.ledger, page.id)
        st = self.states.setdefault(key, PageState())
        st.last_sync, st.last_error = time.time(), None
        self.conflicts_of(page)

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

    def imported(self, page: Page) -> None:
        key = (page.ledger, page.id)
        self.states.setdefault(key, PageState()).last_sync = time.time()
        self.conflicts_of(page)

    def conflicts_of(self, page: Page) -> None:
        """Note the page's conflicts now (shown while it is closed) and save its state."""
        key = (page.ledger, page.id)
        st = self.states.setdefault(key, PageState())
        st.conflicts = page.conflict_count
        st.waiting = bool(st.conflicts) and needs_resolver(page.policy)
        self._unsaved.add(key)

    def forget(self, key: Key) -> None:
        """The page is gone from this device (deleted or evicted)."""
        if self.states.pop(key, None) is not None:
            self._unsaved.add(key)

    def device_failed(self, device: str, e: BaseException) -> None:
        self.device_errors[device] = describe(e)

    def device_ok(self, device: str) -> None:
        self.device_errors.pop(device, None)

    def clock_ahead(self, device: str, ahead: float) -> None:
        """Writes of ``device`` are stamped ``ahead`` seconds ahead of this device's clock."""
        if device not in self.skew:
            log.warning("device %s's clock is %.0fs ahead of this one", device, ahead)
        self.skew[device] = {"device": device, "ahead_s": round(ahead, 1), "seen_at": time.time()}

    def clock_seen(self, device: str, ahead: float) -> None:
        """Writes of ``device`` imported now are stamped ``ahead`` seconds ahead of this
        device's clock (negative: behind). Their transfer took time, so the device's
        clock is at least ``ahead`` ahead: the largest bound of the last
        :data:`CLOCK_WINDOW` is kept."""
        now = time.time()
        old = self.clocks.get(device)
        if old is None or ahead >= old[0] or now - old[1] > CLOCK_WINDOW:
            self.clocks[device] = (round(ahead, 3), now)

    # -- reports -----------------------------------------------------------------------

    def page_states(self, keys: Iterable[Key]) -> list[dict[str, Any]]:
        """Each page's sync as far as sync knows it without opening the page: ``sync``
        is ``local`` (the ``_local`` ledger: never uploaded), ``error`` (its upload or
        a pack of it failed: ``last_error``), ``pending`` (commits wait for upload, or
        a round is to look), or ``synced`` (nothing waits); ``last_sync`` is the time
        of its last upload or import recorded here (None: none recorded); ``conflicts``
        its keys with concurrent values then (None: unknown), and ``conflict`` why they
        wait, when its policy asks a resolver."""
        held: dict[Key, str] = {}
        for h in self.feed.held():
            if h.key is not None and h.state != progress.RETRY:
                held.setdefault(h.key, f"pack {h.ln.name}: {h.reason}")
        out = []
        for key in keys:
            st = self.states.get(key)
            error = (st.last_error if st is not None else None) or held.get(key)
            if key[0] == LOCAL:
                state = "local"
            elif error:
                state = "error"
            elif key in self.pending:
                state = "pending"
            else:
                state = "synced"
            out.append(
                {
                    "sync": state,
                    "last_sync": st.last_sync if st is not None else None,
                    "last_error": error,
                    "conflicts": st.conflicts if st is not None else None,
                    "conflict": waiting_reason(st),
                }
            )
        return out

    def conflicted(self) -> list[tuple[Key, int, str | None]]:
        """The pages whose keys held concurrent values at their last sync: each with
        how many, and why they wait (None: the policy shows the winner)."""
        return [
            (key, st.conflicts, waiting_reason(st))
            for key, st in sorted(self.states.items())
            if st.conflicts
        ]

    def devices(self) -> list[dict[str, Any]]:
        """Every device the feed showed (this one first), from what rounds learned: its
        newest pack listed (``last_pack_at``: the pack's feed time, in seconds; its
        sequence), a bound on its clock's lead over this one (``clock_ahead_s``, see
        :meth:`clock_seen`; None before a write of it was imported), and its error."""
        own, names = self.ctx.device, self.feed.names
        out: list[dict[str, Any]] = [
            {
                "device": own,
                "this_device": True,
                "last_pack_at": names.own_time / 1000 if names.own_time else None,
                "last_seq": names.own_seq or None,
                "clock_ahead_s": 0.0,
                "clock_seen_at": None,
                "error": None,
            }
        ]
        others = {*self.feed.logs, *self.clocks, *self.device_errors, *self.skew} - {own}
        for device in sorted(others):
            dl = self.feed.logs.get(device)
            clock = self.clocks.get(device)
            out.append(
                {
                    "device": device,
                    "this_device": False,
                    "last_pack_at": dl.max_time / 1000 if dl and dl.max_time else None,
                    "last_seq": dl.max_seq if dl and dl.max_seq else None,
                    "clock_ahead_s": clock[0] if clock else None,
                    "clock_seen_at": clock[1] if clock else None,
                    "error": self.device_errors.get(device),
                }
            )
        return out

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
        pages = [_page_json(key, st) for key, st in sorted(self.states.items()) if st.last_error]
        packs = [_held_json(h) for h in self.feed.held()]
        gaps = [
            {"device": dl.device, "first_seq": g.first, "last_seq": g.last, "since": g.since}
            for _, dl in sorted(self.feed.logs.items())
            for g in dl.missing()
        ]
        health = self.health(poll_interval, poll_max)
        failure, next_try = self.ctx.store.last_failure(), self.ctx.store.next_try()
        return {
            "healthy": health["healthy"],
            "synced": health["synced"],
            "reasons": health["reasons"],
            "last_round_ok": self.last_round_ok,
            "bucket_error": self.ctx.bucket_error,
            "bucket_error_code": self.ctx.bucket_error_code,
            "encryption": self._encryption(),
            "round_error": self.round_error,
            # What the bucket's requests are retrying now, and in how many seconds.
            "retrying": failure if next_try is not None else None,
            "next_try_in_s": (
                round(max(0.0, next_try - time.monotonic()), 1)
                if failure and next_try is not None
                else None
            ),
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


def _page_json(key: Key, st: PageState) -> dict[str, Any]:
    """A page whose last upload failed, as status lists it."""
    return {
        "ledger": layout.b64(key[0]),
        "page": layout.b64(key[1]),
        "ledger_text": layout.text_or_none(key[0]),
        "page_text": layout.text_or_none(key[1]),
        "error": st.last_error,
        "last_sync": st.last_sync,
    }


def _held_json(h: progress.Held) -> dict[str, Any]:
    """A held pack, as status lists it."""
    return {
        **h.json(),
        "ledger": layout.b64(h.key[0]) if h.key else None,
        "page": layout.b64(h.key[1]) if h.key else None,
        "ledger_text": layout.text_or_none(h.key[0]) if h.key else None,
        "page_text": layout.text_or_none(h.key[1]) if h.key else None,
    }
