"""Document records of a layout this ledgerd does not know (a newer ledgerd's, come
through sync): recognised as such, never read as layout 1, never overwritten or
tombstoned here."""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import msgpack
import pytest

from ledgerd.store import DocumentStore, Page, Repository, UnsupportedLayoutError
from ledgerd.store.documents import doclayout
from ledgerd.store.documents.docmodel import MalformedRecordError, RevClock, parse_ulid, ulid_text


@pytest.fixture
async def page(tmp_path: Path) -> AsyncIterator[Page]:
    async with await Repository.open(tmp_path) as repo:
        yield await repo.ledger("app").page("docs")


NEWER_LAYOUTS: dict[str, Callable[[bytes], list[Any]]] = {
    # layout 2, shaped as layout 1: was read as a layout 1 record (its data shown, changed)
    "nine fields": lambda rev: [2, rev, 0, 1, None, None, None, {"n": "new"}, []],
    # layout 2 of another shape: was damaged (500 corrupt), and purge tombstoned it
    "other shape": lambda rev: [2, {"rev": rev, "data": {"n": "new"}}, "more", 7],
}


async def _newer(page: Page, doc_id: str, shape: str) -> bytes:
    """Write ``doc_id``'s head and a body of layout 2 as a newer ledgerd would (a new
    revision); the body's bytes."""
    raw = parse_ulid(doc_id)
    rev = RevClock().next()
    body: bytes = msgpack.packb(NEWER_LAYOUTS[shape](rev), use_bin_type=True)
    await page.write(
        [
            (doclayout.head_key("c", raw), doclayout.encode_head(rev, doclayout.State.LIVE)),
            (doclayout.body_key("c", raw), body),
        ]
    )
    await page.flush()
    return body


@pytest.mark.parametrize("shape", sorted(NEWER_LAYOUTS))
async def test_a_record_of_a_newer_layout_is_named_and_never_changed(
    page: Page, shape: str
) -> None:
    """A body of layout 2 was decoded as layout 1 when it had nine fields (read, and
    replaced or deleted over, as a layout 1 document) or was damaged otherwise, and
    ``purge`` then wrote a tombstone over it that would reach every peer. Now reading
    it is UnsupportedLayoutError (``unsupported_layout``), every write to it is refused
    with that error and stores nothing, and listings and the changes feed go on and
    name it under ``damaged`` with that code."""
    docs = await DocumentStore.open(page)
    await docs.declare_index("c", "by_n", "n")
    made = await docs.create_many("c", [{"n": i} for i in range(3)])
    ids = [d.id for d in made]
    since = page.head.id
    body = await _newer(page, ids[1], shape)
    with pytest.raises(UnsupportedLayoutError) as e:
        await docs.get("c", ids[1])
    assert e.value.code == "unsupported_layout" and ids[1] in str(e.value)
    assert "layout 2" in str(e.value) and not isinstance(e.value, MalformedRecordError)
    head = page.head.id
    writes: list[Any] = [
        docs.replace("c", ids[1], {"n": 9}),
        docs.delete("c", ids[1]),
        docs.purge("c", ids[1]),
        docs.put_attachment("c", ids[1], b"abc", filename="a"),
        docs.delete_attachment("c", ids[1], ulid_text(RevClock().next())),
        docs.attachment("c", ids[1], ulid_text(RevClock().next())),
    ]
    for call in writes:
        with pytest.raises(UnsupportedLayoutError):
            await call
    assert page.head.id == head  # nothing was written
    stored = await page.get_entry(doclayout.body_key("c", parse_ulid(ids[1])))
    assert stored is not None and await page.objects.read_all(stored.value) == body
    listed = await docs.list_documents("c", limit=1)
    seen, damaged = [d.id for d in listed.items], list(listed.damaged)
    while listed.token is not None:
        listed = await docs.list_documents("c", limit=1, token=listed.token)
        seen += [d.id for d in listed.items]
        damaged += listed.damaged
    assert seen == [ids[0], ids[2]]
    assert [(d.id, d.code) for d in damaged] == [(ids[1], "unsupported_layout")]
    assert damaged[0].to_json()["code"] == "unsupported_layout"
    changed = await docs.changes_page(since, collection="c")
    assert changed.documents == []
    assert [(d.id, d.code) for d in changed.damaged] == [(ids[1], "unsupported_layout")]
    # the index left it out, and goes on (a query, another write, a rebuild)
    found = await docs.query("c", "by_n", 1)
    assert found.items == []
    await docs.create("c", {"n": 1})
    await docs.rebuild_index("c", "by_n")
    assert [d.data for d in (await docs.query("c", "by_n", 1)).items] == [{"n": 1}]
    assert [d.id for d in (await docs.query("c", "by_n", 0)).items] == [ids[0]]


