"""What the bucket holds of one page, read for ``ledgerctl check`` (:mod:`sync.check`).

This module owns :class:`BucketIndex` (the feed listed once per check, each pack's
index read once) and :class:`CloudView`, filled by :func:`read_page` (a page's
sections: every one's EAGER pieces, which must verify; LAZY pieces read, and
verified, in this device's own packs and where wanted) and :func:`read_checkpoint`
(the page's best checkpoint, read whole in one ranged GET). A pack or checkpoint
deleted (by compaction) between the listing and its read is skipped without a word.
What a check makes of a view, and repairs, are :mod:`sync.check`'s.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field

from ledgerd.store.pieces import digest as dg
from ledgerd.sync import pack
from ledgerd.sync.checkpoints import Checkpoint, Checkpoints
from ledgerd.sync.cloud import CloudStore
from ledgerd.sync.crypto import Codec
from ledgerd.sync.errors import CloudError, CloudNotFoundError
from ledgerd.sync.fetch import Location
from ledgerd.sync.layout import PACKS, CheckpointName, PackName

Key = tuple[bytes, bytes]


class BucketIndex:
    """Every pack in the bucket, by page: one listing of ``packs/`` with each pack's
    header read once per check."""

    def __init__(self, store: CloudStore, codec: Codec | None = None) -> None:
        self.store = store
        self.codec = codec
        """The bucket's codec, if it is encrypted (:attr:`SyncEngine.codec`)."""
        self._sections: dict[Key, list[tuple[PackName, pack.PageIndex]]] | None = None
        self.problems: list[str] = []
        """Packs whose header could not be read."""
        self.notes: list[str] = []
        """Packs sealed with a key this device lacks (not damage)."""

    def forget(self) -> None:
        """List the bucket again at the next use (packs may have come since)."""
        self._sections = None
        self.problems = []

    async def sections(self, key: Key) -> list[tuple[PackName, pack.PageIndex]]:
        """The page's sections in the packs, oldest pack first."""
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


@dataclass
class CloudView:
    """What the bucket holds of one page."""

    packs: int = 0
    own_packs: int = 0
    pieces: set[bytes] = field(default_factory=set)
    uploaded: int = -1
    """How far this device's writes to the page are in the bucket (its clock)."""
    found: dict[bytes, bytes] = field(default_factory=dict)
    """Wanted pieces, verified."""
    problems: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    """What could not be read for want of a key this device lacks (not damage)."""
    checkpoint: str | None = None
    """The name of the page's checkpoint that was read, if any."""
    unread: bool = False
    """The page has checkpoints, and none could be read: what compaction removed cannot
    be told from what the bucket lost, so nothing is judged missing (or uploaded)."""

    def add_pack(
        self, own: bool, eager: dict[bytes, bytes], wanted: set[bytes], bad: list[str]
    ) -> None:
        """Count a section's EAGER pieces as in the bucket, keeping the wanted ones; what
        does not check out goes to ``bad``."""
        self.packs += 1
        self.own_packs += own
        for d, v in eager.items():
            if not dg.verify(d, v):
                bad.append(f"piece {dg.short(d)} does not match its digest")
                continue
            self.pieces.add(d)
            if d in wanted:
                self.found[d] = v


async def _read_sections(
    store: CloudStore,
    sections: list[tuple[PackName, pack.PageIndex]],
    device: str,
    wanted: set[bytes],
    view: CloudView,
    codec: Codec | None,
) -> None:
    """The page's sections: every one's EAGER pieces; LAZY pieces read (and verified)
    in this device's own packs and where wanted."""
    for pn, pi in sections:
        await _read_section(store, pn, pi, device, wanted, view, codec)
        if pn.device == device:
            view.uploaded = max(view.uploaded, pi.upto)


async def _read_section(
    store: CloudStore,
    pn: PackName,
    pi: pack.PageIndex,
    device: str,
    wanted: set[bytes],
    view: CloudView,
    codec: Codec | None,
) -> None:
    """One section of :func:`_read_sections`."""
    own = pn.device == device
    bad: list[str] = []
    try:
        stored = await store.get(pn.name, pi.eager.offset, pi.eager.stored)
        _, eager = pack.decode_section(stored, pi.eager, codec)
    except CloudNotFoundError:
        return  # compacted since the listing: a checkpoint holds it
    except (CloudError, pack.CorruptPackError) as e:
        _unreadable(f"pack {pn.name}", e, view.problems, view.notes)
        return
    view.add_pack(own, eager, wanted, bad)
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


