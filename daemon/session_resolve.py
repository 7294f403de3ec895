"""Conflict resolvers on sessions: which sessions resolve each ledger's conflicts
(:class:`Resolvers`), and the rounds put to one session (:class:`ResolveRounds`):
``resolve`` events out, ``resolved`` answers in.

The session itself (frames, transactions, watchers) is :mod:`ledgerd.daemon.session`'s.
"""

from __future__ import annotations

import abc
import asyncio
import json
import logging
from collections.abc import Awaitable, Callable, Iterator
from typing import Any

from ledgerd.daemon import errors as ae
from ledgerd.daemon.api import Api
from ledgerd.daemon.codec import b64, priority_name, unb64
from ledgerd.store import Entry, Page, Repository
from ledgerd.store.errors import named
from ledgerd.store.tree.merge import Choice, Conflict, MergeRequest, Resolver

log = logging.getLogger("ledgerd.daemon.session")  # (the session's: its lines read as before)

INLINE_RESOLVE = 1024 * 1024
"""Resolve events carry values up to this size; larger ones carry null (read them by key)."""


class Resolvers:
    """Which sessions offered to resolve conflicts, per ledger.

    The repository's pages ask it for a ledger's resolver when their policy calls for
    one (:class:`ledgerd.store.page.hooks.ResolverSource`): the first session registered
    for the ledger answers. With none registered a page's conflicts wait (reads show
    each key's winner meanwhile), and are put to the resolver once one registers.
    """

    def __init__(self) -> None:
        self.by_ledger: dict[bytes, list[ResolverSession]] = {}
        self._tasks: set[asyncio.Task[None]] = set()

    def resolver_for(self, ledger: bytes) -> Resolver | None:
        sessions = self.by_ledger.get(ledger)
        if not sessions:
            return None
        return sessions[0].ask

    def add(self, ledger: bytes, s: ResolverSession) -> None:
        sessions = self.by_ledger.setdefault(ledger, [])
        if s in sessions:  # registered already (its conflicts were put to it then)
            return
        sessions.append(s)
        task = asyncio.create_task(self._resume(ledger, s.api.repo), name="resume-conflicts")
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _resume(self, ledger: bytes, repo: Repository) -> None:
        """A resolver arrived: put the conflicts of the ledger's pages to it.

        Pages keep one head; a page's conflicts are its keys whose siblings hold
        different values (``conflict_count``), under every policy: ``try_merge`` asks
        the resolver only where the page's policy calls for one."""
        for pid in await repo.ledger(ledger).pages(include_deleted=True):
            try:
                page = await repo.open_page(ledger, pid)
                with page.lease():
                    if page.conflict_count:
                        await page.try_merge()
            except Exception:
                log.exception("resolving the conflicts of page %s failed", named(pid))

    def remove(self, s: ResolverSession) -> None:
        for ledger, lst in list(self.by_ledger.items()):
            while s in lst:
                lst.remove(s)
            if not lst:  # no trace of a ledger once its resolvers are gone
                del self.by_ledger[ledger]


class ResolverSession(abc.ABC):
    """A session that may offer to resolve a ledger's conflicts
    (:class:`ledgerd.daemon.session.Session`): its API (for the repository) and the
    resolver it offers."""

    api: Api

    @abc.abstractmethod
    async def ask(self, req: MergeRequest) -> dict[bytes, Choice]: ...


