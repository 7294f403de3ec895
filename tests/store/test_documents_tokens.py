"""Continuation tokens bound to what they continue, and damaged document bodies in
listings and the changes feed."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import msgpack
import pytest

from ledgerd.store import (
    CorruptObjectError,
    DocumentConflictError,
    DocumentStore,
    InvalidArgumentError,
    Page,
    Repository,
)
from ledgerd.store.documents import doclayout
from ledgerd.store.documents.docmodel import MalformedRecordError, parse_ulid


@pytest.fixture
async def page(tmp_path: Path) -> AsyncIterator[Page]:
    async with await Repository.open(tmp_path) as repo:
        yield await repo.ledger("app").page("docs")


def _flipped(token: bytes, at: int) -> bytes:
    return token[:at] + bytes([token[at] ^ 0x01]) + token[at + 1 :]


async def test_a_listing_token_continues_only_its_own_listing(page: Page) -> None:
    """A token used on another collection (or with another ``include_deleted``) answered
    that collection's documents from the token's position on: ``b``'s listing
    continued with ``a``'s token skipped every ``b`` document before it."""
    docs = await DocumentStore.open(page)
    await docs.create_many("a", [{"n": i} for i in range(5)])
    await docs.create_many("b", [{"n": i} for i in range(5)])
    first = await docs.list_documents("a", limit=2)
    assert first.token is not None
    rest = await docs.list_documents("a", limit=10, token=first.token)
    assert len(rest.items) == 3 and rest.token is None
    with pytest.raises(InvalidArgumentError, match="another listing"):
        await docs.list_documents("b", limit=10, token=first.token)
    with pytest.raises(InvalidArgumentError, match="another listing"):
        await docs.list_documents("a", limit=10, token=first.token, include_deleted=True)
    for at in range(len(first.token)):  # any garbled byte is refused, never a position
        with pytest.raises(InvalidArgumentError):
            await docs.list_documents("a", token=_flipped(first.token, at))
    for bad in [b"", b"\xd7", b"\x00" * 40, first.token[:-1], first.token + b"\x00"]:
        with pytest.raises(InvalidArgumentError, match="malformed"):
            await docs.list_documents("a", token=bad)


async def test_a_token_continues_only_its_own_page(tmp_path: Path) -> None:
    """A token of one page's collection answered from its position on another page's
    collection of the same name."""
    async with await Repository.open(tmp_path) as repo:
        one = await DocumentStore.open(await repo.ledger("app").page("one"))
        two = await DocumentStore.open(await repo.ledger("app").page("two"))
        for docs in (one, two):
            await docs.create_many("c", [{"n": i} for i in range(3)])
        first = await one.list_documents("c", limit=1)
        assert first.token is not None
        with pytest.raises(InvalidArgumentError, match="another listing"):
            await two.list_documents("c", token=first.token)
        assert len((await one.list_documents("c", token=first.token)).items) == 2


async def test_an_index_token_continues_only_its_own_query(page: Page) -> None:
    """A ``find`` token used with another ``eq`` value, range, index or ``deleted``
    flag answered from its position instead of refusing: with ``eq="Oslo"`` and a
    token of ``eq="Bergen"``, the Oslo documents sorting before it were skipped."""
    docs = await DocumentStore.open(page)
    await docs.declare_index("p", "by_city", "city", "age")
    await docs.declare_index("p", "by_city2", "city", "age")
    for city in ["Bergen", "Oslo"]:
        await docs.create_many("p", [{"city": city, "age": i} for i in range(6)])
    first = await docs.query("p", "by_city", "Oslo", limit=2)
    assert first.token is not None
    rest = await docs.query("p", "by_city", "Oslo", limit=10, token=first.token)
    assert [d.data["age"] for d in rest.items] == [2, 3, 4, 5]
    for call in [
        docs.query("p", "by_city", "Bergen", token=first.token),
        docs.query("p", "by_city2", "Oslo", token=first.token),
        docs.query("p", "by_city", "Oslo", start=1, token=first.token),
        docs.query("p", "by_city", "Oslo", end=5, token=first.token),
        docs.query("p", "by_city", "Oslo", include_deleted=True, token=first.token),
        docs.list_documents("p", token=first.token),  # a token of another kind
    ]:
        with pytest.raises(InvalidArgumentError, match="another listing"):
            await call
    # the same query spelled alike (1 and 1.0 are one value to an index) continues
    by_age = await docs.query("p", "by_city", "Oslo", start=1, limit=2)
    assert by_age.token is not None
    more = await docs.query("p", "by_city", "Oslo", start=1.0, limit=10, token=by_age.token)
    assert [d.data["age"] for d in more.items] == [3, 4, 5]
    # an index dropped and declared again on other paths: the old token is refused
    await docs.declare_index("p", "by_city", "city")
    with pytest.raises(InvalidArgumentError, match="another listing"):
        await docs.query("p", "by_city", "Oslo", token=first.token)


