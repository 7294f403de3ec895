"""The cloud side of ``ledgerctl check``: what the bucket holds of a page, and repairs.

This module owns checking a page against the bucket and repairing it from there:

* **What the bucket holds** (read by :mod:`sync.cloudview`). The feed is listed once per check
  (:class:`BucketIndex`) and each pack's index read once; a page's sections are then
  read one at a time: every one's EAGER pieces (they must verify), LAZY pieces read
  (and verified) in this device's own packs and where wanted. Then the page's best
  checkpoint (the one compaction goes by, :meth:`Checkpoints.best`) is read whole in
  one ranged GET: its pieces, EAGER and LAZY, are in the bucket too, and its context
  says how far each device's writes are in it. A pack deleted (by compaction)
  between the listing and its read is skipped without a word: the checkpoint, read
  after the packs, stands for it.
* **Checking** (``cloud``): every piece the page counts as synced and its state
  reaches (a value of one of its entries' versions) must be in a pack or in the
  checkpoint; and this device's writes that the page counts as uploaded must be in
  the bucket: the newest of its sections of the page (or the checkpoint's context)
  must reach them. Older pieces that are in no pack are what compaction removed on
  purpose.
* **Repairing** (``repair``, which reads the bucket as ``cloud`` does): corrupt or
  missing pieces are taken from the packs and the checkpoint (verified) and stored
  again; writes of this device the bucket lacks go back to pending and are uploaded
  by one upload round of the page; pieces the bucket lacks go up in a checkpoint of
  the page (it holds every piece its state reaches); what needs no cloud
  (:func:`ledgerd.store.page.check.repair_local`) is done too. The page is checked again
  after a repair.

The local check itself is :mod:`ledgerd.store.page.check`. Nothing here holds a lock of
the page: the page keeps serving, and so does every other page.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from ledgerd.store import Page
from ledgerd.store.errors import named
from ledgerd.store.page import check as ck
from ledgerd.store.page import exchange as ex
from ledgerd.store.pieces import digest as dg
from ledgerd.sync import layout
from ledgerd.sync.cloudview import BucketIndex, CloudView, read_checkpoint, read_page
from ledgerd.sync.errors import CloudError

if TYPE_CHECKING:
    from ledgerd.sync.engine import SyncEngine

log = logging.getLogger(__name__)

__all__ = [  # with what sync.cloudview reads, as callers import it from here
    "REPAIR_ROUNDS",
    "BucketIndex",
    "Checked",
    "CloudView",
    "check_page",
    "read_checkpoint",
    "read_page",
]

REPAIR_ROUNDS = 4
"""Checks of one page in a repair: each restored tree node may reveal more to restore."""


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
        await _check_cloud(page, engine, index, result, repair)
    if not repair:
        return result
    await ck.repair_local(page, report)
    await _repair(page, engine, index, result)
    unread = result.cloud is not None and result.cloud.unread
    if engine is not None and not unread and not report.open_problems(ck.NOT_IN_CLOUD):
        # Everything the page counts as synced is in packs that verify: a broken pack
        # left in the bucket no longer holds anything that is not elsewhere too.
        for p in report.open_problems(ck.CLOUD):
            p.repaired = True
    result.report = report
    return result


async def _check_cloud(
    page: Page, engine: SyncEngine, index: BucketIndex, result: Checked, repair: bool
) -> None:
    """The bucket's part of the check (:func:`_cloud`): a bucket that cannot be read
    is a problem of the page's report."""
    report = result.report
    try:
        result.cloud = await _cloud(page, engine, index, report, repair)
    except CloudError as e:
        report.add(ck.Problem(ck.CLOUD, f"the bucket could not be read: {e}"))
    else:
        result.notes.extend(dict.fromkeys([*index.notes, *result.cloud.notes]))


async def _repair(
    page: Page, engine: SyncEngine | None, index: BucketIndex | None, result: Checked
) -> None:
    """Restore from the bucket and check again, up to :data:`REPAIR_ROUNDS` times, while
    the page is not healthy and a restore changed something."""
    report = result.report
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


_CLOUD_CODES = (ck.CLOUD, ck.NOT_IN_CLOUD)


def _documents_only(report: ck.PageCheck) -> bool:
    """Whether every open problem is a document's (a record that does not decode, of
    pieces that are sound): the bucket has nothing to repair them with."""
    return not report.dropped and all(p.code in ck.DOCUMENT_CODES for p in report.open_problems())


async def _read_bucket(
    page: Page, engine: SyncEngine, index: BucketIndex, device: str, want: Iterable[bytes]
) -> CloudView:
    """The page's sections, then its checkpoint (see :func:`read_checkpoint`)."""
    key = (page.ledger, page.id)
    wanted = list(want)
    view = await read_page(engine.store, device, wanted, await index.sections(key), engine.codec)
    await read_checkpoint(engine.checkpoints, key, wanted, view, engine.codec, page.graph.tag)
    return view


