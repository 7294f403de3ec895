"""The document routes in random order against a model: creates, replaces (with and
without an expected revision, stale ones refused), soft deletes, purges, attachments
(added, replaced, read in part, removed) and index declarations on two collections of
one page, checked by reads of single documents, listings (a few at a time, with their
tokens), index queries (against a brute-force filter and sort of the model), the
changes feed since the commits seen so far, and bad requests that must fail with
their documented code and change nothing. ``LEDGERD_STATEFUL_EXAMPLES`` (20) and
``LEDGERD_STATEFUL_STEPS`` (30) run it longer."""

from __future__ import annotations

import http.client
import json
import os
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar
from urllib.parse import quote

import hypothesis.strategies as st
import pytest
from hypothesis import event, note
from hypothesis.control import currently_in_test_context
from hypothesis.stateful import (
    RuleBasedStateMachine,
    initialize,
    invariant,
    rule,
    run_state_machine_as_test,
)
from ulid import ULID

from tests.daemon.conftest import Daemon, UnixHTTPConnection, stateful_settings
from tests.daemon.test_cli import shared_daemon

MAX_DOCUMENT = 2048
MAX_LISTING = 900
"""Small bounds, so that oversized bodies are cheap and listings stop early."""
COLLECTIONS = ["c", "c\x00/ü"]
"""The second continues the first after a NUL: neither may see the other's documents."""
INDEXES = {
    "by_city": ("city", "age"),
    "by_xy": ("x.y", "name"),
    "by_name": ("name", None),
}
SCALARS = st.sampled_from(
    [None, True, False, "", "a", "a\x00b", "Oslo", "ü", 0, 1, -1, 1.5, -0.0, 2**53 + 1, "1"]
)
_X = st.fixed_dictionaries({}, optional={"y": SCALARS}) | SCALARS
DATA = st.fixed_dictionaries(  # mostly indexed by every index, sometimes by none
    {"city": SCALARS, "age": SCALARS, "name": SCALARS, "x": st.fixed_dictionaries({"y": SCALARS})},
    optional={"tags": st.lists(SCALARS, max_size=2)},
) | st.fixed_dictionaries(
    {},
    optional={
        "city": SCALARS,
        "age": SCALARS,
        "name": SCALARS,
        "x": _X,
        "tags": st.lists(SCALARS, max_size=2),
    },
)
CONTENT = st.binary(max_size=40)
BAD_IDS = ["_x", "_design%2Fx", "a%00b", "x" * 513, "%C3%A9" * 257]
"""Ids no client may choose (text that is not a ULID is a chosen id: see docs/documents.md)."""


@pytest.fixture(scope="module")
def shared() -> Iterator[Daemon]:
    yield from shared_daemon(
        {
            "LEDGERD_MAX_DOCUMENT_BYTES": str(MAX_DOCUMENT),
            "LEDGERD_MAX_LISTING_BYTES": str(MAX_LISTING),
        },
        "ld-docsm-",
    )


def _q(name: str) -> str:
    return quote(name, safe="")


def _json_q(value: Any) -> str:
    return _q(json.dumps(value))


def _path(v: Any, path: str) -> Any:
    """The value at a dotted path of a document's data, or ``...`` if there is none."""
    for name in path.split("."):
        if not isinstance(v, dict) or name not in v:
            return ...
        v = v[name]
    return v


def _index_key(v: Any) -> tuple[Any, ...] | None:
    """A scalar's place in an index (FoundationDB's tuple order: null, strings, numbers
    as doubles, booleans); None if it is not indexed."""
    if v is None:
        return (0,)
    if isinstance(v, bool):
        return (3, v)
    if isinstance(v, str):
        return None if "/" in v else (1, v.encode())
    if isinstance(v, int | float):
        return (2, float(v) + 0.0)
    return None


def _later_rev(rev: str, ms: int = 1) -> str:
    """A revision ``ms`` milliseconds after ``rev``."""
    t = ULID.from_str(rev).milliseconds + ms
    return str(ULID.from_timestamp(t / 1000))


_HOSTILE: dict[str, dict[str, Any]] = {}
"""Bad requests (methods of the machine) and their arguments' strategies: one rule runs
them all, so that they take their share of the steps, not most of them."""


_F = TypeVar("_F", bound=Callable[..., None])


def _hostile(**strategies: Any) -> Callable[[_F], _F]:
    def record(f: _F) -> _F:
        _HOSTILE[f.__name__] = strategies
        return f

    return record


@dataclass
class _Doc:
    collection: str
    data: Any
    rev: str
    state: str = "live"
    """live, deleted or purged"""
    attachments: dict[str, tuple[str, str, bytes]] = field(default_factory=dict)
    """id -> (filename, content type, content), in the document's order"""
    old_revs: list[str] = field(default_factory=list)
    was_deleted: bool = False
    """Soft-deleted (a purge keeps its ``_deleted``)."""

    def set_rev(self, rev: str) -> None:
        self.old_revs.append(self.rev)
        self.rev = rev


