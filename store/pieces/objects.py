"""The object store of one page: pieces in SQLite, values written and read as streams.

This module owns storing and reading pieces (``objects``), their sync status
(``unsynced``), which open journal staged them (``journal_pieces``), and
garbage collection of transient pieces. It does not know about trees, commits or
the cloud; a *fetcher*, given when the store is made, supplies pieces that are
not stored locally (:class:`store.page.hooks.PieceFetcher`, through the page).

Writing a value
    The source (bytes, an async iterator of bytes, or a file) is read in blocks;
    each block is split on a worker thread (FastCDC and SHA-256 release the GIL)
    while the previous block's pieces are inserted, so hashing and SQLite work
    overlap. Pieces are staged in short transactions under a private
    ``U``-prefixed token, then handed to the caller's journal in one transaction
    (:meth:`ObjectStore.adopt`). A crash mid-stream leaves only staged pieces,
    which the next open collects.

Reading a value
    Index pieces are walked depth first; chunk pieces are fetched in batches and
    verified against their digest before a byte is returned. Ranged reads skip
    every subtree outside the range. Pieces up to CACHE_PIECE_LIMIT bytes that were
    read (and so verified) or written are kept in the repository's cache
    (:mod:`store.pieces.cache`): a piece is verified once, when it enters the cache, and a
    read of a cached piece needs no trip to SQLite. A read of a few pieces runs
    inline on the event loop (``Database.run(..., small=True)``).
"""

from __future__ import annotations

import asyncio
import logging
import operator
import os
import sqlite3
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

import aiofiles

from ledgerd.store.errors import CorruptObjectError, ObjectNotFoundError, RangeError
from ledgerd.store.pieces import delta, split
from ledgerd.store.pieces import digest as dg
from ledgerd.store.pieces.cache import Cache, CacheSpace, piece_cost
from ledgerd.store.pieces.sources import BLOCK_SIZE as BLOCK_SIZE
from ledgerd.store.pieces.sources import Source as Source
from ledgerd.store.pieces.sources import ValueRef as ValueRef
from ledgerd.store.pieces.sources import blocks
from ledgerd.store.pieces.sources import mismatched as mismatched
from ledgerd.store.sqlite import piece_rows, sql
from ledgerd.store.sqlite.db import Database
from ledgerd.store.sqlite.schema import DIGEST_IN, SYNCED, TRANSIENT, digest_is
from ledgerd.store.sqlite.threads import OFF_LOOP_BYTES, Connection, off_loop

log = logging.getLogger(__name__)

READ_BATCH = 64
"""Pieces fetched per query when reading a value."""
READ_MANY_BATCH = 400
"""Pieces :meth:`ObjectStore.read_each` reads (and verifies) at a time, a query each."""

TURN_PIECES = 8192
"""Pieces :meth:`ObjectStore.value_pieces` goes through between two turns it gives
the event loop."""
HOLD_BATCH = 64
"""Pieces :meth:`ObjectStore.hold` fetches at a time (at most a few MiB in memory)."""

CACHE_PIECE_LIMIT = 64 * 1024
"""Pieces up to this size that were read (and verified) or written are kept in the
repository's cache, so reading what was just written or read needs no trip to SQLite."""

_TYPE_BYTE = operator.itemgetter(0)

CACHE_VALUE_LIMIT = 1024 * 1024
"""The chunks of a value larger than this are not cached when read: streaming a large
value through would only push everything else out."""

Fetcher = Callable[[list[bytes]], Awaitable[dict[bytes, bytes]]]
"""Given digests of pieces missing locally, returns their contents (unverified)."""


