"""Everything the simulation knows of ledgerd's internals, in one place.

The rest of ``tests/sim`` drives devices only through the functions here, so that a
change of the store's or sync's internals (the new protocol of docs/convergence.md)
is adapted here alone. What this module reaches, beyond the public API of
:class:`ledgerd.store.Repository`, :class:`ledgerd.store.Page`,
:class:`ledgerd.store.DocumentStore` and :class:`ledgerd.sync.engine.SyncEngine`:

* ``ledgerd.store.sqlite.db.Database.run`` / ``.write`` / ``.write_now`` (public methods of
  a private module), wrapped once per process: the seam where a device's k-th SQLite
  write crashes it. Which device a database belongs to is told by its ``path``.
* ``ledgerd.sync.checkpoints.FLOOR`` (a module constant, read at each call): the
  bytes of history before a checkpoint is due, set per history.
* ``Page.head.root`` and ``Page.heads()`` / ``Page.history()``: the page's root
  digest, head count and commit count (the old protocol's commit graph).
* ``SyncEngine.status()['packs']`` / ``['gaps']``: held packs and gaps.
* ``os.urandom`` and ``secrets.token_bytes``, replaced while a history runs by a
  stream of the seed (commit salts, device ids, nonces, bucket secrets), so that a
  seed replays exactly.
"""

from __future__ import annotations

import contextlib
import os
import random
import secrets
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

from ledgerd.store import (
    DocumentStore,
    Page,
    PageHooks,
    Policy,
    Priority,
    Repository,
    Subspace,
    Versionstamp,
)
from ledgerd.store.sqlite import db as store_db
from ledgerd.store.tree.merge import Choice, MergeRequest, Resolver
from ledgerd.sync import checkpoints as sync_checkpoints
from ledgerd.sync import crypto
from ledgerd.sync.engine import Stats, SyncEngine
from tests.sim.bucket import CrashPoints, DeviceCloud

T = TypeVar("T")


LEDGER = b"sim"
VS = Subspace(("vs",))
"""Where versionstamped keys are written."""

POLICIES = {
    "lww": Policy.LAST_ONE_WINS,
    "auto": Policy.AUTOMATIC_WITH_FALLBACK,
    "custom": Policy.CUSTOM,
}


# -- the crash seam: a device's SQLite writes ------------------------------------------

_roots: dict[str, Callable[[], CrashPoints]] = {}
_installed = False


def _points(path: Path) -> CrashPoints | None:
    p = str(path)
    for root, points in _roots.items():
        if p.startswith(root):
            return points()
    return None


def install_crash_seam() -> None:
    """Wrap the store's three ways to write SQLite once per process; a database under a
    registered device's directory counts its writes there (see :class:`CrashPoints`)."""
    global _installed
    if _installed:
        return
    _installed = True
    db_class: Any = store_db.Database
    run, write, write_now = db_class.run, db_class.write, db_class.write_now

    async def crashing_run(
        self: store_db.Database, fn: Any, *, write: bool = False, small: bool = False
    ) -> Any:
        points = _points(self.path) if write else None
        after = points is not None and points.db_write(f"run on {self.path.name}")
        result = await run(self, fn, write=write, small=small)
        if after and points is not None:
            points.after(f"run on {self.path.name}")
        return result

    @asynccontextmanager
    async def crashing_write(self: store_db.Database) -> AsyncIterator[Any]:
        points = _points(self.path)
        after = points is not None and points.db_write(f"write on {self.path.name}")
        async with write(self) as conn:
            yield conn
        if after and points is not None:
            points.after(f"write on {self.path.name}")

    def crashing_write_now(self: store_db.Database, fn: Any) -> Any:
        points = _points(self.path)
        after = points is not None and points.db_write(f"inline write on {self.path.name}")
        result = write_now(self, fn)
        if after and points is not None:
            points.after(f"inline write on {self.path.name}")
        return result

    db_class.run = crashing_run
    db_class.write = crashing_write
    db_class.write_now = crashing_write_now


def register_root(root: Path, points: Callable[[], CrashPoints]) -> None:
    _roots[str(root) + os.sep] = points


def unregister_root(root: Path) -> None:
    _roots.pop(str(root) + os.sep, None)


# -- determinism -----------------------------------------------------------------------


