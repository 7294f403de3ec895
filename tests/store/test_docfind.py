"""Selector queries (``find``, pouchdb-find's and CouchDB Mango's shape) in the embedded API.

The comparison with pouchdb-find itself, on random corpora and selectors, is
tests/daemon/test_find_pouchdb.py."""

from __future__ import annotations

from typing import Any

import pytest

from ledgerd.store import DocumentStore, InvalidArgumentError, InvalidSelectorError, Page
from ledgerd.store.documents import docfind

PEOPLE: list[tuple[str, dict[str, Any]]] = [
    ("ann", {"name": "Ann", "age": 41, "city": "Oslo", "tags": ["a", "b"], "pet": {"kind": "cat"}}),
    ("bob", {"name": "Bob", "age": 29, "city": "Oslo", "tags": ["b"], "pet": None}),
    ("cid", {"name": "Cid", "age": "old", "city": "Bergen", "tags": []}),
    ("dan", {"name": "Dan", "city": "Bergen", "pets": [{"kind": "dog", "age": 3}]}),
    ("eve", {"name": "Eve", "age": 35, "city": "Tromsø", "alive": False}),
]


async def _people(page: Page) -> DocumentStore:
    docs = await DocumentStore.open(page)
    for doc_id, data in PEOPLE:
        await docs.create("people", data, id=doc_id)
    return docs


async def _ids(docs: DocumentStore, request: dict[str, Any]) -> list[str]:
    res = await docs.find("people", request)
    return [d["_id"] for d in res.docs]


def test_collation_follows_couchdb_across_types() -> None:
    ordered = [
        None,
        False,
        True,
        -1,
        0,
        2.5,
        10,
        "",
        "A",
        "a",
        "b",
        [],
        [1],
        [1, 2],
        ["a"],
        {},
        {"a": 1},
    ]
    for i, a in enumerate(ordered):
        for j, b in enumerate(ordered):
            c = docfind.collate(a, b)
            assert (c < 0, c == 0, c > 0) == (i < j, i == j, i > j), (a, b)
    assert docfind.collate(1, 1.0) == 0
    assert docfind.collate("\uffff", "\U0001f600") > 0  # UTF-16 code units, as PouchDB


@pytest.mark.parametrize(
    ("selector", "ids"),
    [
        ({"city": "Oslo"}, ["ann", "bob"]),
        ({"city": {"$eq": "Oslo"}, "age": {"$gt": 30}}, ["ann"]),
        ({"age": {"$gt": 30}}, ["ann", "cid", "eve"]),  # "old" is a string: above numbers
        ({"age": {"$gte": 29, "$lt": 41}}, ["bob", "eve"]),
        ({"age": {"$lte": 29}}, ["bob"]),
        ({"age": {"$ne": 41}}, ["bob", "cid", "dan", "eve"]),  # a missing field is not 41
        ({"age": {"$in": [29, "old"]}}, ["bob", "cid"]),
        ({"age": {"$nin": [29, "old"]}}, ["ann", "eve"]),  # present and not listed
        ({"tags": {"$in": ["a"]}}, ["ann"]),  # an array: one of its elements
        ({"pet": {"$exists": True}}, ["ann", "bob"]),  # null exists
        ({"pet": {"$exists": False}}, ["cid", "dan", "eve"]),
        ({"pet.kind": "cat"}, ["ann"]),
        ({"pet": {"kind": "cat"}}, ["ann"]),
        ({"pets": {"$elemMatch": {"kind": "dog", "age": {"$lt": 5}}}}, ["dan"]),
        ({"tags": {"$elemMatch": {"$eq": "b"}}}, ["ann", "bob"]),
        ({"$or": [{"city": "Bergen"}, {"age": 41}]}, ["ann", "cid", "dan"]),
        ({"$and": [{"city": "Oslo"}, {"age": {"$lt": 40}}]}, ["bob"]),
        ({"$not": {"city": "Oslo"}}, ["cid", "dan", "eve"]),
        ({"$nor": [{"city": "Oslo"}, {"city": "Bergen"}]}, ["eve"]),
        ({"alive": False}, ["eve"]),
        ({"tags": []}, ["cid"]),
        ({"_id": {"$gt": "cid"}}, ["dan", "eve"]),
        ({"age": {"$gt": None}}, ["ann", "bob", "cid", "eve"]),
        ({"age": {"$not": {"$gt": 30}}}, ["bob", "dan"]),
    ],
)
async def test_selectors(page: Page, selector: dict[str, Any], ids: list[str]) -> None:
    docs = await _people(page)
    assert await _ids(docs, {"selector": selector}) == ids