async def read_page(
    store: CloudStore,
    device: str,
    want: Iterable[bytes],
    sections: Iterable[tuple[PackName, pack.PageIndex]] = (),
    codec: Codec | None = None,
) -> CloudView:
    """Read the page's sections (see the module docstring); keep the ``want`` pieces."""
    view = CloudView()
    await _read_sections(store, list(sections), device, set(want), view, codec)
    return view


async def read_checkpoint(
    checkpoints: Checkpoints,
    key: Key,
    want: Iterable[bytes],
    view: CloudView,
    codec: Codec | None = None,
    tag: bytes = b"",
) -> None:
    """Add the page's best checkpoint (the one compaction goes by, see
    :meth:`Checkpoints.best`) to ``view``: its pieces are in the bucket, the writes of
    this device (``tag``) its context holds are too, and wanted pieces it holds are
    ``found`` (a LAZY one with a ranged GET of it). Read after the packs, so that a
    pack compacted while they were read is covered by what is read here. Cost: one
    LIST of the page's checkpoints, the index of each of its newest few when it has
    several, one ranged GET of the chosen one."""
    wanted = set(want)
    chosen = await _best_checkpoint(checkpoints, key, view)
    if chosen is None:
        return
    cn, cp = chosen
    if cp.key != key:
        view.problems.append(f"checkpoint {cn.name}: it holds another page than its name says")
        return
    view.checkpoint = cn.name
    view.uploaded = max(view.uploaded, cp.ctx.get(tag, -1))
    for d, v in cp.eager.items():  # (their digests are computed from them)
        view.pieces.add(d)
        if d in wanted:
            view.found[d] = v
    for d, where in cp.lazy.items():
        view.pieces.add(d)
        if d not in wanted or d in view.found:
            continue
        await _read_lazy(checkpoints.store, cn, d, Location.parse(where), view, codec)


async def _best_checkpoint(
    checkpoints: Checkpoints, key: Key, view: CloudView
) -> tuple[CheckpointName, Checkpoint] | None:
    """The page's best checkpoint, read; None if it has none, or none that can be read
    (then ``view`` says why)."""
    for _ in range(2):  # the chosen one may be deleted under us: a newer one is there
        names = [cn async for cn in checkpoints.names(checkpoints.tag(key))]
        best = await checkpoints.best(names)
        if not best:
            if names:
                view.unread = True
                view.problems.append(f"none of the page's {len(names)} checkpoints can be read")
            return None
        cn = next(iter(best.values()))
        try:
            return cn, await checkpoints.read(cn)
        except CloudNotFoundError:
            continue
        except (CloudError, pack.CorruptPackError) as e:
            view.unread = True
            _unreadable(f"checkpoint {cn.name}", e, view.problems, view.notes)
            return None
    return None


async def _read_lazy(
    store: CloudStore,
    cn: CheckpointName,
    d: bytes,
    loc: Location,
    view: CloudView,
    codec: Codec | None,
) -> None:
    """A wanted LAZY piece of the checkpoint ``cn``, at ``loc``: ``found`` if it
    verifies, a problem (or a note) if it does not or cannot be read."""
    try:
        stored = await store.get(loc.name, loc.offset, loc.stored)
        if codec is not None:
            ident = loc.name.rsplit(".", 2)[0]
            piece = pack.open_piece(stored, codec, ident, d, loc.codec, loc.raw)
        else:
            piece = pack.unsqueeze(stored, loc.codec, loc.raw)
    except CloudNotFoundError:
        return
    except (CloudError, pack.CorruptPackError) as e:
        where = f"checkpoint {cn.name}: LAZY piece {dg.short(d)}"
        if isinstance(e, pack.PackKeyMissingError):
            _unreadable(where, e, view.problems, view.notes)
        else:
            view.problems.append(f"{where}: {e}")
        return
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