async def test_a_changes_token_continues_only_its_own_change(page: Page) -> None:
    """A changes token used with another ``since``, or with every collection after a
    page of one, continued from its position in that other change."""
    docs = await DocumentStore.open(page)
    await docs.create_many("a", [{"n": i} for i in range(5)])
    mid = page.head.id
    await docs.create_many("a", [{"n": i} for i in range(5)])
    first = await docs.changes_page(None, collection="a", limit=2)
    assert first.token is not None
    for since, coll in [(mid, "a"), (None, None)]:
        with pytest.raises(InvalidArgumentError, match="another listing"):
            await docs.changes_page(since, collection=coll, token=first.token)
    rest = await docs.changes_page(None, collection="a", limit=100, token=first.token)
    assert len(rest.documents) == 8 and rest.token is None


async def test_tokens_of_an_older_ledgerd_are_refused_cleanly(page: Page) -> None:
    """Tokens before binding (a listing's bare document id, a query's or the changes
    feed's msgpack pair) are refused, saying to start again, never taken as positions."""
    docs = await DocumentStore.open(page)
    await docs.declare_index("c", "by_v", "v")
    made = await docs.create_many("c", [{"v": 1} for _ in range(3)])
    old_list = parse_ulid(made[1].id)
    old_pair = msgpack.packb([b"\x01", old_list], use_bin_type=True)
    for call in [
        docs.list_documents("c", token=old_list),
        docs.query("c", "by_v", 1, token=old_pair),
        docs.changes_page(None, token=old_pair),
    ]:
        with pytest.raises(InvalidArgumentError, match="older ledgerd"):
            await call


async def _damage(page: Page, collection: str, doc_id: str) -> None:
    """Write a body that is not a record under the document layer, with the page API."""
    await page.write([(doclayout.body_key(collection, parse_ulid(doc_id)), b"\x93not a record")])
    await page.flush()


async def test_a_damaged_body_is_reported_and_the_listing_goes_on(page: Page) -> None:
    """A body that cannot be decoded failed the whole listing (and every page of it
    after, since no token past it could be had) and the changes feed for good; now
    the listing and the feed go on and report it as ``damaged`` with code ``corrupt``,
    while reading that one document is still MalformedRecordError (a CorruptObjectError,
    as a damaged value of the key API)."""
    docs = await DocumentStore.open(page)
    made = await docs.create_many("c", [{"n": i} for i in range(5)])
    ids = [d.id for d in made]
    since = page.head.id
    await _damage(page, "c", ids[2])
    seen, damaged, token = [], [], None
    while True:
        res = await docs.list_documents("c", limit=2, token=token)
        seen += [d.id for d in res.items]
        damaged += res.damaged
        token = res.token
        if token is None:
            break
    assert seen == ids[:2] + ids[3:]
    assert [(d.collection, d.id, d.code) for d in damaged] == [("c", ids[2], "corrupt")]
    assert ids[2] in damaged[0].message
    with pytest.raises(MalformedRecordError) as e:
        await docs.get("c", ids[2])
    assert isinstance(e.value, CorruptObjectError) and ids[2] in str(e.value)
    # the changes feed: paged and followed
    got = await docs.changes_page(since, collection="c")
    assert got.documents == [] and [d.id for d in got.damaged] == [ids[2]]
    whole = await docs.changes_page(None, collection="c")
    assert [d.id for d in whole.documents] == ids[:2] + ids[3:]
    assert [d.id for d in whole.damaged] == [ids[2]]
    feed = docs.changes(since, collection="c", follow=False)
    batches = [b async for b in feed]
    assert [d.id for b in batches for d in b.damaged] == [ids[2]]
    # other documents go on being written and listed
    after = await docs.create("c", {"n": 9})
    assert after.id in [d.id for d in (await docs.list_documents("c")).items]


