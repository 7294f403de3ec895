"""The cloud side of ``ledgerctl check``: what the bucket holds of a page, and repairs.

This module owns checking a page against the bucket and repairing it from there:

* **What the bucket holds.** Every device's log is listed once per check
  (:class:`BucketIndex`); a page's packs are then read one at a time: this
  device's packs whole (they must parse, and every commit and piece in them must
  verify), other devices' packs by their prefix (header, commits, EAGER pieces),
  which names their LAZY pieces too. Then the page's best checkpoint (the one
  compaction goes by, :meth:`Checkpoints.best`) is read whole in one ranged GET:
  its commits and pieces, EAGER and LAZY, are in the bucket too. A pack deleted
  (by compaction) between the listing and its read is skipped without a word: the
  checkpoint, read after the packs, stands for it. So a check costs a GET per pack
  of the page, a LIST and a GET for its checkpoint (and the index of each of its
  newest few when it has several), and holds one pack or checkpoint in memory at
  a time.
* **Checking** (``cloud``): compaction deletes packs whose commits all lie below a
  checkpoint's commits, so not all history the page counts as synced is in a pack.
  The rule: every commit the page counts as synced must be in a pack or in the
  checkpoint, unless it is one of the checkpoint's commits or their ancestors (as
  far as the page's own commits and those read from the bucket tell), or no head
  reaches it (a device back after the grace keeps old commits whose links to the
  checkpoint's head were compacted away); every piece
  the page counts as synced must be in a pack or in the checkpoint, unless no head
  and no commit above the checkpoint (not one of those ancestors) reaches it. So
  what the heads reach and what is newer than the checkpoint must be in the
  bucket; older history that is in no pack is what compaction removed on purpose.
  Nor does the bucket need a commit no head reaches: what a rejoin left behind
  (:func:`store.sql.leave_behind`, never to be uploaded), or old commits whose links
  to the checkpoint's head were compacted away. A page without a checkpoint keeps the
  plain rule: everything synced is in a pack.
* **Repairing** (``repair``, which reads the bucket as ``cloud`` does): corrupt or
  missing pieces are taken from the packs and the checkpoint (verified) and stored
  again; pieces and commits the bucket lacks go back to pending and are uploaded
  by one upload round of the page (not a piece still damaged here); what needs no
  cloud (:func:`ledgerd.store.check.repair_local`) is done too. The page is checked
  again after a repair (a restored tree node opens a subtree that was not walked).

The local check itself is :mod:`ledgerd.store.check`. Nothing here holds a lock of
the page: the page keeps serving, and so does every other page.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from ledgerd.store import Page
from ledgerd.store import check as ck
from ledgerd.store import digest as dg
from ledgerd.store import exchange as ex
from ledgerd.store.errors import named
from ledgerd.sync import layout, pack
from ledgerd.sync.checkpoints import Checkpoints
from ledgerd.sync.cloud import CloudStore
from ledgerd.sync.crypto import Codec
from ledgerd.sync.errors import CloudError, CloudNotFoundError
from ledgerd.sync.fetch import Location
from ledgerd.sync.layout import PACKS, LogName, PackName

if TYPE_CHECKING:
    from ledgerd.sync.engine import SyncEngine

log = logging.getLogger(__name__)

Key = tuple[bytes, bytes]

REPAIR_ROUNDS = 4
"""Checks of one page in a repair: each restored tree node may reveal more to restore."""


class BucketIndex:
    """Every pack in the bucket, by page: one listing of ``log/`` (layout 1) and one
    of ``packs/`` with each pack's header read once (layout 2) per check."""

    def __init__(self, store: CloudStore, codec: Codec | None = None) -> None:
        self.store = store
        self.codec = codec
        """The bucket's codec, if it is encrypted (:attr:`SyncEngine.codec`)."""
        self._packs: dict[Key, list[LogName]] | None = None
        self._sections: dict[Key, list[tuple[PackName, pack.PageIndex]]] | None = None
        self.problems: list[str] = []
        """Packs of layout 2 whose header could not be read."""
        self.notes: list[str] = []
        """Packs of layout 2 sealed with a key this device lacks (not damage)."""

    def forget(self) -> None:
        """List the bucket again at the next use (packs may have come since)."""
        self._packs = self._sections = None
        self.problems = []

    async def sections(self, key: Key) -> list[tuple[PackName, pack.PageIndex]]:
        """The page's sections in the layout-2 packs, oldest pack first."""
        if self._sections is None:
            found: dict[Key, list[tuple[PackName, pack.PageIndex]]] = {}
            async for name in self.store.list(PACKS):
                pn = PackName.parse(name)
                if pn is None:
                    continue
                try:
                    pack.check_head_end(pn.head_end)
                    head = await self.store.get(pn.name, 0, pn.head_end)
                    seal = (self.codec, pn.ident) if self.codec is not None else None
                    header = pack.decode_header(head, pn.head_end, pn.eager_end, seal)
                except CloudNotFoundError:
                    continue  # compacted since the listing: a checkpoint holds it
                except (CloudError, pack.CorruptPackError) as e:
                    _unreadable(f"pack {pn.name}", e, self.problems, self.notes)
                    continue
                for pi in header.pages:
                    found.setdefault(pi.key, []).append((pn, pi))
            self._sections = found
        return sorted(self._sections.get(key, []), key=lambda x: (x[0].device, x[0].seq))

    async def packs(self, key: Key) -> list[LogName]:
        if self._packs is None:
            packs: dict[Key, list[LogName]] = {}
            async for name in self.store.list("log/"):
                ln = LogName.parse(name)
                if ln is not None:
                    packs.setdefault(ln.key, []).append(ln)
            self._packs = packs
        return sorted(self._packs.get(key, []), key=lambda x: (x.device, x.seq))