@pytest.mark.parametrize(
    ("record", "future"),
    [
        ([2, b"x"], True),
        ([255, {b"\xff": 1.5}], True),  # (keys of any kind, bytes not UTF-8)
        ([256], False),  # a layout is one byte, as the page's marker holds it
        ([2**64 - 1], False),
        ([1, b"x"], False),  # layout 1, nine fields missing: damaged
        ([0, b"\x01" * 16, 0, 1, None, None, None, {}, []], False),  # no layout 0
        (["2", b"\x01" * 16, 0, 1, None, None, None, {}, []], False),
        ([True, b"\x01" * 16, 0, 1, None, None, None, {}, []], False),
        ({"layout": 2}, False),
        ([], False),
    ],
)
def test_a_record_says_its_layout_first(record: Any, future: bool) -> None:
    """The layout is the first element of the array a body is; a layout above 1 is a
    newer ledgerd's whatever follows it, anything else that is not layout 1 is damaged
    (the layout field was read past: a record of layout 0 or ``"2"`` decoded)."""
    data = msgpack.packb(record, use_bin_type=True)
    with pytest.raises(ValueError) as e:
        doclayout.decode_record(data)
    assert isinstance(e.value, doclayout.FutureLayoutError) is future
    for cut in (b"", b"\x93", b"\xdc\xff", data[:-1], data + b"\x00", b"\x93not a record"):
        with pytest.raises(ValueError) as e:  # (bytes that only start like a record)
            doclayout.decode_record(cut)
        assert not isinstance(e.value, doclayout.FutureLayoutError)


NEWER_DEFINITIONS: dict[str, list[Any]] = {
    # layout 2, shaped as layout 1: was read as a layout 1 definition (and queried so)
    "nine fields": [2, ["n"], None],
    # layout 2 of another shape: was dropped as malformed (404 index_not_found), and
    # declaring the index again wrote over it, for every peer
    "other shape": [2, {"partition": ["n"], "unique": True}, 7],
}


async def _definition(page: Page, name: str, value: Any) -> bytes:
    """Write index ``name``'s definition on collection ``c`` as given (bytes as is, else
    packed), as a newer ledgerd's or a damaged one would come through sync."""
    raw = value if isinstance(value, bytes) else msgpack.packb(value, use_bin_type=True)
    await page.write([(doclayout.index_key("c", name), raw)])
    await page.flush()
    return raw


@pytest.mark.parametrize("shape", sorted(NEWER_DEFINITIONS))
async def test_an_index_definition_of_a_newer_layout_is_named_and_never_changed(
    page: Page, shape: str
) -> None:
    """An index definition of layout 2 was read as layout 1 (its layout ignored) or
    dropped as malformed, so that its queries answered index_not_found and declaring
    the index wrote over it. Now querying it, declaring it again, dropping or
    rebuilding it is UnsupportedLayoutError naming the index and stores nothing; the
    listing of indexes shows it with that code; other indexes and document writes go
    on (it has no entries here), also after the store opens again; and a definition
    this ledgerd reads, come later, makes it an index again."""
    docs = await DocumentStore.open(page)
    await docs.declare_index("c", "by_n", "n")
    await docs.declare_index("c", "by_m", "m")
    made = await docs.create_many("c", [{"n": i, "m": i} for i in range(3)])
    raw = await _definition(page, "by_n", NEWER_DEFINITIONS[shape])
    head = page.head.id
    calls: list[Any] = [
        lambda: docs.query("c", "by_n", 1),
        lambda: docs.declare_index("c", "by_n", "m"),
        lambda: docs.drop_index("c", "by_n"),
        lambda: docs.rebuild_index("c", "by_n"),
    ]
    for reopen in (False, True):
        if reopen:
            await docs.close()
            docs = await DocumentStore.open(page)
        for call in calls:
            with pytest.raises(UnsupportedLayoutError) as e:
                await call()
            assert "'by_n'" in str(e.value) and "layout 2" in str(e.value), e.value
        assert page.head.id == head  # nothing was written
        stored = await page.get_entry(doclayout.index_key("c", "by_n"))
        assert stored is not None and await page.objects.read_all(stored.value) == raw
        listed = {i.name: i for i in await docs.indexes("c")}
        assert listed["by_m"].code is None and listed["by_m"].partition == "m"
        assert listed["by_n"].code == "unsupported_layout" and not listed["by_n"].ready
        assert "layout 2" in (listed["by_n"].message or "")
        new = await docs.create("c", {"n": 1, "m": 7 + reopen})
        assert [d.id for d in (await docs.query("c", "by_m", 7 + reopen)).items] == [new.id]
        head = page.head.id
    await _definition(page, "by_n", doclayout.encode_definition(["n"], None))
    found = await docs.query("c", "by_n", 1)
    assert len(found.items) == 3 and made[1].id in {d.id for d in found.items}
    assert [i.code for i in await docs.indexes("c")] == [None, None]


