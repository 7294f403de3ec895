"""Prometheus metrics of one daemon: ``GET /v1/metrics`` and, optionally, a TCP scraper port.

This module owns the daemon's :class:`prometheus_client.CollectorRegistry` (one per
daemon, never the library's global one) and every metric in it (the table in docs/operations.md
lists them). Events are counted where they happen (HTTP requests by the API's
request handler, commits as the repository's commit listener, sync rounds as the sync
engine's observer, cloud requests by :class:`ledgerd.sync.metered.Metered`); what is
a state (open pages, pending writes, pieces by status) is read when scraped, from
the open pages only, with one small query per page.
"""

from __future__ import annotations

import bisect
import itertools
import logging
from collections.abc import Iterable
from typing import TYPE_CHECKING, Any

from aiohttp import web
from prometheus_client import (
    CollectorRegistry,
    Counter,
    Histogram,
    disable_created_metrics,
    generate_latest,
)
from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    Metric,
)
from prometheus_client.exposition import CONTENT_TYPE_LATEST
from prometheus_client.registry import Collector
from prometheus_client.utils import floatToGoString

from ledgerd.store import Commit, CommitListener, GcResult, Page, Repository
from ledgerd.store.errors import named
from ledgerd.sync import progress
from ledgerd.sync.metered import CloudCounters

if TYPE_CHECKING:
    from ledgerd.sync.engine import Stats

log = logging.getLogger(__name__)

_PIECES = (
    "SELECT 'all', count(*) FROM objects UNION ALL "
    "SELECT status, count(*) FROM unsynced GROUP BY status UNION ALL "
    "SELECT 'remote', count(*) FROM remote_pieces UNION ALL "
    "SELECT 'journal', count(*) FROM journal_entries"
)


class Metrics:
    """The metrics of one daemon."""

    def __init__(self) -> None:
        # No `_created` series: the process's start time says the same (a process-wide
        # setting of the library; the daemon is its only user in the process).
        disable_created_metrics()  # type: ignore[no-untyped-call]
        self.registry = CollectorRegistry(auto_describe=True)
        r = self.registry
        self.http = _Http()
        r.register(self.http)
        self.commits = Counter(
            "ledgerd_commits",
            "Commits made on this device (kind: local, or import of other devices' writes)",
            ["kind"],
            registry=r,
        )
        self.rounds = Counter(
            "ledgerd_sync_rounds",
            "Sync rounds (result: ok or failed)",
            ["result"],
            registry=r,
        )
        self.round_seconds = Histogram(
            "ledgerd_sync_round_duration_seconds",
            "Duration of sync rounds",
            registry=r,
            buckets=(0.01, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 300),
        )
        self.packs = Counter(
            "ledgerd_sync_packs",
            "Packs uploaded or imported (direction: up or down)",
            ["direction"],
            registry=r,
        )
        self.gc_runs = Counter(
            "ledgerd_gc_pages", "Pages garbage-collected (each run of one page)", registry=r
        )
        self.gc_freed = Counter(
            "ledgerd_gc_freed_bytes", "Bytes of pieces garbage collection deleted", registry=r
        )
        self.gc_pieces = Counter(
            "ledgerd_gc_freed_pieces", "Pieces garbage collection deleted", registry=r
        )
        self.gc_pruned = Counter(
            "ledgerd_gc_pruned_commits", "Commits history retention pruned", registry=r
        )
        self.gc_seconds = Histogram(
            "ledgerd_gc_duration_seconds",
            "Duration of the garbage collection of one page",
            registry=r,
            buckets=(0.01, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 300),
        )
        self.evicted = Counter(
            "ledgerd_evicted_pages",
            "Pages evicted (ledgerctl evict, disk_budget, evict_after)",
            registry=r,
        )
        self.cloud = CloudCounters()
        self._repo: Repository | None = None
        self._engine: Any = None
        self._snapshot: dict[str, Any] = {}
        r.register(_State(self))

    def start(self, repo: Repository, engine: Any) -> None:
        """What the scrape-time gauges read: the repository and the sync engine (or None)."""
        self._repo, self._engine = repo, engine

    # -- events ----------------------------------------------------------------------

    def listener(self, then: CommitListener | None) -> CommitListener:
        """A commit listener that counts commits and passes them on to ``then``."""
        return _Commits(self, then)

    def gc_done(self, r: GcResult) -> None:
        self.gc_runs.inc()
        self.gc_freed.inc(r.bytes_freed)
        self.gc_pieces.inc(r.pieces_freed)
        self.gc_pruned.inc(r.commits_pruned)
        self.gc_seconds.observe(r.seconds)

    def round_done(self, seconds: float, stats: Stats, error: BaseException | None) -> None:
        self.rounds.labels("failed" if error else "ok").inc()
        self.round_seconds.observe(seconds)
        if stats.uploaded_packs:
            self.packs.labels("up").inc(stats.uploaded_packs)
        if stats.downloaded_packs:
            self.packs.labels("down").inc(stats.downloaded_packs)

    def request_done(self, route: str, method: str, status: int, seconds: float) -> None:
        """Count an HTTP request the API served (``route``: its path template)."""
        self.http.done(route, method, status, seconds)

    # -- exposition ------------------------------------------------------------------

    def render(self) -> bytes:
        return bytes(generate_latest(self.registry))

    async def endpoint(self, request: web.Request) -> web.Response:
        """The metrics in Prometheus' text format (``GET /v1/metrics``, ``GET /metrics``)."""
        await self.refresh()
        return web.Response(body=self.render(), headers={"Content-Type": CONTENT_TYPE_LATEST})

    async def refresh(self) -> None:
        """Read the state that the gauges show (the collector itself cannot await)."""
        pages: dict[str, float] = {}
        journal = 0.0
        conflicts = 0
        repo = self._repo
        open_pages = [] if repo is None else [p for p in repo.open_pages() if not p.closed]
        for page in open_pages:
            if page.pending_conflict:
                conflicts += 1
            try:
                with page.lease(use=False):
                    counts = await _piece_counts(page)
            except Exception as e:  # closed meanwhile, or unreadable: the next scrape tells
                log.debug("metrics of page %s: %s", named(page.id), e)
                continue
            journal += counts.pop("journal", 0)
            for k, v in counts.items():
                pages[k] = pages.get(k, 0) + v
        self._snapshot = {
            "sync": None if self._engine is None else self._engine.gauges(),
            "open_pages": float(len(open_pages)),
            "journal": journal,
            "conflicts": float(conflicts),
            "pieces": pages,
        }