@contextlib.contextmanager
def seeded_entropy(rng: random.Random) -> Iterator[None]:
    """``os.urandom`` and ``secrets.token_bytes`` from ``rng`` for the block (commit
    salts, device ids, page ids, nonces, bucket secrets, uuid4 ids)."""
    urandom, token_bytes = os.urandom, secrets.token_bytes

    def fake(n: int) -> bytes:
        return rng.randbytes(n)

    def fake_token(nbytes: int | None = None) -> bytes:
        return rng.randbytes(32 if nbytes is None else nbytes)

    os.urandom = fake
    secrets.token_bytes = fake_token
    try:
        yield
    finally:
        os.urandom = urandom
        secrets.token_bytes = token_bytes


@contextlib.contextmanager
def checkpoint_floor(floor: int) -> Iterator[None]:
    """Checkpoints due after ``floor`` bytes of history, for the block."""
    old = sync_checkpoints.FLOOR
    sync_checkpoints.FLOOR = floor
    try:
        yield
    finally:
        sync_checkpoints.FLOOR = old


# -- resolvers -------------------------------------------------------------------------


async def converging_resolver(req: MergeRequest) -> dict[bytes, Choice]:
    """A resolver every device answers alike whatever the orientation: a side that did
    not change the key gives way to the one that did; otherwise the larger value (by
    digest; a delete is the smallest). It always answers with a written value."""
    out: dict[bytes, Choice] = {}
    for c in req.conflicts:
        left = None if c.left is None else c.left.value
        right = None if c.right is None else c.right.value
        base = None if c.base is None else c.base.value
        if left == base:
            out[c.key] = "right"
        elif right == base:
            out[c.key] = "left"
        else:
            out[c.key] = "left" if (left or b"") >= (right or b"") else "right"
    return out


class Resolvers:
    """The device's resolver source (:class:`ledgerd.store.ResolverSource`)."""

    def __init__(self, connected: bool = True) -> None:
        self.resolver: Resolver | None = converging_resolver if connected else None

    def resolver_for(self, ledger: bytes) -> Resolver | None:
        return self.resolver


async def connect_resolver(repo: Repository, pids: list[bytes], connected: bool) -> None:
    """Connect or disconnect the device's resolver; once connected, the merges that
    waited for it run (as the daemon does when a resolver registers)."""
    resolvers = repo.hooks.resolvers
    assert isinstance(resolvers, Resolvers)
    resolvers.resolver = converging_resolver if connected else None
    if connected:
        for pid in pids:
            if pid in await page_ids(repo):
                async with page(repo, pid) as p:
                    await p.try_merge()


# -- a device --------------------------------------------------------------------------


@dataclass(frozen=True)
class EngineSettings:
    """A device's sync settings (the same for each of its processes)."""

    history_retention: float
    compaction_grace: float
    checkpoint_interval: float
    max_checkpoint: int
    max_pack: int
    key: bytes | None  # the encryption key (every device the same), or None


def keyring(key: bytes | None) -> crypto.KeyRing | None:
    return None if key is None else crypto.parse_key_file(crypto.key_line(key), "sim keys")


async def open_device(
    root: Path,
    cloud: DeviceCloud,
    s: EngineSettings,
    clock: Callable[[], float],
    resolver: bool = True,
) -> tuple[Repository, SyncEngine]:
    """A device's repository and engine, its rounds driven by hand (no background loop,
    held packs retried only by full rounds). Its monotonic clock is simulated time with
    no skew and no jumps (``clock.time``, when ``clock`` is a device's clock)."""
    monotonic = getattr(clock, "time", None)
    engine = SyncEngine(
        cloud,
        location="sim://bucket",
        clock=clock,
        monotonic=(lambda: monotonic.now) if monotonic is not None else time.monotonic,
        retry_first=1e9,
        retry_most=1e9,
        checkpoint_interval=s.checkpoint_interval,
        compaction_grace=s.compaction_grace,
        compaction_interval=1e12,
        max_checkpoint=s.max_checkpoint,
        max_pack=s.max_pack,
        keys=keyring(s.key),
    )
    hooks: PageHooks = engine.hooks(resolvers=Resolvers(resolver))
    repo = await Repository.open(
        root, hooks=hooks, history_retention=s.history_retention, clock=clock
    )
    try:
        await engine.start(repo, background=False)
    except BaseException:
        await repo.close()
        raise
    return repo, engine