async def test_a_damaged_document_can_be_purged(page: Page) -> None:
    """Every call on a document whose body cannot be read was MalformedRecordError,
    purge included: the documents API had no way to be rid of it (only the key API).
    Purge now writes its tombstone after the revision the head carries (and checks an
    expected revision against it), removing its attachments."""
    docs = await DocumentStore.open(page)
    doc = await docs.create("c", {"n": 1})
    doc, att = await docs.put_attachment("c", doc.id, b"abc", filename="a")
    await _damage(page, "c", doc.id)
    with pytest.raises(MalformedRecordError):
        await docs.replace("c", doc.id, {"n": 2})
    with pytest.raises(DocumentConflictError):
        await docs.purge("c", doc.id, expected_rev=made_rev(doc.rev))
    gone = await docs.purge("c", doc.id, expected_rev=doc.rev)
    assert gone.rev > doc.rev and gone.data is None and gone.attachments == ()
    assert (await docs.get("c", doc.id, include_deleted=True)).rev == gone.rev
    raw = parse_ulid(doc.id)
    assert await page.get_entry(doclayout.attachment_key("c", raw, parse_ulid(att.id))) is None
    listed = await docs.list_documents("c", include_deleted=True)
    assert [d.id for d in listed.items] == [doc.id] and listed.damaged == []


def made_rev(rev: str) -> str:
    """Another revision than ``rev`` (its last character changed)."""
    return rev[:-1] + ("0" if rev[-1] != "0" else "1")


@pytest.mark.parametrize(
    "record",
    [
        [1, b"\x01" * 16, 0, "1", None, None, None, {}, []],  # a time that is text
        [1, b"\x01" * 16, 0, 1, 2**62, None, None, {}, []],  # past the year 9999
        [1, b"\x01" * 16, 0, -1, None, None, None, {}, []],
        [1, b"\x01" * 3, 0, 1, None, None, None, {}, []],  # a revision not 16 bytes
        [1, b"\x01" * 16, 0, 1, None, None, None, {}, [[b"x", "a", "b", 1]]],
        [1, b"\x01" * 16, 0, 1, None, None, None, {}, [[b"\x01" * 16, 1, "b", 1]]],
        [1, b"\x01" * 16, 0, 1, None, None, None, {}, [[b"\x01" * 16, "a", "b", -1]]],
    ],
)
async def test_a_body_of_the_wrong_kinds_is_damaged_not_a_crash(
    page: Page, record: list[object]
) -> None:
    """A body that is msgpack of nine fields decoded whatever their kinds: a time given
    as text made every listing and get raise TypeError (500 ``internal``, a bug) when
    the document was shown, a time past the year 9999 ValueError, a 3-byte revision
    showed as a garbled ``_rev``, an attachment's id of one byte as a ULID of zeros."""
    docs = await DocumentStore.open(page)
    doc = await docs.create("c", {"n": 1})
    key = doclayout.body_key("c", parse_ulid(doc.id))
    await page.write([(key, msgpack.packb(record, use_bin_type=True))])
    await page.flush()
    res = await docs.list_documents("c")
    assert res.items == [] and [d.id for d in res.damaged] == [doc.id]
    with pytest.raises(MalformedRecordError):
        await docs.get("c", doc.id)


