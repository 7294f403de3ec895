"""``_find`` answers as pouchdb-find does: a seeded random corpus and random selectors,
run through pouchdb-find 9 (npm, an in-memory PouchDB, tests/daemon/pouchdb/) and
through the daemon's ``_find``; the ids must be equal (in order with a sort, as sets
without one), and with ``fields`` the projected documents too.

pouchdb-find is installed once into pytest's cache (``.pytest_cache``) from
tests/daemon/pouchdb/package.json. The test is skipped only when ``node`` or ``npm`` is
not installed.

The generator keeps to what CouchDB's Mango and pouchdb-find mean alike, and leaves out
pouchdb-find's known departures (docs/documents.md lists them): a path through a falsy
value (pouchdb-find reads ``{"a": 0}`` at ``a.b`` as 0), an implicit equality with a
falsy value where pouchdb-find leaves it unnormalized (``{"a": 0}`` inside ``$or`` of
``$or`` matches everything), ``$and`` beside other keys or two conditions on one field
in it (pouchdb-find merges them, dropping some), ``$ne`` of a list (pouchdb-find reads
it as several values), ``$ne`` of null (pouchdb-find fails comparing a missing value
with null), lists that start with an object and hold other values. A sort
needs a pouchdb-find index on its field, and an index leaves out documents without it:
the sorted queries select ``{FIELD: {"$gte": false}}`` (not null, so present), as
ledgerd's sorted answers hold only documents with the sort field.
"""

from __future__ import annotations

import json
import random
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from ledgerd.daemon.client import AsyncClient
from tests.daemon.conftest import Daemon
from tests.daemon.test_cli import shared_daemon

HERE = Path(__file__).resolve().parent / "pouchdb"
SEED = 41
DOCS = 200
UNSORTED = 160
SORTED = 60

STRINGS = ["", "a", "B", "b", "ab", "é", "z", "10"]
TRUTHY_STRINGS = [s for s in STRINGS if s]
NUMBERS = [-3, -1, 0, 1, 1.5, 2, 10, 100]
TRUTHY_NUMBERS = [n for n in NUMBERS if n]


def _scalar(r: random.Random) -> Any:
    kind = r.randrange(10)
    if kind < 4:
        return r.choice(NUMBERS)
    if kind < 8:
        return r.choice(STRINGS)
    return r.choice([None, True, False])


def _truthy(r: random.Random) -> Any:
    return r.choice([*TRUTHY_NUMBERS, *TRUTHY_STRINGS, True])


def _doc(r: random.Random, i: int) -> dict[str, Any]:
    doc: dict[str, Any] = {"_id": f"d{i:03}"}
    if r.random() < 0.8:
        doc["a"] = _scalar(r)
    if r.random() < 0.7:
        doc["b"] = r.choice([*STRINGS, *NUMBERS[:3]])
    if r.random() < 0.6:
        doc["c"] = [_scalar(r) for _ in range(r.randrange(4))]
    if r.random() < 0.7:  # an object, or a truthy scalar: never a falsy parent of d.e
        doc["d"] = (
            {k: _scalar(r) for k in ("e", "f") if r.random() < 0.8}
            if r.random() < 0.8
            else _truthy(r)
        )
    if r.random() < 0.5:
        doc["g"] = [
            {"h": r.choice(NUMBERS), "i": r.choice(TRUTHY_STRINGS)} for _ in range(r.randrange(4))
        ]
    return doc


FIELDS = ["a", "b", "c", "d.e", "d.f", "d"]


def _operand(r: random.Random) -> Any:
    return [_scalar(r), _scalar(r)] if r.random() < 0.05 else _scalar(r)


def _condition(r: random.Random, field: str, single: bool = False) -> Any:
    """A condition on one field: an implicit equality (with a truthy value), or an
    operator object of one or (unless ``single``: pouchdb-find merges the operators of
    ``$and`` and ``$not``, not always rightly, and fail on a null operand there) two
    comparisons."""
    value = _scalar if not single else (lambda r: r.choice([*NUMBERS, *STRINGS, True, False]))
    if field == "g":
        sub: dict[str, Any] = {"h": {r.choice(["$gt", "$lte", "$eq"]): r.choice(NUMBERS)}}
        if r.random() < 0.5:
            sub["i"] = r.choice(TRUTHY_STRINGS)
        return {"$elemMatch": sub}
    kind = r.randrange(10)
    if kind == 0:
        return _truthy(r)
    if kind == 1:
        return {"$exists": r.random() < 0.5}
    if kind == 2:
        return {r.choice(["$in", "$nin"]): [value(r) for _ in range(r.randrange(1, 4))]}
    if kind == 3 and field == "c":
        return {"$elemMatch": {r.choice(["$eq", "$gt", "$lt"]): value(r)}}
    if kind == 4:
        return {"$ne": r.choice([*NUMBERS, *STRINGS, True, False])}  # (see above: null)
    ops = r.sample(["$eq", "$gt", "$gte", "$lt", "$lte"], 1 if single else r.choice([1, 1, 2]))
    return {op: value(r) if single else _operand(r) for op in ops}


def _fields_selector(
    r: random.Random, fields: list[str], n: int, single: bool = False
) -> dict[str, Any]:
    return {f: _condition(r, f, single) for f in r.sample(fields, n)}


