"""Document keys whose id is not a ULID's 16 bytes, which the key API can write
(``doclayout.body_key("c", b"\\xff" * 20)`` through ``page.put``): listings, the changes
feed and index queries name them in ``damaged`` (their id in hex) and go on."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from ledgerd.store import DocumentNotFoundError, DocumentStore, Page, Repository
from ledgerd.store.documents import doclayout, docmodel
from ledgerd.store.documents.doclayout import Record, State
from ledgerd.store.documents.docmodel import RevClock

LONG, SHORT, LOOKALIKE = b"\xff" * 20, b"\x01\x02", b"\x00" * 13
"""Odd ids: longer than a ULID, shorter (ulid_text made 26 wrong characters of it), and
one whose hex is 26 digits, the length of a ULID's text."""
HEAD_ONLY, BROKEN = b"\xee" * 3, b"\xdd" * 17


def _record(data: object) -> bytes:
    rev = RevClock().next()
    ms = int.from_bytes(rev[:6], "big")
    return doclayout.encode_record(Record(rev, State.LIVE, ms, None, None, None, data))


def _head() -> bytes:
    return doclayout.encode_head(RevClock().next(), State.LIVE)


@pytest.fixture
async def page(tmp_path: Path) -> AsyncIterator[Page]:
    async with await Repository.open(tmp_path) as repo:
        yield await repo.ledger("app").page("docs")


async def _odd_keys(page: Page) -> None:
    """Bodies (a record, indexed by ``k``) with odd ids, one with its head; a head
    without a body; a body that is no record; all in collection ``c``."""
    await page.write(
        [
            (doclayout.body_key("c", LONG), _record({"k": 1})),
            (doclayout.head_key("c", LONG), _head()),
            (doclayout.body_key("c", SHORT), _record({"k": 1})),
            (doclayout.body_key("c", LOOKALIKE), _record({"k": 2})),
            (doclayout.head_key("c", HEAD_ONLY), _head()),
            (doclayout.body_key("c", BROKEN), b"not a record"),
        ]
    )
    await page.flush()


ODD_BODIES = sorted((LONG, SHORT, LOOKALIKE, BROKEN), key=lambda i: doclayout.body_key("c", i))


async def test_listings_the_feed_and_queries_name_keys_with_odd_ids_and_go_on(page: Page) -> None:
    """Each of these raised IndexError (HTTP 500 internal) from ulid_text, or showed a
    short id as 26 wrong characters; a listing's token cut at such a key was refused."""
    docs = await DocumentStore.open(page)
    await docs.declare_index("c", "by_k", "k")
    made = await docs.create_many("c", [{"k": 1}, {"k": 2}])
    since = page.head.id
    await _odd_keys(page)
    hexed = ["hex:" + i.hex() for i in ODD_BODIES]

    listed = await docs.list_documents("c")
    assert [d.id for d in listed.items] == [d.id for d in made]
    assert [(d.id, d.code) for d in listed.damaged] == [(h, "corrupt") for h in hexed]
    assert all(
        f"its id is {len(i)} bytes" in d.message
        for i, d in zip(ODD_BODIES, listed.damaged, strict=True)
    )
    assert all("delete its keys through the key API" in d.message for d in listed.damaged)

    ids, damaged, token = [], [], None  # one body at a time: tokens cut at odd ids
    while True:
        got = await docs.list_documents("c", limit=1, token=token, include_deleted=True)
        ids += [d.id for d in got.items]
        damaged += [d.id for d in got.damaged]
        if (token := got.token) is None:
            break
    assert ids == [d.id for d in made] and damaged == hexed

    changed = await docs.changes_page(since, collection="c")
    assert changed.documents == [] and sorted(d.id for d in changed.damaged) == sorted(hexed)
    everything = await docs.changes_page(None)
    assert [d.id for d in everything.documents] == [d.id for d in made]
    assert sorted(d.id for d in everything.damaged) == sorted(hexed)
    batches = [c async for c in docs.changes(since, follow=False, batch=1)]
    assert sorted(d.id for c in batches for d in c.damaged) == sorted(hexed)

    for k, odd in ((1, {LONG, SHORT}), (2, {LOOKALIKE})):
        found = await docs.query("c", "by_k", k)
        assert [d.id for d in found.items] == [made[k - 1].id]
        assert {d.id for d in found.damaged} == {"hex:" + i.hex() for i in odd}
    await docs.rebuild_index("c", "by_k")
    assert [d.id for d in (await docs.query("c", "by_k", 1)).items] == [made[0].id]

    with pytest.raises(DocumentNotFoundError):  # a chosen id's text, never the odd key
        await docs.get("c", hexed[0])
    with pytest.raises(DocumentNotFoundError):  # (why "hex:": its bare hex is another id)
        await docs.get("c", LOOKALIKE.hex())  # 26 digits: the ULID 0, no document

    # Writes and a purge of well-formed documents beside them.
    new = await docs.create("c", {"k": 1})
    await docs.replace("c", made[0].id, {"k": 2}, expected_rev=made[0].rev)
    await docs.purge("c", made[1].id)
    listed = await docs.list_documents("c")
    assert [d.id for d in listed.items] == sorted([made[0].id, new.id])
    assert [d.id for d in listed.damaged] == hexed
    later = await docs.changes_page(since, collection="c")
    assert {d.id for d in later.documents} == {made[0].id, made[1].id, new.id}

    # Their keys deleted through the key API, nothing is named any more.
    await page.write([(doclayout.body_key("c", i), None) for i in ODD_BODIES])
    await page.flush()
    assert (await docs.list_documents("c")).damaged == []
    assert (await docs.changes_page(since, collection="c")).damaged == []