class DocumentPages(RuleBasedStateMachine):
    socket: Path

    def __init__(self) -> None:
        super().__init__()
        self.conn = UnixHTTPConnection(self.socket)
        self.ledger = f"d{os.urandom(4).hex()}"
        self.base = f"/v1/ledgers/{self.ledger}/pages/p/docs"
        self.made = False
        self.docs: dict[str, _Doc] = {}
        self.indexes: set[tuple[str, str]] = set()
        self.marks: list[tuple[str, dict[str, str]]] = []
        """(a commit, the revision of each document at that commit)"""

    # -- plumbing --------------------------------------------------------------------

    def call(
        self,
        method: str,
        path: str,
        body: bytes | None = None,
        headers: dict[str, str] | None = None,
    ) -> tuple[int, bytes, str | None, http.client.HTTPResponse]:
        """The status, the body, the error's code (None for a success) and the response."""
        self.conn.request(method, path, body=body, headers=headers or {})
        r = self.conn.getresponse()
        data = r.read()
        if currently_in_test_context():  # (the examples below call it outside hypothesis)
            note(f"{method} {path} {headers or ''} -> {r.status} {data[:300]!r}")
        assert r.status < 500, (method, path, r.status, data)
        code = None
        if r.status >= 400 and method != "HEAD":
            code = json.loads(data)["error"]["code"]
            assert isinstance(code, str)
        return r.status, data, code, r

    def doc_url(self, doc_id: str, collection: str | None = None) -> str:
        c = collection if collection is not None else self.docs[doc_id].collection
        return f"{self.base}/{_q(c)}/{_q(doc_id)}"

    def expect_error(self, status: int, code: str | None, want: tuple[int, str]) -> None:
        """A request refused: ``want``, or 404 ledger_not_found before the page exists."""
        if not self.made and want[0] == 404:
            want = (404, "ledger_not_found")
        assert (status, code) == want

    def expect_missing_page(self, status: int, code: str | None) -> bool:
        """True (and the answer checked) if the page does not exist yet."""
        if self.made:
            return False
        assert (status, code) == (404, "ledger_not_found")
        return True

    def want_json(self, doc_id: str) -> dict[str, Any]:
        d = self.docs[doc_id]
        return {
            "_id": doc_id,
            "_rev": d.rev,
            "_data": None if d.state == "purged" else d.data,
            "_deleted": d.was_deleted,
            "_purged": d.state == "purged",
            "_attachments": [
                {"_id": a, "_filename": f, "_contentType": t, "_length": len(c)}
                for a, (f, t, c) in d.attachments.items()
            ],
        }

    @staticmethod
    def got_json(doc: dict[str, Any]) -> dict[str, Any]:
        meta = doc["_meta"]
        return {
            "_id": meta["_id"],
            "_rev": meta["_rev"],
            "_data": doc["_data"],
            "_deleted": meta.get("_deleted", False),
            "_purged": meta.get("_purged", False),
            "_attachments": doc["_attachments"],
        }

    def check_doc(self, doc: dict[str, Any]) -> None:
        assert self.got_json(doc) == self.want_json(doc["_meta"]["_id"])

    def written(self, doc_id: str, data: bytes, etag: str | None) -> None:
        """A write's answer is the model's document, its ETag its revision."""
        doc = json.loads(data)
        self.check_doc(doc)
        assert etag == f'"{self.docs[doc_id].rev}"'

    def condition(self, doc_id: str, how: int) -> tuple[str, dict[str, str], bool]:
        """(a query, headers, whether it is stale) expecting the document's revision: none,
        If-Match (weak or not), ?rev=, If-Match: *, or a stale revision either way."""
        d = self.docs[doc_id]
        stale = d.old_revs[-1] if d.old_revs else _later_rev(d.rev, -1)
        match how:
            case 0:
                return "", {}, False
            case 1:
                return "", {"If-Match": f'"{d.rev}"'}, False
            case 2:
                return f"?rev={d.rev.lower()}", {}, False
            case 3:
                return "", {"If-Match": "*"}, False
            case 4:
                return "", {"If-Match": f'W/"{stale}"'}, True
            case _:
                return f"?rev={stale}", {}, True

    def pick(self, data: st.DataObject, states: tuple[str, ...] | None = None) -> str | None:
        ids = [i for i, d in self.docs.items() if states is None or d.state in states]
        return data.draw(st.sampled_from(ids)) if ids else None

    # -- writes ----------------------------------------------------------------------

    @initialize(
        items=st.lists(st.tuples(st.sampled_from(COLLECTIONS), DATA), max_size=6),
        indexes=st.sets(st.tuples(st.sampled_from(COLLECTIONS), st.sampled_from(sorted(INDEXES)))),
    )
    def seed(self, items: list[tuple[str, dict[str, Any]]], indexes: set[tuple[str, str]]) -> None:
        for c, name in sorted(indexes):
            self.declare_index(c, name)
        for c, data in items:
            self.create(c, data, False)

    @rule(c=st.sampled_from(COLLECTIONS), data=DATA, supplied=st.booleans())
    def create(self, c: str, data: dict[str, Any], supplied: bool) -> None:
        if self.slashed(c, data):
            data = {**data, "city": "Oslo"}
        query = ""
        if supplied:  # any time before now will do for a new document
            query = "?new_rev=" + str(ULID.from_timestamp(time.time() - 3600))
        status, body, _, r = self.call(
            "POST", f"{self.base}/{_q(c)}{query}", json.dumps(data).encode()
        )
        assert status == 201
        doc = json.loads(body)
        doc_id = doc["_meta"]["_id"]
        assert doc_id not in self.docs
        self.docs[doc_id] = _Doc(c, data, doc["_meta"]["_rev"])
        self.made = True
        self.written(doc_id, body, r.getheader("ETag"))

    def slashed(self, c: str, data: Any) -> bool:
        """Whether ``data`` has an indexed string holding '/' (refused while indexed)."""
        for ix, (part, sort) in INDEXES.items():
            if (c, ix) in self.indexes:
                for path in (part, sort):
                    v = _path(data, path) if path else None
                    if isinstance(v, str) and "/" in v:
                        return True
        return False

    @rule(data=st.data(), new=DATA, how=st.integers(0, 5), supplied=st.booleans())
    def replace(self, data: st.DataObject, new: dict[str, Any], how: int, supplied: bool) -> None:
        doc_id = self.pick(data)
        if doc_id is None:
            return
        d = self.docs[doc_id]
        # (a PUT without a condition creates: put_taken; here none is If-Match: *)
        query, headers, stale = self.condition(doc_id, how or 3)
        rev = _later_rev(d.rev) if supplied else None
        if rev:
            query += ("&" if query else "?") + f"new_rev={rev}"
        status, body, code, r = self.call(
            "PUT", self.doc_url(doc_id) + query, json.dumps(new).encode(), headers
        )
        if d.state != "live":
            assert (status, code) == (404, "document_not_found")
        elif stale:
            assert (status, code) == (409, "conflict")
        elif self.slashed(d.collection, new):
            assert (status, code) == (400, "invalid_document")
        else:
            assert status == 200
            got = json.loads(body)["_meta"]["_rev"]
            assert rev is None or got == rev
            d.data = new
            d.set_rev(got)
            self.written(doc_id, body, r.getheader("ETag"))

    @rule(data=st.data(), new=DATA)
    def put_taken(self, data: st.DataObject, new: dict[str, Any]) -> None:
        """A PUT without a revision creates (CouchDB's): a live document's id is taken."""
        doc_id = self.pick(data, ("live",))
        if doc_id is None:
            return
        d = self.docs[doc_id]
        status, _, code, _ = self.call("PUT", self.doc_url(doc_id), json.dumps(new).encode())
        if self.slashed(d.collection, new):
            assert (status, code) == (400, "invalid_document")
        else:
            assert (status, code) == (409, "conflict")

    @rule(data=st.data(), how=st.integers(0, 5))
    def delete(self, data: st.DataObject, how: int) -> None:
        doc_id = self.pick(data)
        if doc_id is None:
            return
        d = self.docs[doc_id]
        query, headers, stale = self.condition(doc_id, how)
        status, body, code, r = self.call("DELETE", self.doc_url(doc_id) + query, None, headers)
        if d.state != "live":
            assert (status, code) == (404, "document_not_found")
        elif stale:
            assert (status, code) == (409, "conflict")
        else:
            assert status == 200
            d.state, d.was_deleted = "deleted", True
            d.set_rev(json.loads(body)["_meta"]["_rev"])
            self.written(doc_id, body, r.getheader("ETag"))

    @rule(data=st.data(), how=st.integers(0, 5))
    def purge(self, data: st.DataObject, how: int) -> None:
        doc_id = self.pick(data)
        if doc_id is None:
            return
        d = self.docs[doc_id]
        query, headers, stale = self.condition(doc_id, how)
        status, body, code, r = self.call(
            "POST", self.doc_url(doc_id) + "/purge" + query, None, headers
        )
        if d.state == "purged":
            assert (status, code) == (404, "document_not_found")
        elif stale:
            assert (status, code) == (409, "conflict")
        else:
            assert status == 200
            d.state, d.attachments = "purged", {}
            d.set_rev(json.loads(body)["_meta"]["_rev"])
            self.written(doc_id, body, r.getheader("ETag"))

    @rule(
        data=st.data(),
        content=CONTENT,
        filename=st.sampled_from(["a.txt", "ü ß/x.bin", "", "%41"]),
        ctype=st.sampled_from([None, "", "image/png", "text/plain; charset=utf-8"]),
        replace=st.booleans(),
        how=st.sampled_from([0, 1, 4]),
    )
    def put_attachment(
        self,
        data: st.DataObject,
        content: bytes,
        filename: str,
        ctype: str | None,
        replace: bool,
        how: int,
    ) -> None:
        doc_id = self.pick(data)
        if doc_id is None:
            return
        d = self.docs[doc_id]
        url = self.doc_url(doc_id) + "/attachments"
        att = None
        if replace:
            att = data.draw(st.sampled_from(list(d.attachments))) if d.attachments else str(ULID())
            url += "/" + att
        query, headers, stale = self.condition(doc_id, how)
        query += ("&" if query else "?") + "filename=" + _q(filename)
        if ctype is not None:
            headers["Content-Type"] = ctype
        status, body, code, r = self.call("PUT" if att else "POST", url + query, content, headers)
        if not filename:
            assert (status, code) == (400, "bad_request")
        elif d.state != "live":
            assert (status, code) == (404, "document_not_found")
        elif stale:
            assert (status, code) == (409, "conflict")
        elif att is not None and att not in d.attachments:
            assert (status, code) == (404, "attachment_not_found")
        else:
            assert status == (200 if att else 201)
            got = json.loads(body)
            a = got["attachment"]
            assert att is None or a["_id"] == att
            d.attachments.pop(a["_id"], None)
            d.attachments[a["_id"]] = (filename, ctype or "application/octet-stream", content)
            d.set_rev(got["document"]["_meta"]["_rev"])
            self.check_doc(got["document"])
            assert r.getheader("ETag") == f'"{d.rev}"'

    @rule(data=st.data(), known=st.booleans(), how=st.sampled_from([0, 2, 5]))
    def delete_attachment(self, data: st.DataObject, known: bool, how: int) -> None:
        doc_id = self.pick(data)
        if doc_id is None:
            return
        d = self.docs[doc_id]
        if known and d.attachments:
            att = data.draw(st.sampled_from(list(d.attachments)))
        else:
            att = str(ULID())
        query, headers, stale = self.condition(doc_id, how)
        status, body, code, r = self.call(
            "DELETE", self.doc_url(doc_id) + "/attachments/" + att + query, None, headers
        )
        if d.state != "live":
            assert (status, code) == (404, "document_not_found")
        elif stale:
            assert (status, code) == (409, "conflict")
        elif att not in d.attachments:
            assert (status, code) == (404, "attachment_not_found")
        else:
            assert status == 200
            del d.attachments[att]
            d.set_rev(json.loads(body)["_meta"]["_rev"])
            self.written(doc_id, body, r.getheader("ETag"))

    @rule(c=st.sampled_from(COLLECTIONS), name=st.sampled_from(sorted(INDEXES)))
    def declare_index(self, c: str, name: str) -> None:
        part, sort = INDEXES[name]
        body: dict[str, Any] = {"partition": part}
        if sort is not None:
            body["sort"] = sort
        status, data, _, _ = self.call(
            "PUT", f"{self.base}/{_q(c)}/_indexes/{name}", json.dumps(body).encode()
        )
        assert status == 200
        got = json.loads(data)
        assert (got["partition"], got["sort"], got["name"]) == (part, sort, name)
        self.indexes.add((c, name))
        self.made = True

    @rule(c=st.sampled_from(COLLECTIONS), name=st.sampled_from(sorted(INDEXES)))
    def drop_index(self, c: str, name: str) -> None:
        status, _, code, _ = self.call("DELETE", f"{self.base}/{_q(c)}/_indexes/{name}")
        if (c, name) in self.indexes:
            assert status == 204
            self.indexes.discard((c, name))
        else:
            self.expect_error(status, code, (404, "index_not_found"))

    @rule()
    def mark(self) -> None:
        """Remember the page's head and every document's revision there."""
        if not self.made:
            return
        status, data, _, _ = self.call("GET", self.base.removesuffix("/docs") + "/heads")
        assert status == 200
        (head,) = json.loads(data)["heads"]
        self.marks.append((head["id"], {i: d.rev for i, d in self.docs.items()}))

    # -- reads -----------------------------------------------------------------------

    @rule(data=st.data(), deleted=st.booleans(), lower=st.booleans())
    def get(self, data: st.DataObject, deleted: bool, lower: bool) -> None:
        doc_id = self.pick(data)
        if doc_id is None:
            return
        d = self.docs[doc_id]
        url = self.doc_url(doc_id, d.collection) if not lower else None
        url = url or f"{self.base}/{_q(d.collection)}/{doc_id.lower()}"
        status, body, code, r = self.call("GET", url + ("?deleted=1" if deleted else ""))
        if d.state != "live" and not deleted:
            assert (status, code) == (404, "document_not_found")
            return
        assert status == 200
        self.written(doc_id, body, r.getheader("ETag"))
        # the other collection never holds it
        other = next(c for c in COLLECTIONS if c != d.collection)
        status, _, code, _ = self.call("GET", self.doc_url(doc_id, other) + "?deleted=1")
        assert (status, code) == (404, "document_not_found")

    @rule(
        data=st.data(),
        deleted=st.booleans(),
        part=st.none() | st.tuples(st.integers(0, 45), st.integers(0, 45)),
    )
    def get_attachment(
        self, data: st.DataObject, deleted: bool, part: tuple[int, int] | None
    ) -> None:
        with_some = [i for i, d in self.docs.items() if d.attachments]
        if not with_some:
            return
        doc_id = data.draw(st.sampled_from(with_some))
        d = self.docs[doc_id]
        att = data.draw(st.sampled_from(list(d.attachments)))
        filename, ctype, content = d.attachments[att]
        headers = {"Range": f"bytes={part[0]}-{part[0] + part[1]}"} if part else {}
        url = self.doc_url(doc_id) + "/attachments/" + att + ("?deleted=1" if deleted else "")
        for method in ("GET", "HEAD"):
            status, body, code, r = self.call(method, url, None, headers)
            if d.state != "live" and not deleted:
                assert status == 404 and code in (None, "document_not_found")
            elif part and part[0] >= len(content):
                assert status == 416
                assert r.getheader("Content-Range") == f"bytes */{len(content)}"
            elif part:
                end = min(part[0] + part[1], len(content) - 1)
                assert status == 206
                assert r.getheader("Content-Range") == f"bytes {part[0]}-{end}/{len(content)}"
                assert body == (b"" if method == "HEAD" else content[part[0] : end + 1])
            else:
                assert status == 200
                assert body == (b"" if method == "HEAD" else content)
            if status in (200, 206):
                assert r.getheader("Content-Type") == ctype
                assert r.getheader("Content-Disposition") == (
                    f"inline; filename*=UTF-8''{_q(filename)}"
                )

    def listing(self, url: str, limit: int) -> list[dict[str, Any]]:
        """Every document of a listing or query, a page at a time through its tokens."""
        got: list[dict[str, Any]] = []
        token = None
        sep = "&" if "?" in url else "?"
        for _ in range(len(self.docs) + 2):
            q = f"{sep}limit={limit}" + (f"&token={token}" if token else "")
            status, body, code, _ = self.call("GET", url + q)
            assert status == 200, (status, code)
            page = json.loads(body)
            assert "damaged" not in page
            assert len(page["documents"]) <= limit
            # The bound counts the documents' text, not the commit and token around them
            # (up to about 250 bytes more: left so, as 16 MiB is the bound by default).
            texts = [
                json.dumps(d, ensure_ascii=False, separators=(",", ":")) for d in page["documents"]
            ]
            assert sum(map(len, texts)) <= MAX_LISTING or len(texts) == 1
            got += page["documents"]
            token = page["next"]
            if token is None:
                return got
            assert page["documents"], "a page with a token and no document"
        raise AssertionError("a listing that does not end")

    @rule(c=st.sampled_from(COLLECTIONS), limit=st.integers(1, 4), deleted=st.booleans())
    def list_documents(self, c: str, limit: int, deleted: bool) -> None:
        url = f"{self.base}/{_q(c)}" + ("?deleted=1" if deleted else "")
        if not self.made:
            status, _, code, _ = self.call("GET", url)
            self.expect_missing_page(status, code)
            return
        got = self.listing(url, limit)
        want = sorted(
            i for i, d in self.docs.items() if d.collection == c and (deleted or d.state == "live")
        )
        assert [d["_meta"]["_id"] for d in got] == want
        for doc in got:
            self.check_doc(doc)

    @rule(
        data=st.data(),
        c=st.sampled_from(COLLECTIONS),
        name=st.sampled_from(sorted(INDEXES)),
        limit=st.integers(1, 4),
        deleted=st.booleans(),
    )
    def find(self, data: st.DataObject, c: str, name: str, limit: int, deleted: bool) -> None:
        if self.indexes and data.draw(st.integers(0, 3), label="a declared one") > 0:
            c, name = data.draw(st.sampled_from(sorted(self.indexes)), label="index")

        part, sort = INDEXES[name]
        held = [  # (partition, sort) of the documents the index holds
            (p, _path(d.data, sort) if sort else None)
            for d in self.docs.values()
            if d.collection == c and d.state != "purged"
            for p in [_path(d.data, part)]
            if _index_key(p) is not None and (not sort or _index_key(_path(d.data, sort)))
        ]
        some = data.draw(st.sampled_from(held), label="near") if held else None

        def scalar(i: int, label: str, bound: bool) -> Any:
            """Mostly a value of the document drawn above."""
            if some is not None and data.draw(st.integers(0, 3), label=label + " held") > 0:
                v = some[i]
                if not bound or v is not None:
                    return v
            return data.draw(SCALARS.filter(lambda v: v is not None) if bound else SCALARS)

        eq = scalar(0, "eq", False)
        start = scalar(1, "start", True) if data.draw(st.booleans(), label="start") else None
        end = scalar(1, "end", True) if data.draw(st.booleans(), label="end") else None
        if sort is None:
            start = end = None
        url = f"{self.base}/{_q(c)}/_indexes/{name}/find?eq={_json_q(eq)}"
        url += f"&start={_json_q(start)}" if start is not None else ""
        url += f"&end={_json_q(end)}" if end is not None else ""
        url += "&deleted=1" if deleted else ""
        if (c, name) not in self.indexes:
            status, _, code, _ = self.call("GET", url)
            self.expect_error(status, code, (404, "index_not_found"))
            return
        got = self.listing(url, limit)
        want_rows = []
        for i, d in self.docs.items():
            if d.collection != c or d.state == "purged" or (d.state == "deleted" and not deleted):
                continue
            p = _index_key(_path(d.data, part))
            s = _index_key(_path(d.data, sort)) if sort else ()
            if p is None or s is None or p != _index_key(eq):
                continue
            if start is not None and s < _index_key(start):  # type: ignore[operator]
                continue
            if end is not None and not s < _index_key(end):  # type: ignore[operator]
                continue
            want_rows.append((s, i))
        assert [d["_meta"]["_id"] for d in got] == [i for _, i in sorted(want_rows)]
        event(f"find: {min(len(got), 3)} documents")
        for doc in got:
            self.check_doc(doc)

    @rule(
        data=st.data(),
        c=st.none() | st.sampled_from(COLLECTIONS),
        limit=st.integers(1, 4),
        from_start=st.booleans(),
    )
    def changes(self, data: st.DataObject, c: str | None, limit: int, from_start: bool) -> None:
        url = f"{self.base}/_changes"
        before: dict[str, str] = {}
        if not from_start and self.marks:
            commit, before = data.draw(st.sampled_from(self.marks))
            url += f"?since={commit}"
        if c is not None:
            url += ("&" if "?" in url else "?") + f"collection={_q(c)}"
        if not self.made:
            status, _, code, _ = self.call("GET", url)
            self.expect_missing_page(status, code)
            return
        got = self.listing(url, limit)
        want = {
            i: d.rev
            for i, d in self.docs.items()
            if (c is None or d.collection == c) and before.get(i) != d.rev
        }
        revs = {d["_meta"]["_id"]: d["_meta"]["_rev"] for d in got}
        assert len(revs) == len(got), "a document twice in one change"
        assert revs == want
        event(f"changes: {min(len(got), 3)} documents")
        for doc in got:
            self.check_doc(doc)

    # -- hostile requests: refused with their code, nothing changed --------------------

    @_hostile(
        c=st.sampled_from(COLLECTIONS),
        body=st.sampled_from(
            [
                b"",
                b"{",
                b"{'a': 1}",
                b'{"a": NaN}',
                b'{"a": Infinity}',
                b'{"_id": "x"}',
                b'{"_rev": 1, "a": 2}',
                b'{"a": 1} x',
                b'{"a": "\\ud800"}',
                b'{"a": 18446744073709551616}',
                b"\xff\xfe",
                b"[" * 100 + b"]" * 100,
            ]
        ),
    )
    def create_invalid(self, c: str, body: bytes) -> None:
        status, _, code, _ = self.call("POST", f"{self.base}/{_q(c)}", body)
        assert (status, code) == (400, "invalid_document")

    @_hostile(c=st.sampled_from(COLLECTIONS), text=st.booleans())
    def create_too_large(self, c: str, text: bool) -> None:
        """Over max_document_bytes encoded, or a JSON text over four times that."""
        size = 4 * MAX_DOCUMENT + 10 if text else MAX_DOCUMENT + 10
        body = json.dumps({"a": "x" * size}).encode()
        status, _, code, _ = self.call("POST", f"{self.base}/{_q(c)}", body)
        assert (status, code) == (413, "too_large")

    @_hostile(c=st.sampled_from(["", "_c", "x" * 129]))
    def bad_collection(self, c: str) -> None:
        status, _, code, _ = self.call("POST", f"{self.base}/{_q(c)}", b"{}")
        assert (status, code) == (400, "invalid_name")

    @_hostile(
        data=st.data(),
        body=st.sampled_from([b"{", b'{"_x": 1}', b"nan", b'{"a": "x' + b"y" * MAX_DOCUMENT]),
    )
    def replace_invalid(self, data: st.DataObject, body: bytes) -> None:
        doc_id = self.pick(data)
        if doc_id is None:
            return
        if body.endswith(b"y"):
            body += b'"}'
        status, _, code, _ = self.call("PUT", self.doc_url(doc_id), body)
        if len(body) <= MAX_DOCUMENT:
            assert (status, code) == (400, "invalid_document")
        elif self.docs[doc_id].state == "live":
            assert (status, code) == (413, "too_large")
        else:  # (the size of the encoded document is checked with the write)
            assert (status, code) in ((413, "too_large"), (404, "document_not_found"))

    @_hostile(data=st.data())
    def replace_slashed(self, data: st.DataObject) -> None:
        """A '/' in a string an index reads is refused (create and replace)."""
        live = [i for i, d in self.docs.items() if d.state == "live"]
        declared = [(c, n) for c, n in self.indexes if INDEXES[n][0] == "city"]
        if not live or not declared:
            return
        c, _ = data.draw(st.sampled_from(declared))
        body = json.dumps({"city": "a/b"}).encode()
        status, _, code, _ = self.call("POST", f"{self.base}/{_q(c)}", body)
        assert (status, code) == (400, "invalid_document")
        targets = [i for i in live if self.docs[i].collection == c]
        if targets:
            doc_id = data.draw(st.sampled_from(targets))
            status, _, code, _ = self.call("PUT", self.doc_url(doc_id), body)
            assert (status, code) == (400, "invalid_document")

    @_hostile(
        c=st.sampled_from(COLLECTIONS),
        bad=st.sampled_from(BAD_IDS),
        method=st.sampled_from(["GET", "PUT", "DELETE", "POST"]),
    )
    def bad_id(self, c: str, bad: str, method: str) -> None:
        url = f"{self.base}/{_q(c)}/{bad}" + ("/purge" if method == "POST" else "")
        status, _, code, _ = self.call(method, url, b"{}" if method == "PUT" else None)
        assert (status, code) == (400, "invalid_id")

    @_hostile(
        data=st.data(),
        bad=st.sampled_from(BAD_IDS),
        method=st.sampled_from(["GET", "HEAD", "PUT", "DELETE"]),
    )
    def bad_attachment_id(self, data: st.DataObject, bad: str, method: str) -> None:
        """A malformed attachment id of a live document: 400 invalid_id, whatever the method."""
        doc_id = self.pick(data, ("live",))
        if doc_id is None:
            return
        url = self.doc_url(doc_id) + f"/attachments/{bad}?filename=f"
        status, _, code, r = self.call(method, url, b"x" if method == "PUT" else None)
        if method == "HEAD":  # (no body to carry the code)
            assert status == 400
        else:
            assert (status, code) == (400, "invalid_id")

    @_hostile(
        data=st.data(),
        bad=st.sampled_from(["nope", "", '""', "0" * 26 + "0", '"*"']),
        where=st.sampled_from(["header", "query"]),
        method=st.sampled_from(["PUT", "DELETE", "POST"]),
    )
    def bad_rev(self, data: st.DataObject, bad: str, where: str, method: str) -> None:
        """A malformed expected revision on a live document: 400 invalid_id."""
        doc_id = self.pick(data, ("live",))
        if doc_id is None:
            return
        url = self.doc_url(doc_id) + ("/purge" if method == "POST" else "")
        headers = {}
        if where == "header":
            headers["If-Match"] = bad if bad.startswith('"') else f'"{bad}"'
        else:
            url += "?rev=" + _q(bad.strip('"'))
        status, _, code, _ = self.call(method, url, b"{}" if method == "PUT" else None, headers)
        assert (status, code) == (400, "invalid_id")

    @_hostile(data=st.data(), past=st.booleans())
    def bad_new_rev(self, data: st.DataObject, past: bool) -> None:
        """A supplied revision not after the current one (409), or too far ahead (400)."""
        doc_id = self.pick(data, ("live",))
        if doc_id is None:
            return
        d = self.docs[doc_id]
        if past:
            rev, want = (d.old_revs[-1] if d.old_revs else d.rev), (409, "conflict")
        else:
            rev = str(ULID.from_timestamp(time.time() + 3600))
            want = (400, "rev_in_future")
        status, _, code, _ = self.call("PUT", self.doc_url(doc_id) + f"?new_rev={rev}", b"{}")
        assert (status, code) == want

    @_hostile(data=st.data())
    def missing_document(self, data: st.DataObject) -> None:
        c = data.draw(st.sampled_from(COLLECTIONS))
        url = f"{self.base}/{_q(c)}/{ULID()}"
        for method in ("GET", "PUT", "DELETE"):
            put = method == "PUT"  # (If-Match: *: a bare PUT would create it)
            status, _, code, _ = self.call(
                method, url, b"{}" if put else None, {"If-Match": "*"} if put else {}
            )
            self.expect_error(status, code, (404, "document_not_found"))

    @_hostile(
        c=st.sampled_from(COLLECTIONS),
        name=st.sampled_from(["nope", "_primary", "a b", *INDEXES]),
        query=st.sampled_from(["eq=1", "eq=1&start=null", "eq=1&end=", "", "eq=%7B%7D"]),
    )
    def bad_find(self, c: str, name: str, query: str) -> None:
        """Checked in this order: the query's parameters (400 bad_request), the page,
        the index's name (400 invalid_name), the index (404), the values' kinds (400)."""
        status, _, code, _ = self.call(
            "GET", f"{self.base}/{_q(c)}/_indexes/{_q(name)}/find?{query}"
        )
        if query in ("eq=1&start=null", "eq=1&end=", ""):
            want = (400, "bad_request")
        elif not self.made:
            want = (404, "ledger_not_found")
        elif name in ("_primary", "a b"):
            want = (400, "invalid_name")
        elif (c, name) not in self.indexes:
            want = (404, "index_not_found")
        elif query == "eq=1":
            assert status == 200
            return
        else:
            want = (400, "bad_request")
        assert (status, code) == want

    @_hostile(
        data=st.data(),
        token=st.sampled_from(["!!", "AAAA", "x", "eyJhIjoxfQ"]),
        foreign=st.booleans(),
    )
    def bad_token(self, data: st.DataObject, token: str, foreign: bool) -> None:
        """A garbled token, or another listing's (the other collection's, or deleted=1)."""
        if not self.made:
            return
        c = data.draw(st.sampled_from(COLLECTIONS))
        if foreign:
            status, body, _, _ = self.call("GET", f"{self.base}/{_q(c)}?limit=1&deleted=1")
            nxt: str | None = json.loads(body)["next"]
            if nxt is None:
                return
            token = nxt
        for url in (f"{self.base}/{_q(c)}?token={token}", f"{self.base}/_changes?token={token}"):
            status, _, code, _ = self.call("GET", url)
            assert (status, code) == (400, "bad_request")

    @_hostile(data=st.data())
    def bad_index(self, data: st.DataObject) -> None:
        c = data.draw(st.sampled_from(COLLECTIONS))
        body = data.draw(
            st.sampled_from(
                [
                    b"{",
                    b"{}",
                    b'{"partition": "_a"}',
                    b'{"partition": ""}',
                    b"[]",
                    b'{"partition": "a", "x": 1}',
                    b'{"partition": 1}',
                ]
            )
        )
        status, _, code, _ = self.call("PUT", f"{self.base}/{_q(c)}/_indexes/ix", body)
        assert (status, code) == (400, "bad_request")

    # -- the page as a whole -------------------------------------------------------

    @invariant()
    def everything_listed(self) -> None:
        """Each collection's listing with deleted=1 holds the model's every document."""
        for c in COLLECTIONS:
            status, body, code, _ = self.call("GET", f"{self.base}/{_q(c)}?deleted=1&limit=1000")
            if self.expect_missing_page(status, code):
                continue
            assert status == 200
            got = json.loads(body)
            want = sorted((i, d.rev) for i, d in self.docs.items() if d.collection == c)
            docs = got["documents"]
            assert got["next"] is not None or len(docs) == len(want)
            assert [(d["_meta"]["_id"], d["_meta"]["_rev"]) for d in docs] == want[: len(docs)]

    @rule(data=st.data(), which=st.sampled_from(sorted(_HOSTILE)))
    def hostile(self, data: st.DataObject, which: str) -> None:
        """A bad request: refused with its code, and nothing changed (the invariant)."""
        args = {
            k: data if k == "data" else data.draw(s, label=k) for k, s in _HOSTILE[which].items()
        }
        getattr(self, which)(**args)

    def teardown(self) -> None:
        self.conn.close()


