"""Fast paths written out for speed, each against the plain path it stands for.

Each fast path is kept because a benchmark shows it (``docs/performance.md``); each test
here gives both paths the same random input and asks for the same result. Elsewhere:
the tuple layer's inlined decoding against ``fdb.tuple`` (``test_tuple.py``), the JSON
check's inlined number tests against a plain reference (``test_docmodel.py``)."""

from __future__ import annotations

import tempfile
from pathlib import Path
from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from ledgerd.store import DocumentStore, Repository

_json = st.recursive(
    st.none() | st.booleans() | st.integers(-(2**63), 2**64 - 1) | st.text(max_size=20),
    lambda inner: (
        st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4)
    ),
    max_leaves=12,
)
_fields = st.text(max_size=8).filter(lambda f: not f.startswith("_"))  # (reserved at the top)


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(st.dictionaries(_fields, _json, max_size=5), min_size=1, max_size=30))
async def test_create_many_stores_what_one_record_at_a_time_would(docs: list[Any]) -> None:
    """``create_many`` encodes each document's head and body in its own loop (a call
    less per document); the page then holds, for each, exactly what the plain path
    (``DocCore.entries``) makes of the record it returned."""
    with tempfile.TemporaryDirectory() as d:
        repo = await Repository.open(Path(d) / "r")
        try:
            page = await repo.ledger("l").page("p")
            store = await DocumentStore.open(page)
            created = await store.create_many("c", docs)
            core = store._core
            for doc in created:
                head, body = core.entries(doc.collection, doc._raw_id, doc._record)
                assert await page.get(head[0]) == head[1]
                assert await page.get(body[0]) == body[1]
                assert (await store.get("c", doc.id)).data == doc.data
        finally:
            await repo.close()