async def test_the_feed_names_a_body_key_with_an_odd_id_once_it_is_deleted(page: Page) -> None:
    """A document of a ULID id whose keys the key API deleted is reported purged by the
    feed; a body key with an odd id, named damaged while it was there, was passed over
    once deleted, so a follower told of it never learnt it was gone. Now the feed from
    a commit that held it names it as a listing did (``hex:``, corrupt), saying it is
    gone; one made and deleted within the feed's span is not named."""
    docs = await DocumentStore.open(page)
    made = await docs.create("c", {"k": 1})
    await _odd_keys(page)
    since = page.head.id
    hexed = ["hex:" + i.hex() for i in ODD_BODIES]
    assert [d.id for d in (await docs.list_documents("c")).damaged] == hexed

    deleted, kept = ODD_BODIES[:2], ODD_BODIES[2:]
    made_key = doclayout.body_key("c", docmodel.parse_ulid(made.id))
    await page.write([(doclayout.body_key("c", i), None) for i in deleted] + [(made_key, None)])
    await page.write([(doclayout.body_key("c", b"\xaa" * 5), _record({"k": 3}))])
    await page.write([(doclayout.body_key("c", b"\xaa" * 5), None)])
    await page.flush()
    listed = await docs.list_documents("c")
    assert [d.id for d in listed.damaged] == ["hex:" + i.hex() for i in kept]

    changed = await docs.changes_page(since, collection="c")
    assert [(d.id, d.state) for d in changed.documents] == [(made.id, State.PURGED)]
    named = {d.id: d for d in changed.damaged}
    assert sorted(named) == sorted("hex:" + i.hex() for i in deleted)
    for i in deleted:
        d = named["hex:" + i.hex()]
        assert d.collection == "c" and d.code == "corrupt", d
        assert f"its id is {len(i)} bytes" in d.message and "is gone" in d.message, d
        assert "was deleted" in d.message, d
    batches = [c async for c in docs.changes(since, follow=False, batch=1)]
    assert sorted(d.id for c in batches for d in c.damaged) == sorted(named)
    everything = await docs.changes_page(None)  # they were not there at the start
    assert sorted(d.id for d in everything.damaged) == ["hex:" + i.hex() for i in kept]