class ObjectStore:
    """Pieces of one page's database."""

    def __init__(
        self,
        db: Database,
        memory: Mapping[bytes, bytes] | None = None,
        fetcher: Fetcher | None = None,
        cache: CacheSpace[bytes] | None = None,
    ) -> None:
        self.db = db
        self.fetcher = fetcher
        """Brings pieces not stored here (LAZY values); None: they are not found."""
        self.memory: Mapping[bytes, bytes] = memory if memory is not None else {}
        self.cache: CacheSpace[bytes] = cache if cache is not None else Cache().space()
        """Verified pieces of this page, in the repository's cache."""

    def _sharing(self, memory: Mapping[bytes, bytes], fetcher: Fetcher | None) -> ObjectStore:
        return ObjectStore(self.db, memory, fetcher, self.cache)

    def overlaid(self, memory: Mapping[bytes, bytes]) -> ObjectStore:
        """The same store, also reading pieces held in ``memory`` (a transaction's)."""
        return self._sharing(memory, self.fetcher)

    def local_only(self) -> ObjectStore:
        """The same store, never fetching: a piece not stored here is not found."""
        return self._sharing(self.memory, None)

    def remember(self, pieces: Iterable[tuple[bytes, bytes]]) -> None:
        """Keep verified (or just written) small pieces in the cache."""
        self.cache.put_many((d, v, piece_cost(v)) for d, v in pieces if len(v) <= CACHE_PIECE_LIMIT)

    def clear_cache(self) -> None:
        """Forget every cached piece (as in a freshly started process)."""
        self.cache.clear()

    # -- writing ---------------------------------------------------------------

    async def _stage(self, token: str, pieces: list[split.Piece]) -> None:
        if not pieces:
            return

        def work(conn: sqlite3.Connection) -> None:
            sql.put_pieces(conn, pieces, TRANSIENT)
            piece_rows.stage(conn, token, [p.digest for p in pieces])

        await self.db.run(work, write=True)

    async def stage_value(
        self, source: Source, kind: dg.Kind = dg.Kind.VALUE
    ) -> tuple[str, ValueRef]:
        """Split and store ``source``; returns a staging token and the value.

        The pieces stay transient under the token until :meth:`adopt` hands them
        to a journal (or :meth:`discard` drops them). Splitting of block N+1
        overlaps the insertion of block N.
        """
        token = "U" + uuid.uuid4().hex
        splitter = split.Splitter(kind)
        inserting: asyncio.Task[None] | None = None
        try:
            async for block in blocks(source):
                pieces = await off_loop(len(block) >= OFF_LOOP_BYTES, splitter.feed, block)
                if inserting is not None:
                    await inserting
                    inserting = None
                if pieces:
                    inserting = asyncio.ensure_future(self._stage(token, pieces))
            tail, root = splitter.finish()
            if inserting is not None:
                await inserting
                inserting = None
            await self._stage(token, tail)
        except BaseException:
            if inserting is not None:
                inserting.cancel()
                await asyncio.gather(inserting, return_exceptions=True)
            await asyncio.shield(self._discard_quietly(token))
            raise
        return token, ValueRef(root.digest, root.size)

    async def _discard_quietly(self, token: str) -> None:
        try:
            await self.discard(token)
        except Exception as e:  # the database may be closing; the next open collects
            log.debug("could not discard staged pieces %s: %s", token, e)

    async def adopt(self, token: str, journal_id: str, conn: Connection | None = None) -> None:
        """Move staged pieces from ``token`` to ``journal_id``.

        Pass the open write connection when calling inside a transaction.
        """
        if conn is None:
            async with self.db.write() as c:
                await piece_rows.adopt(c, token, journal_id)
        else:
            await piece_rows.adopt(conn, token, journal_id)

    async def put_value(
        self, source: Source, journal_id: str, kind: dg.Kind = dg.Kind.VALUE
    ) -> ValueRef:
        """Store a value and stage its pieces under ``journal_id``."""
        token, ref = await self.stage_value(source, kind)
        await self.adopt(token, journal_id)
        return ref

    async def recover(self) -> int:
        """After a crash: drop what half-written values and explicit journals staged.

        Pieces of implicit (``I``) journals stay; their journal is committed by the
        page on open. Returns the number of pieces collected.
        """
        return await self._collect("substr(journal_id, 1, 1) IN ('U', 'E')", ())

    # -- status ----------------------------------------------------------------

    async def mark_synced(self, digests: Iterable[bytes]) -> None:
        """These pieces are in the cloud (uploaded, or seen in a remote pack). Those
        not stored here are left alone: what a page knows of a piece it does not
        store is where to fetch it (``remote_pieces``, written by sync)."""
        rows = [d for d in digests if not dg.is_inline(d)]
        if not rows:
            return
        await self.db.run(lambda conn: sql.mark_synced(conn, rows), write=True)

    async def status(self, digest: bytes) -> int | None:
        """TRANSIENT, LOCAL or SYNCED; None if this page does not know the piece."""
        rows = await self.db.read_all(
            f"SELECT coalesce(u.status, {SYNCED}) FROM objects o "
            f"LEFT JOIN unsynced u ON u.id = o.id WHERE {digest_is('o.digest', '?1')} "
            f"UNION ALL SELECT {SYNCED} FROM remote_pieces WHERE digest = ?1",
            (digest,),
        )
        return int(rows[0][0]) if rows else None

    async def known(self, digests: list[bytes]) -> set[bytes]:
        """Which of ``digests`` this page knows (stored, or known to be in the cloud)."""
        rows = await self.db.read_in(
            f"SELECT digest FROM objects WHERE {DIGEST_IN} "
            "UNION SELECT digest FROM remote_pieces WHERE digest IN ({marks})",
            list(dict.fromkeys(digests)),
        )
        return {bytes(r[0]) for r in rows}

    async def discard(self, journal_id: str) -> int:
        """Forget what ``journal_id`` staged and collect pieces nothing else needs."""
        return await self._collect("journal_id = ?", (journal_id,))

    async def collect_garbage(self) -> int:
        """Delete every transient piece that no open journal stages."""
        return await self.db.run(sql.collect_garbage, write=True)

    async def _collect(self, journals: str, params: tuple[object, ...]) -> int:
        """Drop the journals matching ``journals`` and the pieces only they staged."""
        n = await self.db.run(lambda conn: sql.collect(conn, journals, params), write=True)
        if n:
            log.debug("collected %d transient pieces", n)
        return n

    async def value_pieces(self, roots: Iterable[bytes]) -> set[bytes]:
        """The stored pieces of the values with these root digests (index pieces are
        read to find their chunks; inline digests have none)."""
        out: set[bytes] = set()
        stack = [r for r in roots if not dg.is_inline(r)]
        turn = TURN_PIECES
        while stack:
            d = stack.pop()
            if d in out:
                continue
            out.add(d)
            turn -= 1
            if not turn:  # a whole page's values (a checkpoint): others run meanwhile
                turn = TURN_PIECES
                await asyncio.sleep(0)
            if dg.is_index(d):
                index = split.decode_index(await self.get_piece(d))
                stack.extend(c.digest for c in index if not dg.is_inline(c.digest))
        return out

    async def hold(self, roots: Iterable[bytes]) -> None:
        """Store here every piece of the values with these root digests, fetching those
        only known to be in the cloud (LAZY pieces not read yet): for a write that
        takes a value this device has not read, as a conflict's resolution does. The
        device uploads those pieces with its write, and the pack they came in may be
        compacted by then, with no checkpoint holding a value superseded since."""
        pieces = [d for d in await self.value_pieces(roots) if not dg.is_inline(d)]
        for i in range(0, len(pieces), HOLD_BATCH):
            batch = pieces[i : i + HOLD_BATCH]
            rows = await self.db.read_in(f"SELECT digest FROM objects WHERE {DIGEST_IN}", batch)
            here = {bytes(r[0]) for r in rows}
            missing = [d for d in batch if d not in here]
            if missing:
                await self._fetch(missing)

    # -- reading ---------------------------------------------------------------

    async def get_pieces(
        self, digests: Iterable[bytes], *, remember: bool = True
    ) -> dict[bytes, bytes]:
        """Verified contents of ``digests`` (hashed ones), fetching missing ones if possible.

        Pieces read from SQLite are verified, then kept in the cache unless not
        ``remember`` (tree nodes: their decoded form is cached instead)."""
        found, want = self._known(digests)
        if want:
            found.update(await self._stored(want, await delta.read_rows(self.db, want), remember))
        return found

    def _known(self, digests: Iterable[bytes]) -> tuple[dict[bytes, bytes], list[bytes]]:
        """Those of ``digests`` in the cache or in memory, and the others, in order."""
        found, cold = self.cache.get_many(dict.fromkeys(digests))
        if not cold or not (memory := self.memory):
            return found, cold
        found.update((d, memory[d]) for d in cold if d in memory)
        return found, [d for d in cold if d not in memory]

    async def _stored(
        self, want: list[bytes], rows: Sequence[Sequence[Any]], remember: bool
    ) -> dict[bytes, bytes]:
        """The pieces ``want`` from their ``rows``, verified; the others fetched."""
        # Keyed by the digest objects asked for: a scan's next lookups compare by identity.
        asked = dict(zip(want, want, strict=True))
        fresh = {asked.get(d, d): self._blob(d, v) for d, v in rows}
        await self._verify(fresh)
        if remember:
            self.remember(fresh.items())
        if missing := [d for d in want if d not in fresh]:
            fresh.update(await self._fetch(missing))
        return fresh

    def _blob(self, digest: bytes, data: object) -> bytes:
        """A stored piece's data as read; the table is not STRICT, so a damaged file may
        hold something else than a blob there: corrupt, as a piece that does not verify."""
        if type(data) is bytes:
            return data
        raise CorruptObjectError(
            f"stored object {dg.short(bytes(digest))} in {self.db.path} is not a blob "
            f"({type(data).__name__}): it does not match its digest"
        )

    async def _verify(self, pieces: dict[bytes, bytes]) -> None:
        if bad := await mismatched(pieces):
            raise CorruptObjectError(
                f"stored object {dg.short(bad[0])} in {self.db.path} does not match its digest"
            )

    async def _fetch(self, missing: list[bytes]) -> dict[bytes, bytes]:
        if self.fetcher is None:
            raise ObjectNotFoundError(f"object {dg.short(missing[0])} is not stored on this device")
        got = await self.fetcher(missing)
        await self._verify(got)
        absent = [d for d in missing if d not in got]
        if absent:
            raise ObjectNotFoundError(f"object {dg.short(absent[0])} could not be fetched")
        # Stored and synced; their remote_pieces rows go (see sql.put_pieces).
        await self.db.run(lambda conn: sql.put_pieces(conn, got.items(), SYNCED), write=True)
        return got

    async def get_piece(self, digest: bytes) -> bytes:
        if dg.is_inline(digest):
            return dg.inline_content(digest)
        return (await self.get_pieces([digest]))[digest]

    async def size(self, digest: bytes) -> int:
        """Size in bytes of the value named by a root digest."""
        if dg.is_inline(digest):
            return len(digest) - 1
        if dg.is_index(digest):
            return sum(c.size for c in split.decode_index(await self.get_piece(digest)))
        # A single chunk: from memory if it is there, else its length from SQLite
        # (a listing of sizes should not read and verify every value).
        known = self.cache.get(digest) or self.memory.get(digest)
        if known is not None:
            return len(known)
        rows = await self.db.read_all(
            f"SELECT length(data) FROM objects WHERE {digest_is('digest', '?1')}",
            (digest,),
            small=True,
        )
        if rows:
            return int(rows[0][0])
        return len(await self.get_piece(digest))  # not stored here: fetched, if possible

    async def read(
        self, digest: bytes, offset: int = 0, length: int | None = None
    ) -> AsyncIterator[bytes]:
        """Stream the bytes ``[offset, offset + length)`` of a value.

        Only the pieces covering the range are read. Raises :class:`RangeError`
        if ``offset`` is past the end; a ``length`` running past the end is cut.
        """
        if offset < 0 or (length is not None and length < 0):
            raise RangeError("offset and length must not be negative")
        total = await self.size(digest)
        if offset > total:
            raise RangeError(f"offset {offset} is past the end of a {total}-byte value")
        end = total if length is None else min(total, offset + length)
        return self._read_range(digest, offset, end, total <= CACHE_VALUE_LIMIT)

    async def _read_range(
        self, root: bytes, start: int, end: int, remember: bool
    ) -> AsyncIterator[bytes]:
        if start >= end:
            return
        # Leaves covering [start, end) in order, as (digest, leaf_start), resolved lazily.
        async for batch in self._leaves(root, start, end):
            contents = await self.get_pieces(
                [d for d, _ in batch if not dg.is_inline(d)], remember=remember
            )
            for d, leaf_start in batch:
                data = dg.inline_content(d) if dg.is_inline(d) else contents[d]
                lo = max(start - leaf_start, 0)
                hi = min(end - leaf_start, len(data))
                if lo == 0 and hi == len(data):
                    yield data
                else:
                    yield data[lo:hi]

    async def _leaves(
        self, root: bytes, start: int, end: int
    ) -> AsyncIterator[list[tuple[bytes, int]]]:
        """Batches of (chunk digest, offset of the chunk) covering [start, end)."""
        batch: list[tuple[bytes, int]] = []
        # Depth-first walk with an explicit stack of (digest, offset, size).
        stack: list[tuple[bytes, int]] = [(root, 0)]
        while stack:
            d, pos = stack.pop()
            if not dg.is_index(d):
                batch.append((d, pos))
                if len(batch) >= READ_BATCH:
                    yield batch
                    batch = []
                continue
            children = split.decode_index(await self.get_piece(d))
            items: list[tuple[bytes, int]] = []
            for c in children:
                if pos < end and pos + c.size > start:
                    items.append((c.digest, pos))
                pos += c.size
            stack.extend(reversed(items))
        if batch:
            yield batch

    async def read_many(self, digests: Iterable[bytes]) -> dict[bytes, bytes]:
        """Whole values of many digests; single-piece values are fetched in batches."""
        wanted = list(dict.fromkeys(digests))
        return dict(zip(wanted, await self.read_each(wanted), strict=True))

    async def read_each(self, digests: Sequence[bytes]) -> list[bytes]:
        """The whole value of each of ``digests``, in order (a scan's). When each is
        inline, or of one hashed piece (their type bytes tell), there is no call per
        digest: cached pieces come from one :meth:`CacheSpace.peek_each`, no LRU move
        (a bulk read's hits do not count as use: docs/performance.md)."""
        types = bytes(map(_TYPE_BYTE, digests))
        if not types.strip(dg.VALUE_INLINE):  # all carried in their digests (small values)
            return [d[1:] for d in digests]
        if types.strip(dg.VALUE_CHUNK):  # not all single pieces
            return await self._read_each_kind(digests)
        if None not in (values := self.cache.peek_each(digests)):
            return values  # type: ignore[return-value]
        cold = [d for d, v in zip(digests, values, strict=True) if v is None]
        more = await self._get_batched(cold)
        return [more[d] if v is None else v for d, v in zip(digests, values, strict=True)]

    async def _get_batched(self, digests: list[bytes]) -> dict[bytes, bytes]:
        """:meth:`get_pieces` in batches of a query each, the next one's query running on
        the reader's thread while this one's pieces are verified and cached."""
        out, want = self._known(digests)
        parts = [want[i : i + READ_MANY_BATCH] for i in range(0, len(want), READ_MANY_BATCH)]
        if not parts:
            return out
        reading = asyncio.ensure_future(delta.read_rows(self.db, parts[0]))
        try:
            for part, after in zip(parts, [*parts[1:], None], strict=True):
                rows = await reading
                if after is not None:
                    reading = asyncio.ensure_future(delta.read_rows(self.db, after))
                out.update(await self._stored(part, rows, True))
        finally:  # (if one failed, the next one's result is not wanted)
            reading.cancel()
            await asyncio.gather(reading, return_exceptions=True)
        return out

    async def _read_each_kind(self, digests: Sequence[bytes]) -> list[bytes]:
        """:meth:`read_each` of digests of any kind: inline, of many pieces, of one."""
        unique = dict.fromkeys(digests)
        out = {d: dg.inline_content(d) for d in unique if dg.is_inline(d)}
        out.update({d: await self.read_all(d) for d in unique if dg.is_index(d)})
        out.update(await self._get_batched([d for d in unique if d not in out]))
        return list(map(out.__getitem__, digests))

    async def read_all(self, digest: bytes, *, remember: bool = True) -> bytes:
        """The whole value in memory; for small values (tree nodes, tests).

        A value of one piece (most small values) is read with no stream around it;
        ``remember`` as in :meth:`get_pieces`."""
        if dg.is_inline(digest):
            return dg.inline_content(digest)
        if not dg.is_index(digest):
            got = self.cache.get(digest) or self.memory.get(digest)
            if got is not None:
                return got
            got = await self._read_one(digest, remember)
            if got is not None:
                return got
            return (await self.get_pieces((digest,), remember=remember))[digest]
        return b"".join([b async for b in await self.read(digest)])

    async def _read_one(self, digest: bytes, remember: bool) -> bytes | None:
        """One stored piece, verified (and cached if ``remember``); None if it is not
        stored (:meth:`get_pieces` fetches it). The path of a point read, without
        :meth:`get_pieces`' batching around one piece."""
        stored = await delta.read_one(self.db, digest)
        if stored is None:
            return None
        data = self._blob(digest, stored)
        await self._verify({digest: data})  # inline for a small one
        if remember:
            self.remember(((digest, data),))
        return data

    async def read_to_file(self, digest: bytes, path: Path) -> int:
        """Write a value to ``path`` (atomically, via a temporary file)."""
        tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
        n = 0
        try:
            async with aiofiles.open(tmp, "wb") as f:
                async for block in await self.read(digest):
                    await f.write(block)
                    n += len(block)
            os.replace(tmp, path)
        except BaseException:
            tmp.unlink(missing_ok=True)
            raise
        return n

    # -- counting (tests, benchmarks, status) ------------------------------------

    async def counts(self) -> dict[str, int]:
        rows = await self.db.read_all(
            "SELECT count(*), coalesce(sum(length(data)), 0) FROM objects"
        )
        return {"objects": int(rows[0][0]), "bytes": int(rows[0][1])}