class ResolveRounds:
    """The resolve requests one session was sent and waits on: each part of a page's
    conflicts, a future that its ``resolved`` answer completes."""

    def __init__(
        self,
        api: Api,
        send: Callable[[dict[str, Any]], Awaitable[None]],
        ids: Iterator[int],
    ) -> None:
        self.api = api
        self._send = send
        self._ids = ids
        """The session's counter (its transactions', watchers' and requests' ids)."""
        self._asked: dict[str, asyncio.Future[dict[bytes, Choice]]] = {}

    async def ask(self, req: MergeRequest) -> dict[bytes, Choice]:
        """Send a page's conflicts to this session's resolver and wait for its answers.

        The conflicts go in ``resolve`` events of at most ``max_event_bytes`` each (but
        at least one conflict each), built and sent one at a time; each event is a
        request of its own, answered by its own ``resolved``. The answers are stored
        once every part is answered; nothing is if one part fails.
        """
        page = await self.api.repo.open_page(req.ledger, req.page)  # open: it is asking
        head = {
            "event": "resolve",
            "ledger": b64(page.ledger),
            "page": b64(page.id),
            "policy": req.policy.value,
            "left": req.left.id.hex(),
            "right": req.right.id.hex(),
        }
        budget = self.api.cfg.max_event_bytes
        asked: list[tuple[str, asyncio.Future[dict[bytes, Choice]]]] = []
        try:
            part: list[dict[str, Any]] = []
            used = len(json.dumps(head)) + 64
            for c in req.conflicts:
                item = await _conflict(page, c)
                n = len(json.dumps(item)) + 2
                if part and used + n > budget:
                    await self._send_part(head, part, asked)
                    part, used = [], len(json.dumps(head)) + 64
                part.append(item)
                used += n
            if part or not asked:
                await self._send_part(head, part, asked)
            return await _answers(asked)
        finally:
            for rid, _ in asked:
                self._asked.pop(rid, None)

    async def _send_part(
        self,
        head: dict[str, Any],
        part: list[dict[str, Any]],
        asked: list[tuple[str, asyncio.Future[dict[bytes, Choice]]]],
    ) -> None:
        rid = f"r{next(self._ids)}"
        fut: asyncio.Future[dict[bytes, Choice]] = asyncio.get_running_loop().create_future()
        self._asked[rid] = fut
        asked.append((rid, fut))
        await self._send({**head, "request": rid, "conflicts": part})

    def resolved(self, req: dict[str, Any]) -> None:
        """A ``resolved`` answer: the choices (or the error) of the request it names."""
        fut = self._asked.get(str(req.get("request")))
        if fut is None or fut.done():
            raise ae.Conflict(
                f"no resolve request {req.get('request')!r} is waiting for this session"
            )
        if req.get("error"):
            fut.set_exception(RuntimeError(ae.bounded(f"the resolver failed: {req.get('error')}")))
            return
        choices = req.get("choices")
        if not isinstance(choices, list):
            raise ae.BadRequest("choices must be a list")
        fut.set_result(dict(_choice(i, ch) for i, ch in enumerate(choices)))

    def disconnected(self) -> None:
        """The session ended: the rounds waiting on it change nothing."""
        for fut in self._asked.values():
            if not fut.done():
                fut.set_exception(ConnectionResetError("the resolver disconnected"))


async def _conflict(page: Page, c: Conflict) -> dict[str, Any]:
    """One conflict of a ``resolve`` event: its key and three sides."""
    return {
        "key": b64(c.key),
        "base": await _side(page, c.base),
        "left": await _side(page, c.left),
        "right": await _side(page, c.right),
    }


async def _side(page: Page, e: Entry | None) -> dict[str, Any] | None:
    """A side of a conflict: its value inline up to :data:`INLINE_RESOLVE` bytes."""
    if e is None:
        return None
    size = await page.objects.size(e.value)
    value = await page.objects.read_all(e.value) if size <= INLINE_RESOLVE else None
    return {
        "value": b64(value) if value is not None else None,
        "size": size,
        "priority": priority_name(e.priority),
    }


async def _answers(
    asked: list[tuple[str, asyncio.Future[dict[bytes, Choice]]]],
) -> dict[bytes, Choice]:
    """Every part's answers, once all are in; the first failure if one failed."""
    results = await asyncio.gather(*(f for _, f in asked), return_exceptions=True)
    answers: dict[bytes, Choice] = {}
    for r in results:
        if isinstance(r, BaseException):
            raise r
        answers.update(r)
    return answers


def _choice(i: int, ch: Any) -> tuple[bytes, Choice]:
    """``choices[i]`` of a ``resolved`` answer: its key and what to take."""
    if not isinstance(ch, dict):
        raise ae.BadRequest(f"choices[{i}] must be an object")
    key = unb64(ch.get("key"), f"choices[{i}].key")
    take = ch.get("take")
    if take in ("left", "right"):
        return key, take
    if take == "delete":
        return key, None
    if take == "value":
        return key, unb64(ch.get("value"), f"choices[{i}].value")
    raise ae.BadRequest(f"choices[{i}].take must be left, right, delete or value")