async def _piece_counts(page: Page) -> dict[str, float]:
    rows = await page.db.read_all(_PIECES)
    raw = {str(k): float(v) for k, v in rows}
    transient, local = raw.get("0", 0.0), raw.get("1", 0.0)
    return {
        "transient": transient,
        "local": local,
        "synced": raw.get("all", 0.0) - transient - local,
        "remote": raw.get("remote", 0.0),
        "journal": raw.get("journal", 0.0),
    }


class _Commits:
    def __init__(self, metrics: Metrics, then: CommitListener | None) -> None:
        self.metrics = metrics
        self.then = then

    def page_committed(self, page: Page, commit: Commit) -> None:
        self.metrics.commits.labels(page.graph.last_kind).inc()
        if self.then is not None:
            self.then.page_committed(page, commit)


LATENCY_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30)
"""Upper bounds (seconds) of the buckets of ``ledgerd_http_request_duration_seconds``."""
_LE = [floatToGoString(b) for b in LATENCY_BUCKETS] + ["+Inf"]  # type: ignore[no-untyped-call]


class _Http(Collector):
    """The HTTP metrics: requests by route template, method and status, and their
    durations by route template. A request is counted in plain dicts and lists (a
    few operations on the event loop, rather than two metric children's locks and a
    walk of the buckets), which become metric families when scraped; the label sets
    are those the metrics show, so the counts hold nothing more."""

    def __init__(self) -> None:
        self.requests: dict[tuple[str, str, int], int] = {}
        self.durations: dict[str, list[float]] = {}
        """Route -> count of each bucket (the last one: over every bound), then the sum."""

    def done(self, route: str, method: str, status: int, seconds: float) -> None:
        key = (route, method, status)
        self.requests[key] = self.requests.get(key, 0) + 1
        counts = self.durations.get(route)
        if counts is None:
            counts = self.durations[route] = [0.0] * (len(LATENCY_BUCKETS) + 2)
        counts[bisect.bisect_left(LATENCY_BUCKETS, seconds)] += 1  # le: at most the bound
        counts[-1] += seconds

    def describe(self) -> Iterable[Metric]:
        return []

    def collect(self) -> Iterable[Metric]:
        requests = CounterMetricFamily(
            "ledgerd_http_requests",
            "HTTP requests served, by route template, method and status",
            labels=["route", "method", "status"],
        )
        for (route, method, status), n in self.requests.items():
            requests.add_metric([route, method, str(status)], n)
        yield requests
        durations = HistogramMetricFamily(
            "ledgerd_http_request_duration_seconds",
            "Time from a request's arrival to its response's end, by route template",
            labels=["route"],
        )
        for route, counts in self.durations.items():
            cumulative = list(itertools.accumulate(counts[:-1]))
            durations.add_metric([route], list(zip(_LE, cumulative, strict=True)), counts[-1])
        yield durations


