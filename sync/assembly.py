"""Building the sync engine's jobs from its settings.

This module owns :class:`Settings` (what :class:`~sync.engine.SyncEngine` is made
with, its documentation being the engine's) and :func:`build`, which makes the jobs
(:class:`Jobs`: the metered cloud store, the context, checkpoints, pending pages, the
feed, lazy fetches, compaction, the checkpoint policy, status, downloads and uploads)
and wires each to the others it needs. It runs nothing: rounds are
:mod:`sync.rounds`, their schedule :mod:`sync.polling`.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from ledgerd.sync import compaction, crypto
from ledgerd.sync.checkpoint_policy import CheckpointPolicy
from ledgerd.sync.checkpoints import Checkpoints
from ledgerd.sync.cloud import CloudStore
from ledgerd.sync.context import Key, SyncContext
from ledgerd.sync.download import Downloader
from ledgerd.sync.feed import Feed
from ledgerd.sync.fetch import LazyFetcher
from ledgerd.sync.metered import Metered
from ledgerd.sync.pending import Pending
from ledgerd.sync.status import StatusBoard
from ledgerd.sync.upload import Uploader


@dataclass(frozen=True)
class Settings:
    """The settings the jobs are made with (see :class:`~sync.engine.SyncEngine`)."""

    location: str
    keys: crypto.KeyRing | None
    clock: Callable[[], float]
    monotonic: Callable[[], float]
    wants: Callable[[bytes, bytes], bool] | None
    max_pack: int
    feed_window: float
    fetch_timeout: float
    retry_first: float
    retry_most: float
    clock_skew: float
    max_checkpoint: int
    checkpoint_interval: float
    compaction_grace: float
    compaction_settle: float | None
    """None: the feed window."""
    pending_slack_ms: int


@dataclass(frozen=True)
class Jobs:
    """The engine's jobs, each given the others it needs."""

    store: Metered
    ctx: SyncContext
    checkpoints: Checkpoints
    pending: Pending
    feed: Feed
    fetcher: LazyFetcher
    compactor: compaction.Compactor
    policy: CheckpointPolicy
    board: StatusBoard
    downloader: Downloader
    uploader: Uploader


def build(store: CloudStore, settings: Settings, changed: Callable[[Key], None]) -> Jobs:
    """The jobs that sync through ``store``; ``changed(key)``: the page has pending
    uploads again (a checkpoint's rejoin made some)."""
    s = settings
    metered = Metered(store)
    ctx = SyncContext(
        metered,
        location=s.location,
        keys=s.keys,
        clock=s.clock,
        wants=s.wants,
        monotonic=s.monotonic,
    )
    checkpoints = Checkpoints(metered, s.max_checkpoint, lambda: ctx.codec)
    pending = Pending(ctx, s.pending_slack_ms)
    feed = Feed(
        ctx,
        feed_window=s.feed_window,
        retry_first=s.retry_first,
        retry_most=s.retry_most,
        grace=s.compaction_grace,
    )
    fetcher = LazyFetcher(ctx, checkpoints, s.fetch_timeout)
    compactor = compaction.Compactor(
        metered,
        checkpoints,
        s.compaction_grace,
        ctx.seal,
        settle=s.feed_window if s.compaction_settle is None else s.compaction_settle,
        monotonic=ctx.monotonic,
    )
    policy = CheckpointPolicy(
        ctx,
        feed,
        checkpoints,
        interval=s.checkpoint_interval,
        grace=s.compaction_grace,
        changed=changed,
    )
    board = StatusBoard(ctx, feed, pending, checkpoints, compactor)
    downloader = _downloader(ctx, feed, board, checkpoints, policy, s)
    uploader = Uploader(ctx, feed, pending, board, checkpoints, policy, max_pack=s.max_pack)
    return Jobs(
        store=metered,
        ctx=ctx,
        checkpoints=checkpoints,
        pending=pending,
        feed=feed,
        fetcher=fetcher,
        compactor=compactor,
        policy=policy,
        board=board,
        downloader=downloader,
        uploader=uploader,
    )


def _downloader(
    ctx: SyncContext,
    feed: Feed,
    board: StatusBoard,
    checkpoints: Checkpoints,
    policy: CheckpointPolicy,
    s: Settings,
) -> Downloader:
    """The downloader, and the feed's and the policy's hooks into each other and it."""
    downloader = Downloader(
        ctx,
        feed,
        board,
        checkpoints,
        retry_first=s.retry_first,
        retry_most=s.retry_most,
        clock_skew=s.clock_skew,
        missed=policy.missed,
        rescue=policy.rescue,
    )
    policy.wake = downloader.wake
    feed.absent = policy.absent
    feed.restarter = policy
    return downloader
