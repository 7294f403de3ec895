"""Kept conflicts over HTTP: two daemons on one bucket write a document concurrently;
both show the losing revision in ``_meta._conflicts`` (and in the changes feed when
asked), serve it by ``?rev=``, and CouchDB's ``DELETE …?rev=R`` resolves it everywhere."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from ledgerd.daemon.client import Client
from tests.daemon.conftest import Daemon, UnixHTTPConnection, _start, _sync

BASE = "/v1/ledgers/app/pages/p/docs"


def _http(d: Daemon, method: str, path: str) -> tuple[int, Any]:
    conn = UnixHTTPConnection(d.socket)
    try:
        conn.request(method, path)
        r = conn.getresponse()
        body = r.read()
        return r.status, json.loads(body) if body.strip() else None
    finally:
        conn.close()


def test_kept_conflicts_over_http(short_tmp: Path, s3_endpoint: str, bucket: str) -> None:
    a = _start(short_tmp / "a", s3_endpoint, bucket)
    b = _start(short_tmp / "b", s3_endpoint, bucket)
    try:
        with Client(a.socket) as ca, Client(b.socket) as cb:
            da, db = ca.documents("app", "p"), cb.documents("app", "p")
            doc_id = da.create("c", {"v": "base"})["_meta"]["_id"]
            _sync(a)
            _sync(b)
            ra = da.replace("c", doc_id, {"v": "a"})["_meta"]["_rev"]
            rb = db.replace("c", doc_id, {"v": "b"})["_meta"]["_rev"]
            for d in (a, b, a):
                _sync(d)
            win, lose = max(ra, rb), min(ra, rb)
            lost_data = {"v": "a"} if lose == ra else {"v": "b"}
            doc = f"{BASE}/c/{doc_id}"
            for d in (a, b):
                status, got = _http(d, "GET", doc + "?conflicts=1")
                assert status == 200 and got["_meta"]["_rev"] == win
                assert got["_meta"]["_conflicts"] == [lose]
                assert "_conflicts" not in _http(d, "GET", doc)[1]["_meta"]
                status, old = _http(d, "GET", f"{doc}?rev={lose}")
                assert status == 200 and old["_meta"]["_rev"] == lose
                assert old["_data"] == lost_data
                status, feed = _http(d, "GET", f"{BASE}/_changes?conflicts=1")
                assert [x["_meta"].get("_conflicts") for x in feed["documents"]] == [[lose]]
            # the Python client, blocking (derived from the async one)
            assert da.get("c", doc_id, conflicts=True)["_meta"]["_conflicts"] == [lose]
            assert db.get("c", doc_id, rev=lose)["_data"] == lost_data
            # ledgerctl doc get --conflicts / --rev
            out = a.ledgerctl("doc", "get", "app", "p", "c", doc_id, "--conflicts", check=True)
            assert json.loads(out.stdout)["_meta"]["_conflicts"] == [lose]
            out = a.ledgerctl("doc", "get", "app", "p", "c", doc_id, "--rev", lose, check=True)
            assert json.loads(out.stdout)["_data"] == lost_data

            status, resolved = _http(b, "DELETE", f"{doc}?rev={lose}")
            assert status == 200, resolved
            assert resolved["_meta"]["_rev"] > win and "_deleted" not in resolved["_meta"]
            status, err = _http(b, "DELETE", f"{doc}?rev={lose}")  # not kept any more
            assert status == 409 and err["error"]["code"] == "conflict"
            for d in (b, a):
                _sync(d)
            for d in (a, b):
                status, got = _http(d, "GET", doc + "?conflicts=1")
                assert got["_meta"]["_rev"] == resolved["_meta"]["_rev"]
                assert "_conflicts" not in got["_meta"]
                assert _http(d, "GET", f"{doc}?rev={lose}")[0] == 404
    finally:
        assert a.stop() == 0, a.log_text()
        assert b.stop() == 0, b.log_text()
