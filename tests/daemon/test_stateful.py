"""Key routes in random order against a model: puts (small and streamed), batches,
deletes, clears, page and ledger deletes on a few pages of a few ledgers, checked
after every step by the listings, the entries (a few at a time, with their tokens),
ranged reads, and reads at the commits seen so far (``?at=``)."""

from __future__ import annotations

import base64
import json
import os
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from urllib.parse import quote

import hypothesis.strategies as st
import pytest
from hypothesis import note
from hypothesis.stateful import RuleBasedStateMachine, invariant, rule, run_state_machine_as_test

from tests.daemon.conftest import Daemon, UnixHTTPConnection, stateful_settings
from tests.daemon.test_cli import shared_daemon

PAGES = [b"p", b"\xff", b"."]
KEYS = [b"a", b"a/b", b"\x00", b"\xff\xfe", b"%2F", b"b"]
PREFIXES = [None, b"a", b"\x00", b"%"]
VALUES = st.binary(max_size=20)


@pytest.fixture(scope="module")
def shared() -> Iterator[Daemon]:
    yield from shared_daemon()


def _q(name: bytes) -> str:
    return quote(name, safe="")


def _b64(data: bytes) -> str:
    return base64.b64encode(data).decode()


@dataclass
class _Page:
    made: bool = False
    deleted: bool = False
    """Deleted since it was last cleared: its tree holds the deletion mark."""
    keys: dict[bytes, bytes] = field(default_factory=dict)

    @property
    def listed(self) -> bool:
        return self.made and not (self.deleted and not self.keys)