@dataclass
class CloudView:
    """What the bucket holds of one page."""

    packs: int = 0
    own_packs: int = 0
    pieces: set[bytes] = field(default_factory=set)
    commits: set[bytes] = field(default_factory=set)
    parents: dict[bytes, tuple[bytes, ...]] = field(default_factory=dict)
    """Each commit read, with its parents (to tell what lies below a checkpoint)."""
    found: dict[bytes, bytes] = field(default_factory=dict)
    """Wanted pieces, verified."""
    problems: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    """What could not be read for want of a key this device lacks (not damage)."""
    checkpoint: str | None = None
    """The name of the page's checkpoint that was read, if any."""
    covered: list[bytes] = field(default_factory=list)
    """That checkpoint's commits: their history may be in no pack (compacted)."""
    unread: bool = False
    """The page has checkpoints, and none could be read: what compaction removed cannot
    be told from what the bucket lost, so nothing is judged missing (or uploaded)."""

    def add_commits(self, datas: Iterable[bytes]) -> bool:
        """Count these commit encodings as in the bucket; False if one does not decode."""
        parents, bad = ck.commit_parents(datas)
        self.commits.update(parents)
        self.parents.update(parents)
        return not bad

    def add_pack(
        self,
        own: bool,
        commits: Iterable[bytes],
        eager: dict[bytes, bytes],
        wanted: set[bytes],
        bad: list[str],
    ) -> dict[bytes, bytes]:
        """Count a pack's (or section's) commits and EAGER pieces as in the bucket,
        keeping the wanted ones; what does not check out goes to ``bad``. Returns the
        pieces that match their digests."""
        good: dict[bytes, bytes] = {}
        self.packs += 1
        self.own_packs += own
        if not self.add_commits(commits):
            bad.append("a commit does not decode")
        for d, v in eager.items():
            if not dg.verify(d, v):
                bad.append(f"piece {dg.short(d)} does not match its digest")
                continue
            self.pieces.add(d)
            good[d] = v
            if d in wanted:
                self.found[d] = v
        return good


async def _read_sections(
    store: CloudStore,
    sections: list[tuple[PackName, pack.PageIndex]],
    device: str,
    wanted: set[bytes],
    view: CloudView,
    codec: Codec | None,
    page: Page | None,
) -> None:
    """The page's sections in layout-2 packs: every one's commits and EAGER pieces;
    LAZY pieces read (and verified) in this device's own packs and where wanted.

    An edited section is read over its bases: tree nodes stored here or, once history
    retention pruned them here, met in the page's other sections (read first, in as
    many passes as it takes); one whose bases are in neither is passed over. Before,
    every edited section older than the retention was passed over, and what it held
    was reported as synced here but lacking in the bucket."""
    need = {d for _, pi in sections for d in pi.bases}
    met: dict[bytes, bytes] = {}  # bases met in sections read
    todo = [(pn, pi) for pn, pi in sections if not (pi.bases and page is None)]
    while todo:  # (an edit of tree nodes is read only next to the page)
        waiting = []
        for pn, pi in todo:
            try:
                bases = await ex.local_nodes(page, pi.bases, met) if page is not None else b""
            except ex.MissingObjectError:
                waiting.append((pn, pi))
                continue
            eager = await _read_section(store, pn, pi, bases, device, wanted, view, codec)
            met.update((d, v) for d, v in eager.items() if d in need)
        if len(waiting) == len(todo):
            break  # edits of nodes neither here nor in the bucket: nothing to read them with
        todo = waiting