async def test_sort_fields_limit_skip_and_bookmark(page: Page) -> None:
    docs = await _people(page)
    sel = {"age": {"$gte": 0}}
    assert await _ids(docs, {"selector": sel, "sort": ["age"]}) == ["bob", "eve", "ann", "cid"]
    desc = {"selector": sel, "sort": [{"age": "desc"}]}
    assert await _ids(docs, desc) == ["cid", "ann", "eve", "bob"]
    # Without the sort field a document is not in a sorted answer (CouchDB's index).
    assert await _ids(docs, {"selector": {}, "sort": ["age"]}) == ["bob", "eve", "ann", "cid"]
    assert await _ids(docs, {"selector": sel, "sort": ["age"], "skip": 1, "limit": 2}) == [
        "eve",
        "ann",
    ]
    got = await docs.find("people", {"selector": {"city": "Oslo"}, "fields": ["name", "pet.kind"]})
    assert got.docs == [
        {"_id": "ann", "name": "Ann", "pet": {"kind": "cat"}},
        {"_id": "bob", "name": "Bob"},
    ]
    full = (await docs.find("people", {"selector": {"_id": "eve"}})).docs[0]
    assert full["_rev"] and full["city"] == "Tromsø"
    seen, bookmark, marks = [], None, []
    while True:
        req = {"selector": {}, "sort": [{"name": "desc"}], "limit": 2, "bookmark": bookmark}
        res = await docs.find("people", req)
        seen += [d["_id"] for d in res.docs]
        if (bookmark := res.bookmark) is None:
            break
        marks.append(bookmark)
    assert seen == ["eve", "dan", "cid", "bob", "ann"] and len(marks) == 2
    with pytest.raises(InvalidArgumentError, match="another listing"):
        await docs.find("people", {"selector": {"city": "Oslo"}, "bookmark": marks[0]})


async def test_an_index_serves_a_find_whose_selector_fixes_its_partition(page: Page) -> None:
    docs = await _people(page)
    await docs.declare_index("people", "by_city", "city")
    await docs.declare_index("people", "by_name", "name")
    await docs.declare_index("people", "aaa_city_age", "city", "age")
    req: dict[str, Any] = {"selector": {"city": "Oslo", "age": {"$gt": 30}}}
    res = await docs.find("people", req)
    assert [d["_id"] for d in res.docs] == ["ann"]
    assert res.plan.index is not None and res.plan.index.name == "by_city"
    ex = await docs.explain("people", req)
    assert ex["index"]["name"] == "by_city" and ex["scan"] is False
    assert ex["partition_value"] == "Oslo"
    # An index with a sort path holds only documents with a scalar there: used only
    # when the selector fixes that too.
    fixed = await docs.explain("people", {"selector": {"city": "Oslo", "age": 41}})
    assert fixed["index"]["name"] == "aaa_city_age"
    assert await _ids(docs, {"selector": {"city": "Oslo", "age": 41}}) == ["ann"]
    scan = await docs.explain("people", {"selector": {"age": {"$gt": 30}}})
    assert scan["index"]["name"] == "_all_docs" and scan["scan"] is True
    both = {"selector": {"$and": [{"city": "Bergen"}, {"name": {"$eq": "Dan"}}]}}
    assert (await docs.explain("people", both))["index"]["name"] == "by_city"
    named = await docs.explain("people", {**both, "use_index": "by_name"})
    assert named["index"]["name"] == "by_name" and named["partition_value"] == "Dan"
    missing = await docs.explain("people", {**both, "use_index": "nope"})
    assert "nope" in missing["warning"] and missing["index"]["name"] == "by_city"
    assert await _ids(docs, {**both, "use_index": "by_name"}) == ["dan"]
    # The index is exact only up to doubles: the answer is filtered all the same.
    await docs.create("people", {"city": 2**53 + 1}, id="big")
    await docs.create("people", {"city": 2**53}, id="big2")
    assert await _ids(docs, {"selector": {"city": 2**53 + 1}}) == ["big"]