class _State(Collector):
    """Gauges of the state, and the cloud's counters, as of the last refresh."""

    def __init__(self, metrics: Metrics) -> None:
        self.m = metrics

    def describe(self) -> Iterable[Metric]:
        return []

    def collect(self) -> Iterable[Metric]:
        snap = self.m._snapshot
        yield GaugeMetricFamily(
            "ledgerd_open_pages", "Pages open now", value=snap.get("open_pages", 0.0)
        )
        yield GaugeMetricFamily(
            "ledgerd_pending_journal_entries",
            "Acknowledged writes not committed yet (journal entries of the open pages)",
            value=snap.get("journal", 0.0),
        )
        yield GaugeMetricFamily(
            "ledgerd_waiting_conflicts",
            "Open pages whose conflicts wait for a resolver (none connected, or it failed)",
            value=snap.get("conflicts", 0.0),
        )
        yield GaugeMetricFamily(
            "ledgerd_sync_enabled",
            "1 when cloud sync is on; 0 when it is off (no cloud: every page is local only)",
            value=0.0 if self.m._engine is None else 1.0,
        )
        if (sync := snap.get("sync")) is not None:
            yield from _sync_gauges(sync)
        yield _pieces(snap)
        yield from _cloud_counters(self.m.cloud)


def _pieces(snap: dict[str, Any]) -> Metric:
    pieces = GaugeMetricFamily(
        "ledgerd_pieces",
        "Pieces of the open pages by status (transient: staged by a journal; local: "
        "stored here only, tree nodes included, which never travel; synced; remote: in "
        "the cloud only)",
        labels=["status"],
    )
    for status in ("transient", "local", "synced", "remote"):
        pieces.add_metric([status], snap.get("pieces", {}).get(status, 0.0))
    return pieces


def _cloud_counters(c: CloudCounters) -> Iterable[Metric]:
    requests = CounterMetricFamily(
        "ledgerd_cloud_requests",
        "Requests to the bucket, each attempt counted (kind: put, get, list, delete, "
        "create_bucket; a listing counts once)",
        labels=["kind"],
    )
    for kind, n in sorted(c.requests.items()):
        requests.add_metric([kind], n)
    yield requests
    errors = CounterMetricFamily(
        "ledgerd_cloud_errors",
        "Failed requests to the bucket, by kind and error type",
        labels=["kind", "error"],
    )
    for (kind, error), n in sorted(c.errors.items()):
        errors.add_metric([kind, error], n)
    yield errors
    yield CounterMetricFamily(
        "ledgerd_cloud_retries",
        "Transient failures of requests to the bucket (each one is retried)",
        value=c.retried,
    )
    moved = CounterMetricFamily(
        "ledgerd_cloud_bytes",
        "Bytes sent to (up) and read from (down) the bucket",
        labels=["direction"],
    )
    moved.add_metric(["up"], c.bytes_up)
    moved.add_metric(["down"], c.bytes_down)
    yield moved
    seconds = CounterMetricFamily(
        "ledgerd_cloud_request_seconds",
        "Time spent in requests to the bucket, by kind",
        labels=["kind"],
    )
    for kind, s in sorted(c.seconds.items()):
        seconds.add_metric([kind], s)
    yield seconds


HELD_STATES = (
    progress.REFUSED,
    progress.KEY_MISSING,
    progress.WAITING,
    progress.FAILED,
    progress.DEFERRED,
    progress.RETRY,
)
"""The states of held packs, each a series of ``ledgerd_sync_held_packs``."""


def _sync_gauges(sync: dict[str, Any]) -> Iterable[Metric]:
    """The gauges of sync's state (only when cloud sync is on)."""
    yield GaugeMetricFamily(
        "ledgerd_sync_healthy",
        "1 when sync is healthy (no problem, no gap, a round finished lately), else 0",
        value=float(sync["healthy"]),
    )
    yield GaugeMetricFamily(
        "ledgerd_sync_synced",
        "1 when sync is healthy and nothing waits for upload, else 0",
        value=float(sync["synced"]),
    )
    yield GaugeMetricFamily(
        "ledgerd_sync_pending_uploads",
        "Pages with writes waiting for upload",
        value=float(sync["pending_uploads"]),
    )
    held = GaugeMetricFamily(
        "ledgerd_sync_held_packs",
        "Packs (or pages of packs) listed and not imported, by state",
        labels=["state"],
    )
    for state in HELD_STATES:
        held.add_metric([state], float(sync["held"].get(state, 0)))
    yield held
    yield GaugeMetricFamily(
        "ledgerd_sync_gaps",
        "Stretches of other devices' pack sequences missing from the bucket's listing",
        value=float(sync["gaps"]),
    )
    if sync["last_round_ok"] is not None:
        yield GaugeMetricFamily(
            "ledgerd_sync_last_round_ok_timestamp_seconds",
            "When a sync round last finished without failing (UNIX time)",
            value=float(sync["last_round_ok"]),
        )


def scraper_app(metrics: Metrics) -> web.Application:
    """The app of ``metrics_listen``: ``GET /metrics`` and nothing else."""
    app = web.Application()
    app.router.add_get("/metrics", metrics.endpoint)
    return app