async def _read_section(
    store: CloudStore,
    pn: PackName,
    pi: pack.PageIndex,
    bases: bytes,
    device: str,
    wanted: set[bytes],
    view: CloudView,
    codec: Codec | None,
) -> dict[bytes, bytes]:
    """One section of :func:`_read_sections`, read over ``bases``; its EAGER pieces."""
    own = pn.device == device
    bad: list[str] = []
    try:
        stored = await store.get(pn.name, pi.eager.offset, pi.eager.stored)
        commits, eager = pack.decode_section(stored, pi.eager, codec, bases)
    except CloudNotFoundError:
        return {}  # compacted since the listing: a checkpoint holds it
    except (CloudError, pack.CorruptPackError) as e:
        _unreadable(f"pack {pn.name}", e, view.problems, view.notes)
        return {}
    good = view.add_pack(own, commits, eager, wanted, bad)
    for d, part in pi.lazy:
        view.pieces.add(d)
        if not (own or (d in wanted and d not in view.found)):
            continue
        try:
            plain = pack.unseal(await store.get(pn.name, part.offset, part.stored), part, codec)
            raw = pack.unsqueeze(plain, part.codec, part.raw if part.codec else len(plain))
        except CloudNotFoundError:
            view.pieces.discard(d)  # compacted since the listing
            continue
        except (CloudError, pack.CorruptPackError) as e:
            view.pieces.discard(d)
            if isinstance(e, pack.PackKeyMissingError):
                _unreadable(f"pack {pn.name}: LAZY piece {dg.short(d)}", e, [], view.notes)
            else:
                bad.append(f"LAZY piece {dg.short(d)}: {e}")
            continue
        if not dg.verify(d, raw):
            bad.append(f"LAZY piece {dg.short(d)} does not match its digest")
            view.pieces.discard(d)
            continue
        if d in wanted:
            view.found[d] = raw
    if bad:
        view.problems.append(f"pack {pn.name}: " + "; ".join(bad[:5]))
    return good


async def read_page(
    store: CloudStore,
    packs: list[LogName],
    device: str,
    want: Iterable[bytes],
    sections: Iterable[tuple[PackName, pack.PageIndex]] = (),
    codec: Codec | None = None,
    page: Page | None = None,
) -> CloudView:
    """Read the page's packs (see the module docstring); keep the ``want`` pieces.
    ``page``: the local page, whose tree nodes edited sections are read over."""
    wanted = set(want)
    view = CloudView()
    await _read_sections(store, list(sections), device, wanted, view, codec, page)
    lazy_at: dict[bytes, tuple[str, int, int]] = {}
    for ln in packs:
        own = ln.device == device
        try:
            data = await store.get(ln.name) if own else await store.get(ln.name, 0, ln.eager_end)
            p = pack.decode_prefix(data[: ln.eager_end], ln.eager_end)
            if (p.ledger, p.page, p.seq, p.device.hex()) != (ln.ledger, ln.page, ln.seq, ln.device):
                raise pack.CorruptPackError("pack does not match its name")
        except CloudNotFoundError:
            continue  # gone since the listing
        except (CloudError, pack.CorruptPackError) as e:
            _unreadable(f"pack {ln.name}", e, view.problems, view.notes)
            continue
        bad: list[str] = []
        view.add_pack(own, p.commits, p.eager, wanted, bad)
        for d, off, n in p.lazy:
            if own:
                piece = data[off : off + n]
                if len(piece) != n or not dg.verify(d, piece):
                    bad.append(f"LAZY piece {dg.short(d)} does not match its digest")
                    continue
                if d in wanted:
                    view.found[d] = piece
            elif d in wanted and d not in view.found:
                lazy_at.setdefault(d, (ln.name, off, n))
            view.pieces.add(d)
        if bad:
            view.problems.append(f"pack {ln.name}: " + "; ".join(bad[:5]))
        del data, p
    for d, (name, off, n) in lazy_at.items():
        if d in view.found:
            continue
        try:
            piece = await store.get(name, off, n)
        except CloudNotFoundError:
            view.pieces.discard(d)
            continue
        except CloudError as e:
            view.problems.append(f"pack {name}: {type(e).__name__}: {e}")
            continue
        if dg.verify(d, piece):
            view.found[d] = piece
        else:
            view.problems.append(f"pack {name}: LAZY piece {dg.short(d)} does not match its digest")
    return view


