"""The documents of the Python clients, against the real daemon."""

from __future__ import annotations

import inspect
from pathlib import Path
from typing import Any

import pytest

from ledgerd.daemon.client import AsyncClient, Client, LedgerError, NotFoundError
from ledgerd.daemon.client_blocking import Documents
from ledgerd.daemon.client_docs import AsyncDocuments
from tests.daemon.conftest import Daemon


def _parameters(fn: Any) -> list[tuple[str, Any, Any]]:
    return [(p.name, p.kind, p.default) for p in inspect.signature(fn).parameters.values()]


def test_every_async_method_has_a_blocking_counterpart() -> None:
    names = [n for n, m in vars(AsyncDocuments).items() if callable(m) and not n.startswith("_")]
    assert "find" in names
    for name in names:
        counterpart = getattr(Documents, name, None)
        assert counterpart is not None, f"Documents has no {name}"
        assert _parameters(getattr(AsyncDocuments, name)) == _parameters(counterpart), name


async def test_async_documents(daemon: Daemon, tmp_path: Path) -> None:
    async with AsyncClient(daemon.socket) as c:
        docs = c.documents("app", "people")
        ann = await docs.create("people", {"name": "Ann", "city": "Oslo", "age": 41})
        ann_id, rev = ann["_meta"]["_id"], ann["_meta"]["_rev"]
        assert await docs.get("people", ann_id) == ann
        ann2 = await docs.replace("people", ann_id, {"name": "Ann", "city": "Oslo"}, rev=rev)
        with pytest.raises(LedgerError) as e:
            await docs.replace("people", ann_id, {"x": 1}, rev=rev)
        assert (e.value.code, e.value.status) == ("conflict", 409)
        with pytest.raises(LedgerError) as e:
            await docs.create("people", {"_x": 1})
        assert e.value.code == "invalid_document"
        assert await docs.create("people", None)  # JSON null is a document's _data too

        await docs.declare_index("people", "by_city", "city")
        assert [i["name"] for i in await docs.indexes("people")] == ["by_city"]
        found = [d async for d in docs.find("people", "by_city", "Oslo")]
        assert found == [ann2]
        listed = [d async for d in docs.list_documents("people", page_size=1)]
        assert len(listed) == 2 and [d async for d in docs.list_documents("people", limit=1)]

        up = await docs.put_attachment(
            "people", ann_id, b"x" * 300_000, filename="a.bin", content_type="image/png"
        )
        att = up["attachment"]["_id"]
        assert await docs.read_attachment("people", ann_id, att, offset=299_998) == b"xx"
        assert await docs.read_attachment("people", ann_id, att, offset=1, length=2) == b"xx"
        target = tmp_path / "out.bin"
        assert await docs.attachment_to_file("people", ann_id, att, target) == 300_000
        src = tmp_path / "in.bin"
        src.write_bytes(b"file content")
        again = await docs.put_attachment(
            "people", ann_id, src, filename="in.bin", attachment_id=att
        )
        assert again["attachment"]["_length"] == len(b"file content")
        await docs.delete_attachment("people", ann_id, att)

        start = await docs.changes()
        assert [p async for p in docs.all_changes()] == [start]  # one page: nothing more
        feed = docs.follow(start["commit"], heartbeat=0.05)
        gone = await docs.delete("people", ann_id)
        batch = await anext(feed)
        assert batch["documents"] == [gone]
        await feed.aclose()
        await docs.purge("people", ann_id)
        with pytest.raises(NotFoundError):
            await docs.get("people", ann_id)
        assert (await docs.get("people", ann_id, deleted=True))["_meta"]["_purged"]
        await docs.rebuild_index("people", "by_city")
        await docs.drop_index("people", "by_city")
        assert await docs.indexes("people") == []


def test_blocking_documents(daemon: Daemon) -> None:
    with Client(daemon.socket) as c:
        docs = c.documents("app", "notes")
        a = docs.create("notes", {"t": "hello"})
        a_id = a["_meta"]["_id"]
        docs.put_attachment("notes", a_id, iter([b"ab", b"cd"]), filename="x")
        doc = docs.get("notes", a_id)
        att = doc["_attachments"][0]["_id"]
        assert b"".join(docs.attachment_stream("notes", a_id, att)) == b"abcd"
        assert [d["_meta"]["_id"] for d in docs.list_documents("notes")] == [a_id]
        docs.declare_index("notes", "by_t", "t")
        assert [d["_meta"]["_id"] for d in docs.find("notes", "by_t", "hello")] == [a_id]
        assert docs.changes()["documents"][0]["_meta"]["_id"] == a_id
        b_id = docs.create("notes", {"t": "again"})["_meta"]["_id"]
        first = docs.changes(limit=1)
        assert first["next"] is not None and len(first["documents"]) == 1
        rest = docs.changes(limit=1, token=first["next"])
        assert rest["next"] is None
        pages = list(docs.all_changes())
        assert [d["_meta"]["_id"] for p in pages for d in p["documents"]] == [a_id, b_id]
        assert pages[-1]["commit"] == rest["commit"]