async def _cloud(
    page: Page, engine: SyncEngine, index: BucketIndex, report: ck.PageCheck, repair: bool
) -> CloudView:
    """Read the page's packs and checkpoint; report what the page counts as synced
    and the bucket should hold but does not (the rule is in the module docstring)."""
    view = await _read_bucket(page, engine, index, engine.device, report.bad_pieces())
    needed = {  # (value pieces: tree nodes never leave the device)
        d
        for d in set(await ck.synced_pieces(page)) & await ck.reachable(page, [page.head.root])
        if dg.kind_of(d) is dg.Kind.VALUE
    }
    uploaded = await ex.uploaded_upto(page)
    if any(d not in view.pieces for d in needed) or view.uploaded < uploaded:
        # The listing was made at the check's first page: a pack put since (sync goes
        # on while a check runs) is not in it. List again before blaming the bucket.
        index.forget()
        view = await _read_bucket(page, engine, index, engine.device, report.bad_pieces())
    for problem in [*index.problems, *view.problems]:
        report.add(ck.Problem(ck.CLOUD, problem))
    if view.unread:  # (a repair would upload the whole compacted history again)
        return view
    for d in sorted(needed - view.pieces):
        report.add(
            ck.Problem(
                ck.NOT_IN_CLOUD, f"piece {dg.short(d)} counts as synced but the bucket lacks it", d
            )
        )
    if view.uploaded < uploaded:
        report.add(
            ck.Problem(
                ck.NOT_IN_CLOUD,
                f"this device's writes up to {ex.format_time(uploaded)} count as uploaded, "
                f"but the bucket holds them up to {ex.format_time(view.uploaded)}",
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
    if any(dg.kind_of(d) is dg.Kind.TREE for d in bad):
        return await _rebuild_tree(page, engine, report, result, bad)
    if bad:
        changed, left = await _restore_pieces(page, engine, index, report, result, bad)
        unfit.update(left)
    lacking = [p for p in report.open_problems(ck.NOT_IN_CLOUD) if p.digest not in unfit]
    if lacking and await _upload_lacking(page, engine, result, lacking):
        changed = True
    return changed


async def _rebuild_tree(
    page: Page, engine: SyncEngine, report: ck.PageCheck, result: Checked, bad: list[bytes]
) -> bool:
    """The bucket holds entries, not this device's tree: a damaged tree is rebuilt
    from the bucket whole (the page's best checkpoint and the packs above it). True if
    anything changed."""
    if await ex.has_unuploaded(page):
        result.notes.append(
            "the page's tree is damaged and it holds writes of this device not uploaded "
            "yet: rebuilding it from the bucket would lose them (nothing was changed)"
        )
        return False
    dropped = await ck.drop_pieces(page, bad)  # (with the deltas made against them)
    await ex.forget(page)
    if not await engine.downloader.restore(page):
        result.notes.append("the page's tree is damaged and the bucket holds nothing of it")
        return True
    pruned = await ck.prune_lost_history(page, {*bad, *dropped})  # (trees the bucket lacks)
    if pruned:
        result.notes.append(
            f"{pruned} older commits of the page could not be rebuilt from the bucket "
            "(it holds their writes in later states): their history was pruned"
        )
    for p in report.open_problems(ck.CORRUPT_PIECE, ck.MISSING_PIECE):
        p.repaired = True
    log.info("rebuilt the damaged tree of page %s from the bucket", named(page.id))
    return True


async def _restore_pieces(
    page: Page,
    engine: SyncEngine,
    index: BucketIndex,
    report: ck.PageCheck,
    result: Checked,
    bad: list[bytes],
) -> tuple[bool, list[bytes]]:
    """Store again the ``bad`` pieces the bucket holds (verified). Whether any was,
    and the ones it does not hold."""
    changed = False
    found = {d: v for d, v in (result.cloud.found if result.cloud else {}).items() if d in bad}
    if len(found) < len(bad):  # (the first read of the bucket kept what was bad then)
        found.update((await _read_bucket(page, engine, index, "", bad)).found)
    restored = set(await ck.restore_pieces(page, found))
    for p in report.open_problems(ck.CORRUPT_PIECE, ck.MISSING_PIECE):
        if p.digest in restored:
            p.repaired = True
            changed = True
    left = [d for d in bad if d not in restored]
    if left:
        result.notes.append(
            f"{len(left)} pieces are in no pack of the bucket (first: {dg.short(left[0])})"
        )
    return changed, left


async def _upload_lacking(
    page: Page, engine: SyncEngine, result: Checked, lacking: list[ck.Problem]
) -> bool:
    """Upload what the bucket lacks of the page: this device's writes (one upload round
    of the page) and pieces (in a checkpoint, which holds every one). True if it went
    up (its problems are then repaired)."""
    key = (page.ledger, page.id)
    writes = [p for p in lacking if p.digest is None]
    pieces = [p for p in lacking if p.digest is not None]
    try:
        if writes:  # this device's writes the bucket lacks: uploaded again
            view = result.cloud
            await ck.requeue(page, [], view.uploaded if view is not None else -1)
            engine.requeued(key)
            await engine.round(download=False, only=key)
            error = engine.upload_error(key)
            if error is not None:
                raise CloudError(error)
        # Pieces the bucket lacks: a checkpoint holds every one.
        if pieces and not await engine.policy.write_for_compaction(key):
            raise CloudError("no checkpoint of the page could be written")
    except (CloudError, OSError) as e:
        result.notes.append(f"the upload of what the bucket lacks failed: {e}")
        return False
    except asyncio.CancelledError:
        raise
    for p in lacking:
        p.repaired = True
    log.info("uploaded again what the bucket lacked of page %s", named(page.id))
    return True


def _problem_json(p: ck.Problem) -> dict[str, Any]:
    doc = p.json()
    doc["key"] = None if p.key is None else layout.b64(p.key)
    doc["key_text"] = None if p.key is None else layout.text_or_none(p.key)
    return doc