async def read_checkpoint(
    checkpoints: Checkpoints,
    key: Key,
    want: Iterable[bytes],
    view: CloudView,
    codec: Codec | None = None,
) -> None:
    """Add the page's best checkpoint (the one compaction goes by, see
    :meth:`Checkpoints.best`) to ``view``: its commits and pieces are in the bucket,
    its commits are ``covered``, and wanted pieces it holds are ``found`` (a LAZY one
    with a ranged GET of it). Read after the packs, so that a pack compacted while
    they were read is covered by what is read here. Cost: one LIST of the page's
    checkpoints, the index of each of its newest few when it has several, one ranged
    GET of the chosen one."""
    wanted = set(want)
    for _ in range(2):  # the chosen one may be deleted under us: a newer one is there
        names = [cn async for cn in checkpoints.names(checkpoints.tag(key))]
        best = await checkpoints.best(names)
        if not best:
            if names:
                view.unread = True
                view.problems.append(f"none of the page's {len(names)} checkpoints can be read")
            return
        cn = next(iter(best.values()))
        try:
            cp = await checkpoints.read(cn)
        except CloudNotFoundError:
            continue
        except (CloudError, pack.CorruptPackError) as e:
            view.unread = True
            _unreadable(f"checkpoint {cn.name}", e, view.problems, view.notes)
            return
        break
    else:
        return
    if cp.key != key:
        view.problems.append(f"checkpoint {cn.name}: it holds another page than its name says")
        return
    if not view.add_commits(cp.commits):
        view.problems.append(f"checkpoint {cn.name}: a commit does not decode")
    view.checkpoint = cn.name
    view.covered = ck.commit_ids(cp.commits)
    for d, v in cp.eager.items():  # (their digests are computed from them)
        view.pieces.add(d)
        if d in wanted:
            view.found[d] = v
    for d, where in cp.lazy.items():
        view.pieces.add(d)
        if d not in wanted or d in view.found:
            continue
        loc = Location.parse(where)
        try:
            stored = await checkpoints.store.get(loc.name, loc.offset, loc.stored)
            if codec is not None:
                ident = loc.name.rsplit(".", 2)[0]
                piece = pack.open_piece(stored, codec, ident, d, loc.codec, loc.raw)
            else:
                piece = pack.unsqueeze(stored, loc.codec, loc.raw)
        except CloudNotFoundError:
            continue
        except (CloudError, pack.CorruptPackError) as e:
            where = f"checkpoint {cn.name}: LAZY piece {dg.short(d)}"
            if isinstance(e, pack.PackKeyMissingError):
                _unreadable(where, e, view.problems, view.notes)
            else:
                view.problems.append(f"{where}: {e}")
            continue
        if dg.verify(d, piece):
            view.found[d] = piece
        else:
            view.problems.append(
                f"checkpoint {cn.name}: LAZY piece {dg.short(d)} does not match its digest"
            )


def _unreadable(where: str, e: Exception, problems: list[str], notes: list[str]) -> None:
    """Record what could not be read: a problem, unless it is sealed with a key this
    device lacks (``key_missing``, as sync holds such a pack): not damage, a note."""
    if isinstance(e, pack.PackKeyMissingError):
        notes.append(
            f"{where}: not checked, key_missing (sealed with a key this device lacks): "
            f"{type(e).__name__}: {e}"
        )
    else:
        problems.append(f"{where}: {type(e).__name__}: {e}")


def below(tops: Iterable[bytes], parents: dict[bytes, Any]) -> set[bytes]:
    """``tops`` and every commit they descend from, as far as ``parents`` knows."""
    out: set[bytes] = set()
    todo = list(tops)
    while todo:
        c = todo.pop()
        if c in out:
            continue
        out.add(c)
        todo.extend(parents.get(c, ()))
    return out


