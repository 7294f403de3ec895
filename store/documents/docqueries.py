"""Secondary indexes as callers see them: declaring, dropping, listing and
rebuilding one, and the range query of a declared index. The definitions travel
in the page; the local rows and their builds are :mod:`store.documents.docindex`'s,
selector queries :mod:`store.documents.docfind`'s.
"""

from __future__ import annotations

from typing import Any

from ledgerd.store.documents import doclayout, docreads, doctoken
from ledgerd.store.documents.doccore import DocCore, DocumentRange, check_limit, marker_if_lost
from ledgerd.store.documents.docindexdef import IndexDef, partition_range
from ledgerd.store.documents.docmodel import (
    IndexInfo,
    IndexNotFoundError,
    MalformedRecordError,
    UnsupportedLayoutError,
    check_collection,
    check_index_name,
    parse_path,
)


def check_index(
    collection: str, name: str, partition: str | list[str], sort: str | list[str] | None
) -> tuple[list[str], list[str] | None]:
    """:meth:`DocumentStore.check_index <store.documents.documents.DocumentStore.check_index>`."""
    check_collection(collection)
    check_index_name(name)
    return parse_path(partition), None if sort is None else parse_path(sort)


async def declare_index(
    core: DocCore,
    collection: str,
    name: str,
    partition: str | list[str],
    sort: str | list[str] | None,
) -> IndexInfo:
    """:meth:`DocumentStore.declare_index
    <store.documents.documents.DocumentStore.declare_index>`."""
    part, by = check_index(collection, name, partition, sort)
    raw = doclayout.encode_definition(part, by)
    async with core.write:
        await _readable_definition(core, collection, name)
        changes = [(doclayout.index_key(collection, name), raw)]
        await core.page.write(changes + await marker_if_lost(core.page))
        await core.page.flush()
    await core.after_write()
    found = core.views.indexes.get((collection, name))
    ready = found is not None and found[1].raw == raw and found[2]
    return IndexInfo(collection, name, tuple(part), None if by is None else tuple(by), ready)


async def drop_index(core: DocCore, collection: str, name: str) -> None:
    """:meth:`DocumentStore.drop_index <store.documents.documents.DocumentStore.drop_index>`."""
    check_collection(collection)
    key = doclayout.index_key(collection, check_index_name(name))
    async with core.write:
        if await core.page.get_entry(key) is None:
            raise IndexNotFoundError(f"no index {name!r} on {collection!r}")
        await _readable_definition(core, collection, name)
        await core.page.delete(key)
        await core.page.flush()
    await core.after_write()


async def indexes(core: DocCore, collection: str) -> list[IndexInfo]:
    """:meth:`DocumentStore.indexes <store.documents.documents.DocumentStore.indexes>`."""
    check_collection(collection)
    await core.views.catch_up()
    out = {
        name: IndexInfo(
            d.collection,
            d.name,
            tuple(d.partition),
            None if d.sort is None else tuple(d.sort),
            ready,
        )
        for (coll, name), (_, d, ready) in core.views.indexes.items()
        if coll == collection
    }
    for (coll, name), e in core.views.unreadable.items():
        if coll == collection:
            err = _unreadable_index(coll, name, e)
            code = err.code if isinstance(err, UnsupportedLayoutError) else "corrupt"
            out[name] = IndexInfo(coll, name, (), None, False, code, str(err))
    return [out[name] for name in sorted(out)]


async def rebuild_index(core: DocCore, collection: str, name: str) -> None:
    """:meth:`DocumentStore.rebuild_index
    <store.documents.documents.DocumentStore.rebuild_index>`."""
    check_collection(collection)
    await core.views.catch_up()
    if not await core.views.rebuild(collection, check_index_name(name)):
        _refuse_unreadable(core, collection, name)
        raise IndexNotFoundError(f"no index {name!r} on {collection!r}")


async def query(
    core: DocCore,
    collection: str,
    index: str,
    partition: Any,
    start: Any,
    end: Any,
    limit: int,
    token: bytes | None,
    include_deleted: bool,
) -> DocumentRange:
    """:meth:`DocumentStore.query <store.documents.documents.DocumentStore.query>`."""
    check_limit(limit)
    while True:  # again if the index changed before the query had the lock
        ix, d = await _index(core, collection, index)
        lo, hi = partition_range(partition, start, end, d)
        bound = core.binding("find", collection, index, d.raw, lo, hi, include_deleted)
        after = None
        if token is not None:
            key, doc = doctoken.decode(token, doctoken.FIND, bound, 2)
            after = (key, doc)
        got = await core.views.query(ix, d, lo, hi, after, limit + 1, include_deleted)
        if got is not None:
            break
    head, rows = got
    nxt = None
    if len(rows) > limit:
        last = rows[limit - 1]
        nxt = doctoken.encode(doctoken.FIND, bound, [last.key, last.doc])
    ids = [r.doc for r in rows[:limit]]
    docs, damaged = await docreads.documents_at(core, head, collection, ids)
    return DocumentRange(docs, nxt, damaged)


async def _index(core: DocCore, collection: str, name: str) -> tuple[int, IndexDef]:
    check_collection(collection)
    check_index_name(name)
    await core.views.catch_up()  # a definition that just arrived is known
    found = await core.views.index(collection, name)
    if found is None:
        _refuse_unreadable(core, collection, name)
        raise IndexNotFoundError(f"no index {name!r} on {collection!r}")
    return found


def _refuse_unreadable(core: DocCore, collection: str, name: str) -> None:
    """Raise why the index's definition cannot be read here, if it cannot (as of
    the views' catch-up)."""
    e = core.views.unreadable.get((collection, name))
    if e is not None:
        raise _unreadable_index(collection, name, e)


async def _readable_definition(core: DocCore, collection: str, name: str) -> None:
    """UnsupportedLayoutError if the head's definition of the index is a newer
    ledgerd's: it is neither replaced nor deleted here (write lock held). A damaged
    one may be: declaring or dropping the index is how it is repaired."""
    e = await core.page.get_entry(doclayout.index_key(collection, name))
    if e is None:
        return
    try:
        doclayout.decode_definition(await core.page.objects.read_all(e.value))
    except doclayout.FutureLayoutError as err:
        raise _unreadable_index(collection, name, err) from None
    except ValueError:  # damaged: declaring or dropping it again repairs it
        return


def _unreadable_index(
    collection: str, name: str, e: ValueError
) -> UnsupportedLayoutError | MalformedRecordError:
    """The error of a query or change of an index whose definition cannot be read here."""
    if isinstance(e, doclayout.FutureLayoutError):
        return UnsupportedLayoutError(
            f"index {name!r} on {collection!r} cannot be read or changed by this ledgerd: "
            f"{e}; upgrade ledgerd on this device"
        )
    return MalformedRecordError(
        f"index {name!r} on {collection!r} is damaged: {e}; declare it again or drop it"
    )