async def abandon(repo: Repository, engine: SyncEngine) -> None:
    """A crashed device's process goes: its sync work cancelled, its pages and
    databases closed without writing (every write raises: the crash points are dead),
    open SQLite transactions rolled back by the close."""
    await engine.interrupt(timeout=5.0)
    with contextlib.suppress(Exception):
        await repo.close()


async def stop(repo: Repository, engine: SyncEngine) -> None:
    """A clean stop, as the daemon's: the last upload, then the repository closes."""
    await engine.stop(final_upload_timeout=30.0)
    await repo.close()


@asynccontextmanager
async def page(repo: Repository, pid: bytes) -> AsyncIterator[Page]:
    """The page, made if it does not exist, as the daemon's first write makes it
    (``daemon.api.Api.first_write``): marked unwritten until the block ends, so that a
    crash before the write leaves no empty page listed after the restart, and removed
    again if the block wrote nothing."""
    p, made = await repo.acquire_new(LEDGER, pid)
    with p.lease():  # no await since acquire_new: the page is open
        yield p
    if made:  # (one that nothing was written to goes again, as the daemon's)
        if p.never_written:
            await repo.discard_unwritten(LEDGER, pid)
        else:
            await repo.written(LEDGER, pid)


async def set_policy(repo: Repository, pid: bytes, policy: str) -> None:
    async with page(repo, pid) as p:
        if p.policy is not POLICIES[policy]:
            await p.set_policy(POLICIES[policy])


# -- writes (each returns once committed) ----------------------------------------------


async def write(
    repo: Repository, pid: bytes, changes: list[tuple[bytes, bytes | None]], lazy: bool = False
) -> None:
    """Puts (bytes) and deletes (None) in one write (a put alone, a delete alone, or a
    batch), then its commit. ``lazy``: the values are LAZY (fetched on first read)."""
    priority = Priority.LAZY if lazy else Priority.EAGER
    async with page(repo, pid) as p:
        if len(changes) == 1 and changes[0][1] is None:
            await p.delete(changes[0][0])
        elif len(changes) == 1:
            value = changes[0][1]
            assert value is not None
            await p.put(changes[0][0], value, priority)
        else:
            await p.write(changes, priority)
        await p.flush()


async def keys(repo: Repository, pid: bytes) -> list[bytes]:
    """The keys the page holds now (those a clear deletes)."""
    async with page(repo, pid) as p:
        return list((await p.keys()).items)


async def clear(repo: Repository, pid: bytes) -> None:
    async with page(repo, pid) as p:
        await p.clear()
        await p.flush()


async def transaction(
    repo: Repository,
    pid: bytes,
    changes: list[tuple[bytes, bytes | None]],
    during: Callable[[], Awaitable[object]] | None = None,
) -> None:
    """A transaction of ``changes``; ``during`` runs between its writes and its commit
    (a sync round that moves the page under it)."""
    async with page(repo, pid) as p:
        async with p.transaction() as txn:
            for k, v in changes:
                if v is None:
                    await txn.delete(k)
                else:
                    await txn.put(k, v)
            if during is not None:
                await during()
        await p.flush()


async def versionstamped(repo: Repository, pid: bytes, value: bytes) -> bytes:
    """A versionstamped key under :data:`VS`; returns the key written."""
    async with page(repo, pid) as p:
        key = await p.set_versionstamped_key(
            VS.pack_with_versionstamp((Versionstamp.incomplete(),)), value
        )
        await p.flush()
    return key


async def gc(repo: Repository, pid: bytes) -> int:
    return (await repo.collect_garbage(LEDGER, pid)).commits_pruned


async def evict(repo: Repository, pid: bytes) -> int:
    """Evict the page (raises NotEvictableError when it is not fully synced or busy)."""
    return await repo.evict(LEDGER, pid)


def is_evicted(repo: Repository, pid: bytes) -> bool:
    return repo.is_evicted(LEDGER, pid)


async def restore(repo: Repository, pid: bytes) -> None:
    """Bring an evicted page back (its first use does)."""
    async with page(repo, pid):
        pass


@dataclass
class Compacted:
    packs_deleted: int
    text: str

    def __str__(self) -> str:
        return self.text


async def compact(engine: SyncEngine) -> Compacted:
    r = await engine.compact()
    return Compacted(
        r.packs_deleted,
        f"{r.packs_deleted} packs and {r.checkpoints_deleted} checkpoints deleted, "
        f"{r.checkpoints_written} checkpoints written, {r.packs_kept} packs kept",
    )