@dataclass
class Checked:
    """One page's result: the local report and, when the bucket was read, its view."""

    report: ck.PageCheck
    cloud: CloudView | None = None
    notes: list[str] = field(default_factory=list)

    def json(self) -> dict[str, Any]:
        r = self.report
        return {
            "ledger": layout.b64(r.ledger),
            "page": layout.b64(r.page),
            "ledger_text": layout.text_or_none(r.ledger),
            "page_text": layout.text_or_none(r.page),
            "healthy": r.healthy,
            "commits": r.commits,
            "stored_pieces": r.stored,
            "reachable_pieces": r.reachable,
            "remote_pieces": r.remote,
            "documents": r.documents,
            "problems": [_problem_json(p) for p in r.problems],
            "more_problems": r.dropped,
            "cloud": None
            if self.cloud is None
            else {"packs": self.cloud.packs, "own_packs": self.cloud.own_packs},
            "notes": self.notes,
        }


async def check_page(
    page: Page,
    engine: SyncEngine | None,
    index: BucketIndex | None,
    *,
    cloud: bool = False,
    repair: bool = False,
) -> Checked:
    """Check one page (open and leased by the caller); with ``cloud`` against the
    bucket too; with ``repair`` fix what can be fixed (see the module docstring)."""
    report = await ck.check_quietly(page)
    result = Checked(report)
    use_cloud = (cloud or repair) and engine is not None
    if (cloud or repair) and engine is None:
        result.notes.append("cloud sync is off: nothing was checked or fetched in a bucket")
    if use_cloud and engine is not None and index is not None:
        try:
            result.cloud = await _cloud(page, engine, index, report, repair)
        except CloudError as e:
            report.add(ck.Problem(ck.CLOUD, f"the bucket could not be read: {e}"))
        else:
            result.notes.extend(dict.fromkeys([*index.notes, *result.cloud.notes]))
    if not repair:
        return result
    await ck.repair_local(page, report)
    for _ in range(REPAIR_ROUNDS):
        if report.healthy or engine is None or index is None or _documents_only(report):
            break
        try:
            fixed = await _restore(page, engine, index, report, result)
        except CloudError as e:
            result.notes.append(f"the bucket could not be read: {e}")
            break
        again = await ck.check_quietly(page)
        # Keep the record of what was repaired and of the bucket's problems (a local
        # check does not see them); the rest is what the new check finds.
        done = [p for p in report.problems if p.repaired or p.code in _CLOUD_CODES]
        await ck.repair_local(page, again)
        report.problems = done + again.problems
        report.dropped = again.dropped
        report.commits, report.stored = again.commits, again.stored
        report.reachable, report.remote = again.reachable, again.remote
        report.documents = again.documents
        if not fixed:
            break
    unread = result.cloud is not None and result.cloud.unread
    if engine is not None and not unread and not report.open_problems(ck.NOT_IN_CLOUD):
        # Everything the page counts as synced is in packs that verify: a broken pack
        # left in the bucket no longer holds anything that is not elsewhere too.
        for p in report.open_problems(ck.CLOUD):
            p.repaired = True
    result.report = report
    return result


_CLOUD_CODES = (ck.CLOUD, ck.NOT_IN_CLOUD)


def _documents_only(report: ck.PageCheck) -> bool:
    """Whether every open problem is a document's (a record that does not decode, of
    pieces that are sound): the bucket has nothing to repair them with."""
    return not report.dropped and all(p.code in ck.DOCUMENT_CODES for p in report.open_problems())


async def _read_bucket(
    page: Page, engine: SyncEngine, index: BucketIndex, device: str, want: Iterable[bytes]
) -> CloudView:
    """The page's packs, then its checkpoint (see :func:`read_checkpoint`)."""
    key = (page.ledger, page.id)
    wanted = list(want)
    view = await read_page(
        engine.store,
        await index.packs(key),
        device,
        wanted,
        await index.sections(key),
        engine.codec,
        page,
    )
    await read_checkpoint(engine.checkpoints, key, wanted, view, engine.codec)
    return view