def test_documents_follow_the_model(shared: Daemon) -> None:
    DocumentPages.socket = shared.socket
    run_state_machine_as_test(DocumentPages, settings=stateful_settings(20))


# -- what the machine found, kept as examples ------------------------------------------


def _machine(d: Daemon) -> DocumentPages:
    DocumentPages.socket = d.socket
    return DocumentPages()


def test_malformed_attachment_id_is_invalid_id(shared: Daemon) -> None:
    """GET and HEAD of an attachment whose id is not a ULID answered 404
    attachment_not_found (the id was compared, not parsed), PUT and DELETE 400
    invalid_id: every route now says invalid_id, as for a malformed document id."""
    m = _machine(shared)
    try:
        _, body, _, _ = m.call("POST", f"{m.base}/c", b"{}")
        doc = m.base + "/c/" + json.loads(body)["_meta"]["_id"]
        for method in ("GET", "HEAD", "PUT", "DELETE"):
            for bad in ("nope", "8" + "0" * 25):
                status, _, code, _ = m.call(
                    method, f"{doc}/attachments/{bad}?filename=f", b"x" if method == "PUT" else None
                )
                assert status == 400
                assert code == (None if method == "HEAD" else "invalid_id")
    finally:
        m.teardown()


def test_attachment_filename_with_a_slash_is_encoded(shared: Daemon) -> None:
    """RFC 8187's ext-value has no '/' (not an attr-char): ``filename*=UTF-8''ü ß/x.bin``
    was sent as ``%C3%BC%20%C3%9F/x.bin``, which a strict client reads as no filename."""
    m = _machine(shared)
    try:
        status, body, _, _ = m.call("POST", f"{m.base}/c", b"{}")
        doc = m.base + "/c/" + json.loads(body)["_meta"]["_id"]
        status, body, _, _ = m.call("POST", doc + "/attachments?filename=" + _q("ü ß/x.bin"), b"x")
        att = json.loads(body)["attachment"]["_id"]
        for method in ("GET", "HEAD"):
            status, _, _, r = m.call(method, f"{doc}/attachments/{att}")
            assert status == 200
            assert r.getheader("Content-Disposition") == (
                "inline; filename*=UTF-8''%C3%BC%20%C3%9F%2Fx.bin"
            )
    finally:
        m.teardown()