@pytest.mark.parametrize(
    "request_",
    [
        [],
        {},
        {"selector": []},
        {"selector": {"$eq": 1}},
        {"selector": {"a": {"$regex": "x"}}},
        {"selector": {"a": {"$in": 1}}},
        {"selector": {"a": {"$exists": 1}}},
        {"selector": {"$or": []}},
        {"selector": {"$and": {}}},
        {"selector": {}, "limit": -1},
        {"selector": {}, "limit": docfind.MAX_LIMIT + 1},
        {"selector": {}, "skip": docfind.MAX_SKIP + 1},
        {"selector": {}, "sort": "a"},
        {"selector": {}, "sort": ["a", {"b": "desc"}]},
        {"selector": {}, "sort": [{"a": "up"}]},
        {"selector": {}, "fields": "a"},
        {"selector": {}, "bookmark": 3},
        {"selector": {}, "bookmark": "%%%"},
        {"selector": {}, "use_index": 3},
        {"selector": {}, "nope": 1},
        {"selector": {"a": {"$in": list(range(docfind.MAX_TERMS + 1))}}},
        {"selector": {"a": {"$eq": float("nan")}}},
        {"selector": {"a": {"$in": ["\ud800"]}}},
    ],
)
async def test_bad_requests_are_refused_with_a_reason(page: Page, request_: Any) -> None:
    docs = await _people(page)
    with pytest.raises(InvalidArgumentError) as e:
        await docs.find("people", request_)
    assert str(e.value)


async def test_a_selector_nested_too_deeply_is_refused(page: Page) -> None:
    docs = await _people(page)
    sel: dict[str, Any] = {"a": 1}
    for _ in range(docfind.MAX_DEPTH + 1):
        sel = {"$not": sel}
    with pytest.raises(InvalidSelectorError, match="nested"):
        await docs.find("people", {"selector": sel})
    deep: Any = 1
    for _ in range(docfind.MAX_DEPTH + 1):
        deep = [deep]
    with pytest.raises(InvalidSelectorError, match="nested"):
        await docs.find("people", {"selector": {"a": deep}})


SCALARS = [True, False, None, 0, -0.0, 1, 1.0, 1.5, "1", "", "a", 2**53, 2**53 + 1, -(2**63)]


async def test_an_index_answers_as_a_scan_whatever_the_scalar(page: Page) -> None:
    """The index holds numbers as doubles and orders types as tuples do; a find through
    it filters its partition by the selector, so it answers as a scan would."""
    docs = await DocumentStore.open(page)
    await docs.declare_index("c", "by_p", "p")
    for n, v in enumerate(SCALARS):
        await docs.create("c", {"p": v, "n": n})
    await docs.create("c", {"p": [1], "n": -1})
    await docs.create("c", {"n": -2})
    for v in SCALARS:
        through = await docs.find("c", {"selector": {"p": v}})
        assert through.plan.index is not None
        scan = await docs.find("c", {"selector": {"p": {"$gte": v, "$lte": v}}})
        assert scan.plan.index is None
        assert [d["n"] for d in through.docs] == [d["n"] for d in scan.docs], v
        assert all(docfind.collate(d["p"], v) == 0 for d in through.docs)