def _selector(r: random.Random, fields: list[str], depth: int = 0) -> dict[str, Any]:
    """A selector over ``fields``: field conditions, with ``$or``, ``$nor``, ``$not`` and
    a lone ``$and`` (of distinct fields) now and then."""
    kind = r.randrange(8) if depth < 2 else 0
    if kind <= 2:
        return _fields_selector(r, fields, r.choice([1, 1, 2]))
    if kind == 3 and depth == 0:
        picked = r.sample(fields, 2)
        return {"$and": [{f: _condition(r, f, True)} for f in picked]}
    if kind in (3, 4, 5):
        op = "$or" if kind != 5 else "$nor"
        out = {op: [_selector(r, fields, depth + 1) for _ in range(r.choice([2, 3]))]}
        rest = [f for f in fields if f not in json.dumps(out)]
        if rest and r.random() < 0.4:
            out.update(_fields_selector(r, rest, 1))
        return out
    return {"$not": _fields_selector(r, fields, 1, True)}


def _queries(r: random.Random) -> list[dict[str, Any]]:
    everything = [*FIELDS, "g"]
    out: list[dict[str, Any]] = []
    for _ in range(UNSORTED):
        request: dict[str, Any] = {"selector": _selector(r, everything), "limit": 1000}
        if r.random() < 0.15:
            request["fields"] = ["_id", *r.sample(FIELDS, 2)]
        if r.random() < 0.05 and "$and" not in request["selector"]:
            request["selector"]["_id"] = {r.choice(["$gt", "$lt"]): f"d{r.randrange(DOCS):03}"}
        out.append({"request": request})
    for _ in range(SORTED):
        by = r.choice(["a", "b", "d.e"])
        rest = [f for f in everything if f != by and not f.startswith(by)]
        selector = _selector(r, rest, 1) if r.random() < 0.7 else {}
        selector[by] = {"$gte": False}  # (pouchdb-find fails on "$gt": null with an index)
        direction = r.choice(["asc", "desc"])
        request = {
            "selector": selector,
            "sort": [{by: direction}],
            "limit": r.choice([5, 20, 1000]),
        }
        if r.random() < 0.3:
            request["skip"] = r.randrange(10)
        out.append({"request": request, "index": [by]})
    return out


def _install(cache: Path) -> Path:
    """pouchdb-find's directory (installed by npm from package.json, once)."""
    npm = shutil.which("npm")
    assert npm is not None
    work = cache / "pouchdb-9"
    manifest = (HERE / "package.json").read_text()
    installed = work / "package.json"
    if (
        installed.exists()
        and installed.read_text() == manifest
        and (work / "node_modules" / "pouchdb-find").is_dir()
    ):
        return work
    work.mkdir(parents=True, exist_ok=True)
    (work / "package.json").write_text(manifest)
    done = subprocess.run(
        [npm, "install", "--silent", "--no-audit", "--no-fund"],
        cwd=work,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert done.returncode == 0, f"npm install of pouchdb-find failed: {done.stderr[-2000:]}"
    return work


@pytest.fixture(scope="module")
def pouchdb(request: pytest.FixtureRequest) -> Path:
    if shutil.which("node") is None or shutil.which("npm") is None:
        pytest.skip("node and npm are needed to run pouchdb-find (the oracle): not installed")
    return _install(Path(request.config.cache.mkdir("ledgerd-find")))


@pytest.fixture(scope="module")
def shared() -> Iterator[Daemon]:
    yield from shared_daemon({}, "ld-find-")


def _run_pouchdb(work: Path, tmp: Path, docs: list[Any], queries: list[Any]) -> list[Any]:
    src = tmp / "input.json"
    src.write_text(json.dumps({"docs": docs, "queries": queries}))
    node = shutil.which("node") or "node"
    done = subprocess.run(
        [node, str(HERE / "find.js"), str(src)],
        cwd=work,
        capture_output=True,
        text=True,
        timeout=120,
        env={"NODE_PATH": str(work / "node_modules"), "PATH": "/usr/bin:/bin"},
    )
    assert done.returncode == 0, done.stderr[-2000:]
    answers: list[Any] = json.loads(done.stdout)
    return answers


def _strip(doc: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in doc.items() if k != "_rev"}


async def test_find_answers_as_pouchdb_find(pouchdb: Path, shared: Daemon, tmp_path: Path) -> None:
    r = random.Random(SEED)
    docs = [_doc(r, i) for i in range(DOCS)]
    queries = _queries(r)
    theirs = _run_pouchdb(pouchdb, tmp_path, docs, queries)
    async with AsyncClient(shared.socket) as c:
        store = c.documents("find_oracle", "p")
        written = await store.bulk_docs("corpus", docs)
        assert all(w.get("ok") for w in written), written
        checked = 0
        for q, their in zip(queries, theirs, strict=True):
            assert "error" not in their, (q, their)
            req = q["request"]
            ours = await store.select(
                "corpus",
                req["selector"],
                fields=req.get("fields"),
                sort=req.get("sort"),
                limit=req["limit"],
                skip=req.get("skip"),
            )
            our_ids = [d["_id"] for d in ours["docs"]]
            their_ids = [d["_id"] for d in their["docs"]]
            what = json.dumps(req)
            if "sort" in req:
                assert our_ids == their_ids, what
            else:
                assert sorted(our_ids) == sorted(their_ids), what
            if "fields" in req:
                mine = {d["_id"]: d for d in ours["docs"]}
                assert all(mine[d["_id"]] == _strip(d) for d in their["docs"]), what
            checked += 1
        assert checked == UNSORTED + SORTED
        # The corpus is one where the answers differ: not all empty, not all everything.
        sizes = {len(t["docs"]) for t in theirs}
        assert len(sizes) > 10 and 0 in sizes