DAMAGED_DEFINITIONS: dict[str, Any] = {
    "not msgpack": b"\x93not a definition",
    "two fields": [1, ["n"]],
    "a path of text": [1, "n", None],
    "a path of numbers": [1, [1], None],
    "an empty path": [1, [], None],
    "no layout": ["1", ["n"], None],
}


@pytest.mark.parametrize("damage", sorted(DAMAGED_DEFINITIONS))
async def test_a_damaged_index_definition_is_named_and_can_be_replaced(
    page: Page, damage: str
) -> None:
    """A damaged index definition was passed over with a warning in the log (queries
    answered index_not_found, the listing left it out) or, for a path that is not a
    list of text, read with its names made text (``[1]`` as ``["1"]``). Now its query is
    MalformedRecordError (``corrupt``) naming the index, the listing shows it as
    ``corrupt``, other indexes go on, and declaring or dropping it repairs it."""
    docs = await DocumentStore.open(page)
    await docs.declare_index("c", "by_m", "m")
    made = await docs.create("c", {"n": 1, "m": 1})
    await _definition(page, "by_n", DAMAGED_DEFINITIONS[damage])
    with pytest.raises(MalformedRecordError) as e:
        await docs.query("c", "by_n", 1)
    assert "'by_n'" in str(e.value) and "damaged" in str(e.value)
    listed = {i.name: i for i in await docs.indexes("c")}
    assert listed["by_n"].code == "corrupt" and listed["by_m"].code is None
    await docs.create("c", {"n": 1, "m": 2})
    assert [d.id for d in (await docs.query("c", "by_m", 1)).items] == [made.id]
    await docs.declare_index("c", "by_n", "m")
    assert [d.id for d in (await docs.query("c", "by_n", 1)).items] == [made.id]
    await _definition(page, "by_n", DAMAGED_DEFINITIONS[damage])
    await docs.drop_index("c", "by_n")
    assert [i.name for i in await docs.indexes("c")] == ["by_m"]


@pytest.mark.parametrize(
    ("definition", "future"),
    [
        ([2, ["n"], None], True),
        ([255, {b"\xff": 1.5}], True),
        ([256, ["n"], None], False),
        ([1, ["n"]], False),
        ([0, ["n"], None], False),
        ([1, ["n"], "m"], False),
        ([1, ["n", 2], None], False),
        ([1, ["n"], []], False),
    ],
)
def test_an_index_definition_says_its_layout_first(definition: Any, future: bool) -> None:
    data = msgpack.packb(definition, use_bin_type=True)
    with pytest.raises(ValueError) as e:
        doclayout.decode_definition(data)
    assert isinstance(e.value, doclayout.FutureLayoutError) is future
    assert doclayout.decode_definition(doclayout.encode_definition(["a", "b"], ["c"])) == (
        ["a", "b"],
        ["c"],
    )


NO_JSON_FORM: dict[str, Any] = {
    "bytes": {"k": 1, "b": b"x"},
    "empty bytes": [b""],
    "16 bytes": {"id": b"\x01" * 16},
    "long bytes": {"k": 1, "b": b"x" * 40},
    "a bytes key": {b"k": 1},
    "NaN": {"k": 1, "n": float("nan")},
    "an infinity": [1.5, float("-inf")],
    "an extension": {"k": 1, "e": msgpack.ExtType(3, b"a")},
    "deep bytes": {"k": 1, "a": [1, {"b": b""}]},
}