class KeyPages(RuleBasedStateMachine):
    socket: Path

    def __init__(self) -> None:
        super().__init__()
        self.conn = UnixHTTPConnection(self.socket)
        run = os.urandom(4).hex()
        self.ledgers = [f"l{run}".encode(), f"\x00{run}".encode(), f"%{run}".encode()]
        self.pages = {(i, p): _Page() for i in range(3) for p in PAGES}
        self.seen: list[tuple[int, bytes, str, dict[bytes, bytes]]] = []
        """(ledger, page, commit, the page's keys at that commit)"""

    def call(
        self,
        method: str,
        path: str,
        body: bytes | None = None,
        headers: dict[str, str] | None = None,
    ) -> tuple[int, bytes, str | None]:
        """The status, the body and the error's code (None for a success or a HEAD)."""
        self.conn.request(method, path, body=body, headers=headers or {})
        r = self.conn.getresponse()
        data = r.read()
        note(f"{method} {path} -> {r.status} {data[:200]!r}")
        assert r.status < 500, (method, path, r.status, data)
        code = None
        if r.status >= 400 and method != "HEAD":
            code = json.loads(data)["error"]["code"]
            assert isinstance(code, str)
        return r.status, data, code

    def url(self, i: int, page: bytes) -> str:
        return f"/v1/ledgers/{_q(self.ledgers[i])}/pages/{_q(page)}"

    def committed(self, i: int, page: bytes) -> None:
        """Remember the page's head (one: a single device) and what it holds."""
        _, data, _ = self.call("GET", self.url(i, page) + "/heads")
        (head,) = json.loads(data)["heads"]
        self.seen.append((i, page, head["id"], dict(self.pages[i, page].keys)))

    def expect_404(self, i: int, status: int, code: str | None) -> None:
        want = "page_not_found" if self.ledger_listed(i) else "ledger_not_found"
        assert (status, code) == (404, want)

    def ledger_listed(self, i: int) -> bool:
        return any(self.pages[i, p].listed for p in PAGES)

    @rule(
        i=st.integers(0, 2),
        page=st.sampled_from(PAGES),
        key=st.sampled_from(KEYS),
        value=VALUES,
        big=st.integers(0, 9),
    )
    def put(self, i: int, page: bytes, key: bytes, value: bytes, big: int) -> None:
        if big == 0:  # over 256 KiB: streamed into the page
            value += b"x" * 300_000
        status, _, _ = self.call("PUT", self.url(i, page) + "/keys/" + _q(key), value)
        assert status == 204
        pg = self.pages[i, page]
        pg.made, pg.keys[key] = True, value
        self.committed(i, page)

    @rule(
        i=st.integers(0, 2),
        page=st.sampled_from(PAGES),
        ops=st.lists(st.tuples(st.sampled_from(KEYS), st.none() | VALUES), max_size=4),
    )
    def batch(self, i: int, page: bytes, ops: list[tuple[bytes, bytes | None]]) -> None:
        body = [
            {"op": "delete", "key": _b64(k)}
            if v is None
            else {"op": "put", "key": _b64(k), "value": _b64(v)}
            for k, v in ops
        ]
        status, _, _ = self.call(
            "POST", self.url(i, page) + "/batch", json.dumps({"ops": body}).encode()
        )
        assert status == 200
        if ops:
            pg = self.pages[i, page]
            pg.made = True
            for k, v in ops:
                if v is None:
                    pg.keys.pop(k, None)
                else:
                    pg.keys[k] = v
            self.committed(i, page)

    @rule(i=st.integers(0, 2), page=st.sampled_from(PAGES), key=st.sampled_from(KEYS))
    def delete_key(self, i: int, page: bytes, key: bytes) -> None:
        status, _, code = self.call("DELETE", self.url(i, page) + "/keys/" + _q(key))
        pg = self.pages[i, page]
        if not pg.made:
            assert status == 404 and code in ("page_not_found", "ledger_not_found")
            return
        assert status == 204
        pg.keys.pop(key, None)

    @rule(i=st.integers(0, 2), page=st.sampled_from(PAGES))
    def clear(self, i: int, page: bytes) -> None:
        status, _, _ = self.call("POST", self.url(i, page) + "/clear")
        pg = self.pages[i, page]
        if not pg.made:
            assert status == 404
            return
        assert status == 204
        pg.keys, pg.deleted = {}, False
        self.committed(i, page)

    @rule(i=st.integers(0, 2), page=st.sampled_from(PAGES))
    def delete_page(self, i: int, page: bytes) -> None:
        status, _, code = self.call("DELETE", self.url(i, page))
        pg = self.pages[i, page]
        if not pg.listed:
            self.expect_404(i, status, code)
            return
        assert status == 204
        pg.keys, pg.deleted = {}, True
        self.committed(i, page)

    @rule(i=st.integers(0, 2))
    def delete_ledger(self, i: int) -> None:
        status, _, code = self.call("DELETE", f"/v1/ledgers/{_q(self.ledgers[i])}")
        listed = [p for p in PAGES if self.pages[i, p].listed]
        if not listed:
            assert (status, code) == (404, "ledger_not_found")
            return
        assert status == 204
        for p in listed:
            self.pages[i, p].keys, self.pages[i, p].deleted = {}, True
            self.committed(i, p)

    @rule(
        i=st.integers(0, 2),
        page=st.sampled_from(PAGES),
        key=st.sampled_from(KEYS),
        part=st.none() | st.tuples(st.integers(0, 30), st.integers(0, 30)),
    )
    def get(self, i: int, page: bytes, key: bytes, part: tuple[int, int] | None) -> None:
        headers = {"Range": f"bytes={part[0]}-{part[0] + part[1]}"} if part else {}
        pg = self.pages[i, page]
        for method in ("GET", "HEAD"):
            status, data, _ = self.call(
                method, self.url(i, page) + "/keys/" + _q(key), None, headers
            )
            if not pg.made or key not in pg.keys:
                assert status == 404
                continue
            value = pg.keys[key]
            if part and part[0] >= len(value):
                assert status == 416
            elif method == "HEAD":
                assert (status, data) == (206 if part else 200, b"")
            elif part:
                assert (status, data) == (206, value[part[0] : part[0] + part[1] + 1])
            else:
                assert (status, data) == (200, value)

    @rule(
        i=st.integers(0, 2),
        page=st.sampled_from(PAGES),
        limit=st.integers(1, 3),
        prefix=st.sampled_from(PREFIXES),
        values=st.booleans(),
    )
    def entries(self, i: int, page: bytes, limit: int, prefix: bytes | None, values: bool) -> None:
        pg = self.pages[i, page]
        got: list[tuple[bytes, bytes | None]] = []
        token = None
        for _ in range(len(KEYS) + 1):
            query = f"limit={limit}" + ("" if values else "&values=0")
            query += f"&prefix={_q(prefix)}" if prefix is not None else ""
            query += f"&token={_q(token.encode())}" if token else ""
            status, data, _ = self.call("GET", self.url(i, page) + "/entries?" + query)
            if not pg.made:
                assert status == 404
                return
            listing = json.loads(data)
            got += [
                (base64.b64decode(e["key"]), base64.b64decode(e["value"]) if values else None)
                for e in listing["entries"]
            ]
            token = listing["next"]
            if token is None:
                break
        want = sorted(
            (k, v if values else None)
            for k, v in pg.keys.items()
            if prefix is None or k.startswith(prefix)
        )
        assert got == want

    @rule(data=st.data())
    def read_at(self, data: st.DataObject) -> None:
        if not self.seen:
            return
        i, page, commit, keys = data.draw(st.sampled_from(self.seen))
        status, body, _ = self.call("GET", self.url(i, page) + f"/entries?at={commit}")
        assert status == 200
        got = {
            base64.b64decode(e["key"]): base64.b64decode(e["value"])
            for e in json.loads(body)["entries"]
        }
        assert got == keys

    @invariant()
    def listings(self) -> None:
        _, data, _ = self.call("GET", "/v1/ledgers")
        names = {base64.b64decode(x["name"]) for x in json.loads(data)["ledgers"]}
        for i, name in enumerate(self.ledgers):
            assert (name in names) == self.ledger_listed(i)
            status, data, code = self.call("GET", f"/v1/ledgers/{_q(name)}/pages")
            if not self.ledger_listed(i):
                assert (status, code) == (404, "ledger_not_found")
                continue
            got = {base64.b64decode(x["id"]) for x in json.loads(data)["pages"]}
            assert got == {p for p in PAGES if self.pages[i, p].listed}

    def teardown(self) -> None:
        self.conn.close()


def test_key_pages_follow_the_model(shared: Daemon) -> None:
    KeyPages.socket = shared.socket
    run_state_machine_as_test(KeyPages, settings=stateful_settings(10))
