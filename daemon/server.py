"""The ledgerd process: start-up, serving, and an orderly shutdown.

This module owns the daemon's lifecycle. Every part is built inside one
``contextlib.AsyncExitStack`` so that shutdown runs in reverse order of
start-up: stop listening and remove the socket, drain requests and sessions,
flush pages, close the repository.

SIGTERM and SIGINT stop accepting new requests (503 ``shutting_down``), end the
sync rounds in flight (a ``POST /v1/sync`` answers 503 ``shutting_down``), let
in-flight requests finish (aiohttp's own graceful shutdown, with the WebSocket
sessions ended in its ``on_shutdown``) and cancel those still running at
``shutdown_timeout`` (aborting the connections still open then: a client that reads
none of its answer holds no stop), commit every acknowledged write, make one last upload round
with what is left of the bound, and exit 0. The whole stop takes at most
``shutdown_timeout`` plus :data:`STOP_MARGIN` and :data:`FINAL_UPLOAD_LEAST`, however
the cloud behaves: nothing waits for a cloud call that hangs (see :mod:`sync.s3`).
Background work (closing idle pages, the systemd watchdog) runs in a task group
that shutdown awaits.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import resource
import signal
import socket
import sqlite3
import stat
import sys
from collections.abc import Awaitable, Callable, Coroutine
from pathlib import Path
from typing import Any

from aiohttp import web

from ledgerd.daemon import systemd
from ledgerd.daemon.api import VERSION, Api, DaemonState
from ledgerd.daemon.collector import collect_in_background
from ledgerd.daemon.config import Config, ConfigError, key_ring, log_level, metrics_address
from ledgerd.daemon.metrics import Metrics, scraper_app
from ledgerd.daemon.protocol import ApiRunner, Limits
from ledgerd.daemon.routes import ROUTER
from ledgerd.daemon.session import Resolvers, Sessions
from ledgerd.daemon.socketdir import socket_dir_problem
from ledgerd.store import (
    PageHooks,
    Repository,
    RepositoryLockedError,
    StoreError,
    set_sqlite_threads,
)
from ledgerd.store.errors import named
from ledgerd.sync.engine import SyncEngine
from ledgerd.sync.url import open_store

log = logging.getLogger("ledgerd")

STOP_MARGIN = 2.0
"""Seconds a stop waits, past ``shutdown_timeout``, for cancelled work to end (sync
rounds, requests): cancelling it ends it at once unless it is inside a local step."""
FINAL_UPLOAD = 5.0
"""Seconds at most for the last upload round at stop (the rest goes up next start)."""
FINAL_UPLOAD_LEAST = 1.0
"""Seconds the last upload round gets even when requests used all of ``shutdown_timeout``."""


def setup_logging(cfg: Config) -> None:
    if os.environ.get("JOURNAL_STREAM"):
        fmt = "%(levelname)s %(name)s: %(message)s"  # journald adds time and pid
    else:  # a terminal, a file, a pipe: lines carry their time
        fmt = "%(asctime)s %(levelname)s %(name)s: %(message)s"
    logging.basicConfig(level=log_level(cfg), format=fmt, stream=sys.stderr, force=True)
    logging.getLogger("aiohttp.access").setLevel(logging.WARNING)


def _check_socket_path(path: Path) -> None:
    """Refuse, before anything is created, a socket that another daemon listens on, a
    path that is not a socket, or a directory that others could replace it in."""
    if not path.parent.is_dir() and not path.parent.parent.is_dir():
        raise ConfigError(f"socket: directory {path.parent.parent} does not exist")
    if problem := socket_dir_problem(path, owner=os.geteuid()):
        raise ConfigError(f"socket: {problem}")
    try:
        st = path.lstat()
    except FileNotFoundError:
        return
    except OSError as e:
        raise ConfigError(f"socket: cannot inspect {path}: {e.strerror}") from None
    if not stat.S_ISSOCK(st.st_mode):
        raise ConfigError(f"socket: {path} exists and is not a socket; not removing it")
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as probe:
        try:
            probe.connect(str(path))
        except OSError:
            return  # a stale socket of a daemon that died: removed when we listen
    raise ConfigError(f"socket: another ledgerd is listening on {path}")


def _prepare_socket_path(path: Path) -> None:
    """Create the socket's directory (0700) if it is missing, check it again, and
    remove a stale socket: never anything but a socket."""
    try:
        path.parent.mkdir(mode=0o700, exist_ok=True)
    except FileNotFoundError:
        raise ConfigError(f"socket: directory {path.parent.parent} does not exist") from None
    except OSError as e:
        raise ConfigError(f"socket: cannot create directory {path.parent}: {e.strerror}") from None
    _check_socket_path(path)
    with contextlib.suppress(FileNotFoundError):
        path.unlink()  # _check_socket_path found a stale socket (or nothing)


async def _open_repository(cfg: Config, hooks: PageHooks) -> Repository:
    """The repository, or one line (ConfigError) saying why the data directory is unusable."""
    where = cfg.data_dir
    if where.exists() and not where.is_dir():
        raise ConfigError(f"data_dir: {where} exists and is not a directory")
    try:
        set_sqlite_threads(cfg.sqlite_threads)
        return await Repository.open(
            where,
            synchronous="FULL" if cfg.durability == "full" else "NORMAL",
            hooks=hooks,
            txn_memory=cfg.txn_memory,
            max_watch_queue=cfg.max_watch_queue,
            max_watch_queue_bytes=cfg.max_watch_queue_bytes,
            max_open_pages=cfg.max_open_pages,
            cache_bytes=cfg.cache_bytes,
            history_retention=cfg.history_retention,
        )
    except RepositoryLockedError:
        raise ConfigError(f"data_dir: {where} is in use by another ledgerd") from None
    except OSError as e:
        problem = e.strerror or str(e)
        raise ConfigError(f"data_dir: cannot use {where}: {problem}") from None
    except (sqlite3.Error, StoreError) as e:
        raise ConfigError(f"data_dir: cannot open the repository in {where}: {e}") from None


async def serve(cfg: Config) -> int:
    loop = asyncio.get_running_loop()
    stop = asyncio.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    raise_open_file_limit()
    async with contextlib.AsyncExitStack() as stack:
        activated = systemd.listen_socket()
        if activated is None:
            _check_socket_path(cfg.socket)  # before the data directory is created
        # The collaborators of every page exist before the repository opens.
        resolvers = Resolvers()
        metrics = Metrics()
        engine = _sync_engine(cfg, metrics)
        hooks = PageHooks(resolvers=resolvers, listener=metrics.listener(None))
        if engine is not None:
            hooks = engine.hooks(resolvers, also=metrics.listener(None))
        repo = await _open_repository(cfg, hooks)  # takes its lock
        stack.push_async_callback(repo.close)
        log.info("repository %s opened (device %s)", cfg.data_dir, repo.device_id.hex())
        metrics.start(repo, engine)
        if engine is not None:
            await engine.start(repo)
            stack.push_async_callback(engine.stop)
            log.info("cloud sync on with %s", cfg.cloud)

        api = Api(repo, cfg, DaemonState())
        api.engine = engine
        api.metrics = metrics
        api.sessions = Sessions(api, resolvers)
        runner = ApiRunner(
            api.handler(ROUTER),
            Limits.of(cfg),
            client_max_size=cfg.max_batch_bytes,
            on_shutdown=api.sessions.close_all,  # WebSockets end first, with code 1001
            handle_signals=False,
            shutdown_timeout=cfg.shutdown_timeout,
        )
        await runner.setup()
        stop_serving = _once(runner.cleanup)
        stack.push_async_callback(stop_serving)
        where = await _listen(stack, cfg, runner, activated)
        if cfg.metrics_listen:
            await _serve_metrics(stack, cfg, metrics)
        await _start_background(stack, repo, cfg, metrics)

        systemd.notify(f"READY=1\nSTATUS=serving on {where}\nMAINPID={os.getpid()}")
        log.info("ledgerd %s ready on %s (pid %d)", VERSION, where, os.getpid())

        await stop.wait()
        await _stop(api, runner, stop_serving)
    log.info("ledgerd stopped")
    return 0


def _sync_engine(cfg: Config, metrics: Metrics) -> SyncEngine | None:
    """The sync engine of ``cloud`` (not started), or None when cloud sync is off."""
    if not cfg.cloud:
        return None
    return SyncEngine(
        open_store(cfg.cloud, endpoint_url=cfg.endpoint_url or None, counters=metrics.cloud),
        location=cfg.cloud,
        poll_interval=cfg.sync_interval,
        poll_interval_max=cfg.sync_interval_max,
        debounce=cfg.sync_debounce,
        fetch_timeout=cfg.fetch_timeout,
        observer=metrics,
        checkpoint_interval=cfg.checkpoint_interval,
        max_checkpoint=cfg.max_checkpoint_bytes,
        compaction_grace=cfg.compaction_grace,
        compaction_interval=cfg.compaction_interval,
        keys=key_ring(cfg),
    )


async def _listen(
    stack: contextlib.AsyncExitStack,
    cfg: Config,
    runner: ApiRunner,
    activated: socket.socket | None,
) -> str:
    """Serve the API on the socket systemd passed, or on ``cfg.socket`` (made 0600,
    or 0660 for ``socket_group``, and removed at stop); where, for the logs."""
    if activated is not None:
        await web.SockSite(runner, activated).start()
        return "a socket passed by systemd"
    _prepare_socket_path(cfg.socket)
    old = os.umask(0o177)  # the socket is born 0600: no window where others can connect
    try:
        await web.UnixSite(runner, str(cfg.socket), backlog=cfg.listen_backlog).start()
    except OSError as e:
        raise ConfigError(f"socket: cannot listen on {cfg.socket}: {e.strerror}") from None
    finally:
        os.umask(old)
    gid = cfg.socket_gid()
    if gid is not None:
        os.chown(cfg.socket, -1, gid)
        os.chmod(cfg.socket, 0o660)
    stack.callback(_unlink, cfg.socket)
    return str(cfg.socket)


async def _start_background(
    stack: contextlib.AsyncExitStack, repo: Repository, cfg: Config, metrics: Metrics
) -> None:
    """Background work, in a task group that shutdown awaits (after ``done`` is set):
    closing idle pages, collection and eviction, the systemd watchdog."""
    done = asyncio.Event()
    tasks = await stack.enter_async_context(asyncio.TaskGroup())
    stack.callback(done.set)
    tasks.create_task(_close_idle_pages(repo, cfg.page_idle_seconds, done), name="idle-pages")
    if cfg.gc_interval > 0 or cfg.disk_budget or cfg.evict_after:
        tasks.create_task(collect_in_background(repo, cfg, metrics, done), name="gc")
    interval = systemd.watchdog_interval()
    if interval is not None:
        tasks.create_task(_until(done, systemd.watchdog(interval)), name="watchdog")


async def _stop(api: Api, runner: ApiRunner, stop_serving: Callable[[], Awaitable[None]]) -> None:
    """The stop, within ``shutdown_timeout`` (and the margins): requests drained or
    cancelled, pages flushed, one last upload round."""
    cfg, engine, loop = api.cfg, api.engine, asyncio.get_running_loop()
    deadline = loop.time() + cfg.shutdown_timeout
    log.info("stopping: draining requests and flushing pages")
    systemd.notify("STOPPING=1\nSTATUS=draining")
    api.state.shutting_down = True  # requests on open connections: 503 shutting_down
    api.state.stopping.set()  # followed feeds end now
    if engine is not None:  # sync rounds end now: POST /v1/sync answers 503 shutting_down
        await engine.interrupt(timeout=STOP_MARGIN)
    # aiohttp's own shutdown: stop listening, end the sessions (on_shutdown), let
    # requests in flight finish, close connections. Requests still running at
    # shutdown_timeout are cancelled (aiohttp would wait as long again first).
    draining = asyncio.ensure_future(stop_serving())
    await asyncio.wait({draining}, timeout=max(0.0, deadline - loop.time()))
    if not draining.done():
        n = await api.cancel_requests(timeout=STOP_MARGIN)
        log.warning("cancelled %d requests still running after %gs", n, cfg.shutdown_timeout)
        if cut := runner.abort_connections():  # answers their clients do not read
            log.warning("cut %d connections still open after %gs", cut, cfg.shutdown_timeout)
        await asyncio.wait({draining}, timeout=STOP_MARGIN)
    for page in api.repo.open_pages():
        try:
            await page.flush()
        except Exception:
            log.exception("flushing page %s failed", named(page.id))
    if engine is not None:  # one last upload round, within what is left of the bound
        left = min(FINAL_UPLOAD, max(deadline - loop.time(), FINAL_UPLOAD_LEAST))
        await engine.stop(final_upload_timeout=left)
    if not draining.done():  # past every bound: the connections close as the loop ends
        log.error("the HTTP server has not stopped; its connections close as ledgerd exits")
        draining.cancel()
        await asyncio.wait({draining})
    elif not draining.cancelled() and (error := draining.exception()) is not None:
        log.error("stopping the HTTP server failed: %s", error)


async def _serve_metrics(stack: contextlib.AsyncExitStack, cfg: Config, metrics: Metrics) -> None:
    """``metrics_listen``: GET /metrics on a TCP address for a scraper."""
    host, port = metrics_address(cfg)
    runner = web.AppRunner(scraper_app(metrics), handle_signals=False, access_log=None)
    await runner.setup()
    stack.push_async_callback(runner.cleanup)
    try:
        await web.TCPSite(runner, host, port).start()
    except OSError as e:
        raise ConfigError(f"metrics_listen: cannot listen on {host}:{port}: {e.strerror}") from None
    log.info("metrics on http://%s:%d/metrics", host, port)


async def _close_idle_pages(repo: Repository, idle_seconds: float, done: asyncio.Event) -> None:
    """Close pages idle for ``idle_seconds`` (checked every half of it, at most every
    30 s), so that open files and threads do not grow with every page ever served.
    Returns once ``done`` is set, never in the middle of closing a page."""
    interval = min(30.0, max(0.05, idle_seconds / 2))
    while True:
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(done.wait(), interval)
        if done.is_set():
            return
        try:
            if n := await repo.close_idle(idle_seconds):
                log.debug("closed %d idle pages; %d stay open", n, len(repo.open_pages()))
        except Exception:
            log.exception("closing idle pages failed")


async def _until(done: asyncio.Event, work: Coroutine[Any, Any, None]) -> None:
    """Run ``work`` until ``done`` is set (then cancel it)."""
    task = asyncio.ensure_future(work)
    waiter = asyncio.ensure_future(done.wait())
    try:
        await asyncio.wait({task, waiter}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        for t in (task, waiter):
            t.cancel()
        await asyncio.gather(task, waiter, return_exceptions=True)


def _once(fn: Callable[[], Awaitable[None]]) -> Callable[[], Awaitable[None]]:
    """``fn``, run at most once however often the result is awaited."""
    ran: list[asyncio.Future[None]] = []

    async def call() -> None:
        if not ran:
            ran.append(asyncio.ensure_future(fn()))
        await asyncio.wait({ran[0]})
        if not ran[0].cancelled():  # cancelled: given up on at stop (serve says why)
            ran[0].result()

    return call


def raise_open_file_limit(want: int = 65536) -> None:
    """Raise the soft limit on open files towards the hard one: every open page
    holds a few files (three SQLite connections), and 1,024 runs out early."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    target = want if hard == resource.RLIM_INFINITY else min(want, hard)
    if soft != resource.RLIM_INFINITY and soft < target:
        with contextlib.suppress(ValueError, OSError):
            resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))


def _unlink(path: Path) -> None:
    with contextlib.suppress(FileNotFoundError):
        path.unlink()