@pytest.mark.parametrize("kind", sorted(NO_JSON_FORM))
async def test_a_record_whose_data_has_no_json_form_is_damaged_everywhere(
    page: Page, kind: str
) -> None:
    """A record that decodes but whose data has no JSON form (what no document write
    stores: written through the key API or come from a peer) was damaged over HTTP only:
    the embedded ``get`` returned it, listings and the changes feed listed it among the
    documents and ``check_page`` called the page healthy. Now it is damaged everywhere:
    ``get`` raises MalformedRecordError, listings, the changes feed and a query of an
    index (which still holds it by its other values) name it in ``damaged``, and the
    check reports ``damaged_document``; ``purge`` removes it."""
    from ledgerd.store.page import check as ck

    docs = await DocumentStore.open(page)
    await docs.declare_index("c", "by_k", "k")
    made = await docs.create_many("c", [{"k": 1}, {"k": 1}])
    since = page.head.id
    raw, rev = parse_ulid(made[1].id), parse_ulid(made[1].rev)
    ms = int.from_bytes(rev[:6], "big")
    record = [1, rev, 0, ms, None, None, None, NO_JSON_FORM[kind], []]
    await page.write([(doclayout.body_key("c", raw), msgpack.packb(record, use_bin_type=True))])
    await page.flush()
    with pytest.raises(MalformedRecordError) as e:
        await docs.get("c", made[1].id)
    assert made[1].id in str(e.value) and "no JSON form" in str(e.value)
    listed = await docs.list_documents("c")
    assert [d.id for d in listed.items] == [made[0].id]
    assert [(d.id, d.code) for d in listed.damaged] == [(made[1].id, "corrupt")]
    changed = await docs.changes_page(since, collection="c")
    assert changed.documents == [] and [d.id for d in changed.damaged] == [made[1].id]
    if isinstance(NO_JSON_FORM[kind], dict) and "k" in NO_JSON_FORM[kind]:  # (indexed by k)
        found = await docs.query("c", "by_k", 1)
        assert [d.id for d in found.items] == [made[0].id]
        assert [d.id for d in found.damaged] == [made[1].id]
    report = await ck.check_page(page)
    assert [p.code for p in report.problems] == [ck.DAMAGED_DOCUMENT]
    assert made[1].id in report.problems[0].message
    await docs.purge("c", made[1].id)
    assert [d.id for d in (await docs.list_documents("c")).items] == [made[0].id]


@pytest.mark.parametrize(
    "data",
    [
        {"big": 1e305, "small": -5e-324, "neg": -1.5},
        {"s": "ąćęłń ËÅ\x7f\x00 ÿ", "t": "\u00c4\u0010"},
        {"n": 2**64 - 1, "m": -(2**63), "x": 0xC4_10_CB_7F_FF_C5_00},
        ["0123456789abcdef", {"k": None, "b": True}],
        None,
        {},
    ],
)
def test_data_that_only_looks_like_bytes_or_nan_decodes(data: Any) -> None:
    """The decode's byte search for bins and non-finite floats passes over what a JSON
    document holds, even when an integer's or a float's bytes look like one: those
    are looked at value by value."""
    rev = RevClock().next()
    att = doclayout.AttachmentMeta(RevClock().next(), "a", "text/plain", 3)
    for atts in ((), (att, att)):
        r = doclayout.Record(rev, doclayout.State.LIVE, 1, None, None, None, data, atts)
        assert doclayout.decode_record(doclayout.encode_record(r)) == r


@pytest.mark.parametrize("kind", sorted(NO_JSON_FORM))
def test_data_with_no_json_form_is_found_beside_attachments(kind: str) -> None:
    """With attachments (whose ids are 16-byte bins too) and without, packed as this
    ledgerd packs a record or with its revision as a bin16 (as a peer may pack it)."""
    rev, att_id = RevClock().next(), RevClock().next()
    for atts in ([], [[att_id, "a", "text/plain", 3]], [[att_id, "a", "b", 1]] * 2):
        record = [1, rev, 0, 1, None, None, None, NO_JSON_FORM[kind], atts]
        data = msgpack.packb(record, use_bin_type=True)
        peer = data[:2] + b"\xc5\x00" + data[3:]  # the revision as a bin16
        for body in (data, peer):
            with pytest.raises(ValueError, match="no JSON form"):
                doclayout.decode_record(body)
            assert doclayout.decode_record(body, json_data=False).rev == rev


async def test_index_rows_an_older_ledgerd_kept_for_a_newer_definition_go(page: Page) -> None:
    """An older ledgerd read a layout 2 definition of three fields as layout 1 and kept
    its rows; opening the page here drops them (they are of a definition this ledgerd
    does not read) and the index is unsupported_layout, not misread."""
    import sqlite3

    docs = await DocumentStore.open(page)
    await docs.declare_index("c", "by_n", "n")
    await docs.create("c", {"n": 1})
    await docs.query("c", "by_n", 1)  # built
    await docs.close()
    raw = await _definition(page, "by_n", [2, ["n"], None])

    def as_an_older_ledgerd(conn: sqlite3.Connection) -> None:
        conn.execute("UPDATE doc_indexes SET definition = ?", (raw,))
        conn.execute("UPDATE doc_state SET value = ? WHERE name = 'reflected'", (page.head.id,))

    await page.db.run(as_an_older_ledgerd, write=True)
    docs = await DocumentStore.open(page)
    with pytest.raises(UnsupportedLayoutError):
        await docs.query("c", "by_n", 1)
    rows = await page.db.read_all("SELECT count(*) FROM doc_indexes")
    entries = await page.db.read_all("SELECT count(*) FROM doc_index_rows")
    assert rows[0][0] == 0 and entries[0][0] == 0