async def test_a_body_without_its_head_is_listed_by_its_own_state(page: Page) -> None:
    """The listing filtered a body by the state of the last head it had passed: a
    document whose head was deleted through the key API was hidden or shown as the
    document before it was deleted or live (a live one hidden after a deleted one,
    a deleted one listed after a live one)."""
    docs = await DocumentStore.open(page)
    a, b, c, d = await docs.create_many("c", [{"n": i} for i in range(4)])
    await docs.delete("c", a.id)  # deleted, then b: live, without its head
    await docs.delete("c", d.id)  # live c, then d: deleted, without its head
    for doc in (b, d):
        await page.delete(doclayout.head_key("c", parse_ulid(doc.id)))
    await page.flush()
    listed = await docs.list_documents("c")
    assert [x.id for x in listed.items] == [b.id, c.id]
    everything = await docs.list_documents("c", include_deleted=True)
    assert [x.id for x in everything.items] == [a.id, b.id, c.id, d.id]


FAR = (2**48 - 1).to_bytes(6, "big") + b"\x00" * 10
"""A revision in the year 10889: a ULID can say so, no record's times can."""


async def test_a_revision_past_the_year_9999_does_not_damage_later_writes(page: Page) -> None:
    """A body (of a peer, or written through the key API) whose revision is past the
    year 9999, its times not, decoded: the listing took its revision as seen, and
    every revision the store made after it was past the year 9999 too, so every
    document written afterwards was damaged (its times past the limit). Purging a
    damaged document whose head carries such a revision did the same."""
    docs = await DocumentStore.open(page)
    doc = await docs.create("c", {"n": 1})
    raw = parse_ulid(doc.id)
    record = [1, FAR, 0, 1, None, None, None, {}, []]
    await page.write(
        [
            (doclayout.body_key("c", raw), msgpack.packb(record, use_bin_type=True)),
            (doclayout.head_key("c", raw), doclayout.encode_head(FAR, doclayout.State.LIVE)),
        ]
    )
    await page.flush()
    res = await docs.list_documents("c")
    assert res.items == [] and [d.id for d in res.damaged] == [doc.id]
    after = await docs.create("c", {"n": 2})
    assert (await docs.get("c", after.id)).data == {"n": 2}
    gone = await docs.purge("c", doc.id)  # (its head's revision is no time: not followed)
    assert gone.data is None
    assert (await docs.get("c", doc.id, include_deleted=True)).rev == gone.rev
    later = await docs.create("c", {"n": 3})
    assert (await docs.get("c", later.id)).data == {"n": 3}
    listed = await docs.list_documents("c", include_deleted=True)
    assert listed.damaged == [] and len(listed.items) == 3


@pytest.mark.parametrize("doc_id", ["01M8EZ1E8QTYEPN7CHXSVCTYJH", "7ZZZZZZZZZZZZZZZZZZZZZZZZZ"])
async def test_a_damaged_body_without_its_head_can_be_purged(page: Page, doc_id: str) -> None:
    """A damaged body without a head (both written through the key API) is listed as
    damaged, but purge raised MalformedRecordError again: the documents API had no
    way to be rid of it, though docs/documents.md names purge as the way. An id whose time
    is past the year 9999 (a ULID can say so) made the tombstone itself damaged
    (created from the id's time)."""
    docs = await DocumentStore.open(page)
    await _damage(page, "c", doc_id)
    res = await docs.list_documents("c")
    assert res.items == [] and [d.id for d in res.damaged] == [doc_id]
    with pytest.raises(DocumentConflictError):
        await docs.purge("c", doc_id, expected_rev="01M8EZ1E8QTYEPN7CHXSVCTYJH")
    gone = await docs.purge("c", doc_id)
    assert gone.data is None
    assert (await docs.get("c", doc_id, include_deleted=True)).rev == gone.rev
    listed = await docs.list_documents("c", include_deleted=True)
    assert [d.id for d in listed.items] == [doc_id] and listed.damaged == []