async def _cloud(
    page: Page, engine: SyncEngine, index: BucketIndex, report: ck.PageCheck, repair: bool
) -> CloudView:
    """Read the page's packs and checkpoint; report what the page counts as synced
    and the bucket should hold but does not (the rule is in the module docstring)."""
    view = await _read_bucket(page, engine, index, engine.device, report.bad_pieces())
    synced = await ck.synced_pieces(page)
    if any(d not in view.pieces for d in synced) or any(
        c not in view.commits for c in await ck.synced_commits(page)
    ):
        # The listing was made at the check's first page: a pack imported since (sync
        # goes on while a check runs) is not in it. List again before blaming the bucket.
        index.forget()
        view = await _read_bucket(page, engine, index, engine.device, report.bad_pieces())
    for problem in [*index.problems, *view.problems]:
        report.add(ck.Problem(ck.CLOUD, problem))
    if view.unread:  # (a repair would upload the whole compacted history again)
        return view
    lacking = [d for d in synced if d not in view.pieces]
    missing = [c for c in await ck.synced_commits(page) if c not in view.commits]
    left = await ck.left_behind(page)
    if (view.covered or left) and (lacking or missing):
        parents, roots, heads = await ck.history(page)
        graph = {**view.parents, **parents}
        # Not needed in the bucket: history below the checkpoint (compacted), and the
        # commits no head reaches: what a rejoin left behind (never to be uploaded), and
        # old commits whose children up to the checkpoint's head were compacted away
        # everywhere (a device back after the grace holds such).
        live = below(heads, parents)
        skip = below(view.covered, graph) | {c for c in {*parents, *roots} if c not in live}
        missing = [c for c in missing if c not in skip]
        if lacking:
            needed = await ck.reachable(
                page, [r for c, r in roots.items() if c not in skip or c in heads]
            )
            lacking = [d for d in lacking if d in needed]
    for d in lacking:
        report.add(
            ck.Problem(
                ck.NOT_IN_CLOUD, f"piece {dg.short(d)} counts as synced but the bucket lacks it", d
            )
        )
    for c in missing:
        report.add(
            ck.Problem(
                ck.NOT_IN_CLOUD,
                f"commit {c.hex()[:12]} counts as synced but the bucket lacks it",
                commit=c,
            )
        )
    return view


async def _restore(
    page: Page, engine: SyncEngine, index: BucketIndex, report: ck.PageCheck, result: Checked
) -> bool:
    """Bring back bad pieces from the bucket and upload what it lacks. True if
    anything changed."""
    changed = False
    unfit: set[bytes] = set()  # damaged here and not restored: nothing to upload
    bad = report.bad_pieces()
    if bad:
        found = {d: v for d, v in (result.cloud.found if result.cloud else {}).items() if d in bad}
        if len(found) < len(bad):  # (the first read of the bucket kept what was bad then)
            found.update((await _read_bucket(page, engine, index, "", bad)).found)
        restored = set(await ck.restore_pieces(page, found))
        for p in report.open_problems(ck.CORRUPT_PIECE, ck.MISSING_PIECE):
            if p.digest in restored:
                p.repaired = True
                changed = True
        left = [d for d in bad if d not in restored]
        unfit.update(left)
        if left:
            result.notes.append(
                f"{len(left)} pieces are in no pack of the bucket (first: {dg.short(left[0])})"
            )
    lacking = [p for p in report.open_problems(ck.NOT_IN_CLOUD) if p.digest not in unfit]
    if lacking:
        requeued = set(
            await ck.requeue(
                page,
                [p.digest for p in lacking if p.digest is not None],
                [p.commit for p in lacking if p.commit is not None],
            )
        )
        engine.requeued((page.ledger, page.id))
        try:
            await engine.round(download=False, only=(page.ledger, page.id))
        except (CloudError, OSError) as e:
            result.notes.append(f"the upload of what the bucket lacks failed: {e}")
        except asyncio.CancelledError:
            raise
        else:
            error = engine.upload_error((page.ledger, page.id))
            if error is not None:
                result.notes.append(f"the upload of what the bucket lacks failed: {error}")
            else:
                for p in lacking:
                    if (p.digest or p.commit) in requeued:
                        p.repaired = changed = True
                log.info(
                    "re-uploaded %d pieces and commits of page %s", len(requeued), named(page.id)
                )
    return changed


def _problem_json(p: ck.Problem) -> dict[str, Any]:
    doc = p.json()
    doc["key"] = None if p.key is None else layout.b64(p.key)
    doc["key_text"] = None if p.key is None else layout.text_or_none(p.key)
    return doc
