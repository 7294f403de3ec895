"""Metrics: Prometheus' parser reads them, and they move when the daemon works."""

from __future__ import annotations

import os
import re
import socket
import urllib.request
from pathlib import Path

from hypothesis import given
from hypothesis import strategies as st
from prometheus_client.parser import text_string_to_metric_families

from ledgerd.daemon.client import Client
from ledgerd.daemon.metrics import LATENCY_BUCKETS, Metrics
from tests.daemon.conftest import Daemon, start_daemon

METRICS_DOC = Path(__file__).resolve().parents[2] / "docs" / "operations.md"
"""The reference page whose table lists every metric."""


def _samples(text: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    out = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            out[(s.name, tuple(sorted(s.labels.items())))] = s.value
    return out


def _total(
    samples: dict[tuple[str, tuple[tuple[str, str], ...]], float], name: str, **labels: str
) -> float:
    return sum(
        v
        for (n, ls), v in samples.items()
        if n == name and all((k, want) in ls for k, want in labels.items())
    )


def _scrape(c: Client) -> str:
    async def get() -> str:
        async with c.aio.session.get(c.url("/v1/metrics")) as resp:
            assert resp.status == 200
            assert resp.headers["Content-Type"].startswith("text/plain")
            return await resp.text()

    return c._call(get())


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def test_metrics_parse_and_move_with_work(short_tmp: Path) -> None:
    port = _free_port()
    d: Daemon = start_daemon(
        short_tmp,
        "--cloud",
        f"file://{short_tmp}/bucket",
        env={"LEDGERD_SYNC_INTERVAL": "60", "LEDGERD_METRICS_LISTEN": f"127.0.0.1:{port}"},
    )
    try:
        with Client(d.socket) as c:
            before = _samples(_scrape(c))
            value = os.urandom(1000)  # not compressible: the bytes up are at least these
            c.put("notes", "inbox", b"k", value)
            c.put("notes", "inbox", b"k2", os.urandom(1000))
            assert c.get("notes", "inbox", b"k") == value
            c.sync()
            after = _samples(_scrape(c))
        route = "/v1/ledgers/{ledger}/pages/{page}/keys/{key}"
        put = _total(after, "ledgerd_http_requests_total", route=route, method="PUT", status="204")
        assert put == 2 + _total(
            before, "ledgerd_http_requests_total", route=route, method="PUT", status="204"
        )
        assert _total(after, "ledgerd_http_request_duration_seconds_count", route=route) >= 3
        assert _total(after, "ledgerd_commits_total", kind="local") >= 1
        assert _total(after, "ledgerd_sync_rounds_total", result="ok") > _total(
            before, "ledgerd_sync_rounds_total", result="ok"
        )
        assert _total(after, "ledgerd_sync_round_duration_seconds_count") >= 1
        assert _total(after, "ledgerd_sync_packs_total", direction="up") >= 1
        assert _total(after, "ledgerd_cloud_requests_total", kind="put") >= 1
        assert _total(after, "ledgerd_cloud_requests_total", kind="list") >= 1
        assert _total(after, "ledgerd_cloud_bytes_total", direction="up") > 2000
        assert _total(after, "ledgerd_open_pages") == 1
        assert _total(after, "ledgerd_pieces", status="synced") >= 2
        # Uploads carry writes (keys and values), never tree nodes, which stay "local"
        # for good: what says nothing waits for upload is sync's own gauges.
        assert _total(after, "ledgerd_sync_pending_uploads") == 0
        assert _total(after, "ledgerd_sync_synced") == 1
        assert ("ledgerd_pending_journal_entries", ()) in after
        assert ("ledgerd_waiting_conflicts", ()) in after
        # The scraper's address serves the same registry.
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=30) as resp:
            scraped = _samples(resp.read().decode())
        assert _total(scraped, "ledgerd_cloud_requests_total", kind="put") >= 1
    finally:
        assert d.stop() == 0, d.log_text()


def test_error_answers_and_unknown_paths_are_counted(daemon: Daemon) -> None:
    """Requests answered with an error count under their route and status; a path no
    route serves counts as ``unmatched``."""

    async def status_of(c: Client, method: str, path: str) -> int:
        async with c.aio.session.request(method, c.url(path)) as resp:
            await resp.read()
            return resp.status

    with Client(daemon.socket) as c:
        c.put("notes", "inbox", b"k", b"v")
        before = _samples(_scrape(c))
        assert c._call(status_of(c, "GET", "/v1/ledgers/notes/pages/inbox/keys/nope")) == 404
        assert c._call(status_of(c, "GET", "/v1/nothing/here")) == 404
        assert c._call(status_of(c, "PATCH", "/v1/status")) == 405
        after = _samples(_scrape(c))

    def moved(**labels: str) -> float:
        name = "ledgerd_http_requests_total"
        return _total(after, name, **labels) - _total(before, name, **labels)

    keys = "/v1/ledgers/{ledger}/pages/{page}/keys/{key}"
    assert moved(route=keys, method="GET", status="404") == 1
    assert moved(route="unmatched", method="GET", status="404") == 1
    assert moved(route="unmatched", method="PATCH", status="405") == 1


def test_every_metric_is_in_the_docs(daemon: Daemon) -> None:
    with Client(daemon.socket) as c:
        text = _scrape(c)
    names = {f.name for f in text_string_to_metric_families(text)}
    assert len(names) >= 12
    doc = METRICS_DOC.read_text()
    for name in names:
        assert re.search(rf"`{name}(_total)?`", doc), f"{name} is not in docs/operations.md"


def test_a_bad_metrics_address_is_refused_at_start() -> None:
    import pytest

    from ledgerd.daemon.config import ConfigError, load

    for bad in ("9464", "localhost:", ":9464", "host:99999", "host:port"):
        with pytest.raises(ConfigError, match="metrics_listen"):
            load(env={"LEDGERD_METRICS_LISTEN": bad})
    assert load(env={"LEDGERD_METRICS_LISTEN": "[::1]:9464"}).metrics_listen == "[::1]:9464"


@given(
    st.lists(
        st.tuples(
            st.sampled_from(["/v1/a", "/v1/b/{key}", "unmatched"]),
            st.sampled_from(["GET", "PUT"]),
            st.sampled_from([200, 204, 404, 500]),
            st.one_of(
                st.sampled_from(LATENCY_BUCKETS),  # on a bound: counted in its bucket
                st.floats(min_value=0, max_value=100, allow_nan=False),
            ),
        ),
        max_size=30,
    )
)
def test_http_metrics_show_what_prometheus_own_metrics_would(
    requests: list[tuple[str, str, int, float]],
) -> None:
    """The daemon counts HTTP requests in plain dicts: scraped, they read exactly as
    prometheus_client's Counter and Histogram fed the same requests."""
    from prometheus_client import CollectorRegistry, Counter, Histogram, generate_latest

    ours = Metrics()
    registry = CollectorRegistry()
    counter = Counter(
        "ledgerd_http_requests",
        "HTTP requests served, by route template, method and status",
        ["route", "method", "status"],
        registry=registry,
    )
    histogram = Histogram(
        "ledgerd_http_request_duration_seconds",
        "Time from a request's arrival to its response's end, by route template",
        ["route"],
        registry=registry,
        buckets=LATENCY_BUCKETS,
    )
    for route, method, status, seconds in requests:
        ours.request_done(route, method, status, seconds)
        counter.labels(route, method, str(status)).inc()
        histogram.labels(route).observe(seconds)
    want = generate_latest(registry).decode()
    got = "".join(ln + "\n" for ln in ours.render().decode().splitlines() if "_http_" in ln)
    assert got == want