async def sync_round(engine: SyncEngine, *, download: bool, full: bool) -> Stats:
    return await engine.round(download=download, full=full)


async def sync(engine: SyncEngine, timeout: float = 60.0) -> Stats:
    return await engine.sync(timeout=timeout)


# -- documents -------------------------------------------------------------------------

COLLECTION = "notes"
INDEX = "by_tag"


async def documents(p: Page) -> DocumentStore:
    return await DocumentStore.open(p)


async def doc_create(repo: Repository, pid: bytes, data: dict[str, Any]) -> str:
    async with page(repo, pid) as p:
        doc = await (await documents(p)).create(COLLECTION, data)
        await p.flush()
    return doc.id


async def doc_replace(repo: Repository, pid: bytes, doc_id: str, data: dict[str, Any]) -> None:
    async with page(repo, pid) as p:
        await (await documents(p)).replace(COLLECTION, doc_id, data)
        await p.flush()


async def doc_resolve(repo: Repository, pid: bytes, doc_id: str, data: dict[str, Any]) -> int:
    """Replace the document with ``data``, resolving every conflict it keeps here; how
    many it resolved (none: a plain replace)."""
    async with page(repo, pid) as p:
        docs = await documents(p)
        kept = [d.rev for d in await docs.conflicts(COLLECTION, doc_id)]
        await docs.replace(COLLECTION, doc_id, data, resolves=kept)
        await p.flush()
    return len(kept)


async def doc_delete(repo: Repository, pid: bytes, doc_id: str) -> None:
    async with page(repo, pid) as p:
        await (await documents(p)).delete(COLLECTION, doc_id)
        await p.flush()


async def doc_index(repo: Repository, pid: bytes) -> None:
    """Declare the index on ``tag`` and wait until it is built (a query waits for it)."""
    async with page(repo, pid) as p:
        docs = await documents(p)
        await docs.declare_index(COLLECTION, INDEX, "tag")
        await p.flush()
        await docs.query(COLLECTION, INDEX, "a", limit=1)


# -- what the oracle reads -------------------------------------------------------------


Conflicts = tuple[tuple[str, Any], ...]
"""A document's kept conflicts: (rev, data) of each, highest ranked first."""


@dataclass
class PageState:
    entries: dict[bytes, bytes]
    root: bytes
    heads: int
    commits: int
    pending_conflict: str | None
    docs: dict[str, tuple[str, Any, Conflicts]] | None = None
    """Live documents: id -> (rev, data, its kept conflicts)."""
    index: dict[str, list[str]] | None = None  # partition -> ids in index order


async def page_state(repo: Repository, pid: bytes, tags: list[str]) -> PageState:
    async with page(repo, pid) as p:
        entries = {kv.key: kv.value for kv in (await p.entries()).items}
        st = PageState(
            entries,
            p.head.root,
            len(await p.heads()),
            len(await p.history(1_000_000)),
            p.pending_conflict,
        )
        if await DocumentStore.holds_documents(p):
            docs = await documents(p)
            st.docs = {}
            token: bytes | None = None
            while True:
                listed = await docs.list_documents(COLLECTION, limit=1000, token=token)
                for d in listed.items:
                    kept = await docs.conflicts(COLLECTION, d.id)
                    st.docs[d.id] = (d.rev, d.data, tuple((c.rev, c.data) for c in kept))
                if (token := listed.token) is None:
                    break
            if any(i.name == INDEX for i in await docs.indexes(COLLECTION)):
                st.index = {}
                for tag in tags:
                    ids: list[str] = []
                    token = None
                    while True:
                        got = await docs.query(COLLECTION, INDEX, tag, limit=1000, token=token)
                        ids.extend(d.id for d in got.items)
                        if (token := got.token) is None:
                            break
                    st.index[tag] = ids
    return st


async def page_ids(repo: Repository) -> list[bytes]:
    return sorted(await repo.ledger(LEDGER).pages())


def held_packs(engine: SyncEngine) -> list[dict[str, Any]]:
    """Packs (or pages of packs) listed and not imported, with their state."""
    return list(engine.status()["packs"])


def gaps(engine: SyncEngine) -> list[dict[str, Any]]:
    return list(engine.status()["gaps"])


def device_name(engine: SyncEngine) -> str:
    return engine.device
