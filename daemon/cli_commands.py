"""The commands of ``ledgerctl`` on ledgers, pages, keys and values, sync and history.

:class:`Cli` has a method per command; :mod:`ledgerd.daemon.cli` parses the command line,
runs one of them and turns what it raises into a message and an exit status. ``doc``,
``check``, ``gc``, ``evict``, ``conflicts`` and ``resolve`` are modules of their own.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import sys
from collections.abc import AsyncIterator
from typing import Any, BinaryIO

from ledgerd.daemon import __version__
from ledgerd.daemon.cli_command import Command, typed
from ledgerd.daemon.cli_exit import EXIT_UNAVAILABLE, TerminalGuard
from ledgerd.daemon.cli_format import (
    UsageError,
    counted,
    entry_doc,
    file_arg,
    human_bytes,
    name_doc,
    show,
    size_text,
    when,
)
from ledgerd.daemon.cli_import import Importer, file_size
from ledgerd.daemon.cli_progress import ENTRIES_MIN, Progress
from ledgerd.daemon.cli_status import fetch_status, retry_line, status_lines
from ledgerd.daemon.cli_stdio import blocking
from ledgerd.daemon.client import DaemonUnavailableError, Item, LedgerError, NotFoundError, Watch
from ledgerd.daemon.client_types import b64

LIST_PAGE_SIZE = 100
"""Entries per listing request: at most this many inline values (1 MiB each) in memory."""
SYNC_POLL = 0.5
"""Seconds between two looks at ``/v1/status`` for ``sync``'s progress bar."""


async def _stdin_chunks(progress: Progress, stdin: BinaryIO | None = None) -> AsyncIterator[bytes]:
    """Standard input (or ``stdin``, a pipe given as ``--file``) as it comes (its size
    is known only when it is a regular file). A read that fails ends the upload with
    its OSError (the client tells it from a daemon that cannot be reached)."""
    stdin = sys.stdin.buffer if stdin is None else stdin
    total = file_size(stdin)
    done = 0
    while True:
        # (os.read: a read left waiting at exit holds no lock of sys.stdin's)
        chunk = await blocking.run(os.read, stdin.fileno(), 256 * 1024)
        if not chunk:
            return
        done += len(chunk)
        progress(done, total)
        yield chunk


class Cli(Command):
    """The commands of ``ledgerctl`` (but ``doc`` and those of modules of their own)."""

    # -- the daemon ----------------------------------------------------------------

    async def status(self) -> int:
        st = await fetch_status(self.c, self.a.pages, self.a.json)
        if self.a.json:
            self.emit(st)
        else:
            for text in status_lines(st):
                self.line(text)
        return 0

    async def version(self) -> int:
        try:
            daemon: str | None = (await self.c.status(pages_limit=0))["version"]
        except DaemonUnavailableError:
            daemon = None
        if self.a.json:
            self.emit({"client": __version__, "daemon": daemon})
        else:
            self.line(f"ledgerctl {__version__}")
            self.line(f"ledgerd   {daemon or 'not reachable'}")
        return 0 if daemon else EXIT_UNAVAILABLE

    async def ledgers(self) -> int:
        for n in await self.c.ledgers():
            self.emit(name_doc("ledger", n)) if self.a.json else self.line(self.show_name(n))
        return 0

    async def pages(self) -> int:
        ledger = self.b(self.a.ledger, "ledger")
        for n in await self.c.pages(ledger):
            if self.a.json:
                self.emit({**name_doc("ledger", ledger), **name_doc("page", n)})
            else:
                self.line(self.show_name(n))
        return 0

    async def du(self) -> int:
        """Entries, key bytes and value bytes per page, from listings (no value is read)."""
        if self.a.page is not None:
            scope = [(self.b(self.a.ledger, "ledger"), [self.b(self.a.page, "page")])]
        else:
            ledgers = [self.b(self.a.ledger, "ledger")] if self.a.ledger else await self.c.ledgers()
            scope = [(ledger, await self.c.pages(ledger)) for ledger in ledgers]
        totals = [0, 0, 0, 0]
        for ledger, pages in scope:
            for page in pages:
                # The disk side (GET /v1/du): files, live and stored pieces, commits kept.
                (disk,) = (await self.c.du(ledger, page))["pages"]
                disk = {k: v for k, v in disk.items() if k not in DISK_NAMES}
                n = kb = vb = 0
                evicted = bool(disk.get("evicted"))  # (listing it would fetch it back)
                if not evicted:
                    async for item in self.c.entries(ledger, page, values=False, page_size=1000):
                        n, kb, vb = n + 1, kb + len(item.key), vb + (item.size or 0)
                files = int(disk.get("file_bytes", 0))
                totals = [totals[0] + n, totals[1] + kb, totals[2] + vb, totals[3] + files]
                if self.a.json:
                    doc = {**name_doc("ledger", ledger), **name_doc("page", page)}
                    sizes: dict[str, int | None] = {
                        "entries": n,
                        "key_bytes": kb,
                        "value_bytes": vb,
                    }
                    if evicted:  # not known without fetching it
                        sizes = dict.fromkeys(sizes)
                    self.emit({**doc, **sizes, **disk})
                else:
                    name = f"{self.show_name(ledger)}/{self.show_name(page)}"
                    size, count = ("?", "?") if evicted else (human_bytes(kb + vb), str(n))
                    noun = "entry" if count == "1" else "entries"  # (padded: names line up)
                    self.line(
                        f"{size:>12}  {count:>10} {noun:<7}  {name}"
                        f"  (on disk {human_bytes(files)}, {_disk_note(disk)})"
                    )
        if not self.a.json and sum(len(p) for _, p in scope) > 1:
            self.line(
                f"{human_bytes(totals[1] + totals[2]):>12}  {totals[0]:>10} "
                f"{'entry' if totals[0] == 1 else 'entries':<7}  total"
                f"  (on disk {human_bytes(totals[3])})"
            )
        return 0

    async def rm(self) -> int:
        """Delete a page, or every page of a ledger (asked for on a terminal, else
        ``--yes``)."""
        ledger = self.b(self.a.ledger, "ledger")
        if self.a.page is not None:
            await self.c.delete_page(ledger, self.b(self.a.page, "page"))
            return 0
        if not self.a.yes:
            name = self.show_name(ledger)
            if not sys.stdin.isatty():
                raise UsageError(
                    f"deleting every page of ledger {name} needs --yes "
                    "when standard input is not a terminal"
                )
            pages = await self.c.pages(ledger)  # not found: exit 1 before asking
            question = f"delete ledger {name} ({len(pages)} pages) on every device? [y/N] "
            sys.stderr.write(question)  # stdout may be a pipe: ask where rm -i asks
            sys.stderr.flush()
            answer = await blocking.run(os.read, sys.stdin.fileno(), 1024)
            if answer.decode(errors="replace").strip().lower() not in ("y", "yes"):
                self.note("not deleted")
                return 0
        await self.c.delete_ledger(ledger)
        return 0

    # -- values --------------------------------------------------------------------

    async def put(self) -> int:
        ledger, page = self.lp
        key = self.key(self.a.key)
        if self.a.value is not None and self.a.file is not None:
            raise UsageError("give either VALUE or --file, not both")
        value: Any
        stream: BinaryIO | None = None  # a --file that is not a regular file: a pipe
        if (path := file_arg(self.a.file)) is not None:
            value = path
            if value.is_dir():
                raise UsageError(f"--file {value}: is a directory")
            if not value.exists():
                raise UsageError(f"--file {value}: no such file")
            if not value.is_file():  # --file <(command): streamed as standard input is
                try:
                    stream = value.open("rb")
                except OSError as e:
                    raise UsageError(f"--file {value}: {e.strerror}") from None
                value = None
        elif self.a.value is not None:
            value = os.fsencode(self.a.value)
        else:
            value = None
        bar = self.progress("put")
        if value is None:
            value = _stdin_chunks(bar, stream)
        try:
            await self.c.put(ledger, page, key, value, lazy=self.a.lazy, progress=bar)
        finally:
            bar.close()
            if stream is not None:
                stream.close()
        return 0

    async def get(self) -> int:
        ledger, page = self.lp
        key = self.key(self.a.key)
        at = self.at
        target = file_arg(self.a.output)
        if target is not None:
            if target.is_dir():
                raise UsageError(f"-o {target}: is a directory")
            if not target.parent.is_dir():
                raise UsageError(f"-o {target}: directory {target.parent} does not exist")
        bar = self.progress("get")
        try:
            if target is not None:
                try:
                    await self.c.get_to_file(ledger, page, key, target, progress=bar, at=at)
                except (FileNotFoundError, PermissionError, IsADirectoryError) as e:
                    raise UsageError(f"-o {target}: {e.strerror}") from None
            else:
                guard = TerminalGuard() if sys.stdout.isatty() and not self.a.force else None
                out = sys.stdout.buffer
                async for chunk in self.c.get_stream(ledger, page, key, at=at, progress=bar):
                    if guard is not None:
                        guard.check(chunk)
                    out.write(chunk)
                if guard is not None:
                    guard.check(b"", final=True)
                    out.write(guard.tail())
                out.flush()
        finally:
            bar.close()
        return 0

    async def delete(self) -> int:
        ledger, page = self.lp
        await self.c.delete(ledger, page, self.key(self.a.key))
        return 0

    async def clear(self) -> int:
        await self.c.clear(*self.lp)
        return 0

    # -- listings ------------------------------------------------------------------

    async def _entries(self, whole: bool, at: str | None = None) -> AsyncIterator[Item]:
        """The listing, a few entries at a time; values over 1 MiB come as None (not fetched)."""
        ledger, page = self.lp
        kw: dict[str, Any] = {"at": at or self.at, "page_size": LIST_PAGE_SIZE}
        if not whole:
            prefix, start, end = self.key_range()
            kw.update(prefix=prefix, start=start, end=end, limit=self.a.limit)
        async for item in self.c.entries(ledger, page, **kw):
            yield item

    async def ls(self) -> int:
        async for item in self._entries(whole=False):
            if self.a.json:
                self.emit(entry_doc(item))
            elif item.value is None:
                self.line(f"{self.show_key(item.key)}\t{size_text(item.size)}")
            else:
                value = item.value.hex() if self.a.hex else show(item.value)
                self.line(f"{self.show_key(item.key)}\t{value}")
        return 0

    async def export(self) -> int:
        ledger, page = self.lp
        # Every listing and value at one commit (the head reads are served from, once
        # what was acknowledged is committed): a page written meanwhile exports as it was.
        at = (await self.c.heads(ledger, page))[-1]["id"]
        bar = self.progress("export", unit="entries", minimum=ENTRIES_MIN)
        n = 0
        try:
            async for item in self._entries(whole=True, at=at):
                n += 1
                bar(n)
                if item.value is not None:
                    self.emit(entry_doc(item))
                    continue
                # Too large to list: streamed and encoded a chunk at a time.
                self.out.write(f'{{"key":"{b64(item.key)}","priority":"{item.priority}","value":"')
                carry = b""
                async for chunk in self.c.get_stream(ledger, page, item.key, at=at):
                    data = carry + chunk
                    cut = len(data) - len(data) % 3
                    self.out.write(b64(data[:cut]))
                    carry = data[cut:]
                self.line(b64(carry) + '"}')
        finally:
            bar.close()
        return 0

    async def import_(self) -> int:
        ledger, page = self.lp
        try:
            # Standard input through a reader of its own: one left waiting at exit (Ctrl-C)
            # holds no lock that the interpreter takes as it ends.
            path = file_arg(self.a.file)
            source = path if path is not None else os.dup(sys.stdin.fileno())
            src: BinaryIO = open(source, "rb")  # noqa: SIM115
        except OSError as e:
            raise UsageError(f"{self.a.file}: {e.strerror}") from None
        bar = self.progress("import")
        try:
            written = await Importer(self.c, ledger, page, src).run(bar)
        finally:
            bar.close()
            src.close()
        if self.a.json:
            self.emit({"imported": written})
        else:
            noun = "entry" if written == 1 else "entries"
            self.note(f"imported {written} {noun}", prefix="")
        return 0

    async def watch(self) -> int:
        ledger, page = self.lp
        prefix, lo, hi = self.key_range()
        await self._say_if_missing(ledger, page)
        watched = await self.c.subscribe(
            ledger, page, prefix or (lo[:-1] if lo is not None else b"")
        )
        try:
            await self._print_changes(watched, lo, hi)
        finally:
            await watched.close()
        # Only the daemon ends a watch (it is shutting down, or closed the page).
        print("ledgerctl: the daemon ended the watch", file=sys.stderr)
        return 1

    async def _say_if_missing(self, ledger: bytes, page: bytes) -> None:
        """A watch of a page that does not exist (yet) waits for it: say so on stderr.
        (Asked before the watch is registered: a watched page is open, so it answers.)"""
        try:
            await self.c.heads(ledger, page)
        except NotFoundError as e:
            if e.code in ("page_not_found", "ledger_not_found"):
                self.note(
                    f"no page {typed(self.a, 'page')} in ledger {typed(self.a, 'ledger')} "
                    "yet: waiting for it (Ctrl-C to stop)"
                )

    async def _print_changes(self, watched: Watch, lo: bytes | None, hi: bytes | None) -> None:
        async for ch in watched:
            changed, deleted = ch.changed, ch.deleted
            if lo is not None and hi is not None:  # a tuple's range: the longer tuples only
                changed = [i for i in changed if lo <= i.key < hi]
                deleted = [k for k in deleted if lo <= k < hi]
            for i in changed:
                if self.a.json:
                    self.emit({"op": "put", "commit": ch.commit, **entry_doc(i)})
                else:
                    shown = show(i.value) if i.value is not None else size_text(i.size)
                    self.line(f"put\t{self.show_key(i.key)}\t{shown}")
            for k in deleted:
                if self.a.json:
                    self.emit({"op": "delete", "commit": ch.commit, "key": b64(k)})
                else:
                    self.line(f"delete\t{self.show_key(k)}")

    # -- sync and history ----------------------------------------------------------

    async def sync(self) -> int:
        ledger = self.b(self.a.ledger, "ledger") if self.a.ledger else None
        page = self.b(self.a.page, "page") if self.a.page else None
        bar = self.progress("sync", unit="pages", minimum=1)
        waiting = await self._pending_uploads() if bar.active else 0
        watching = asyncio.create_task(self._sync_progress(bar, waiting))
        try:
            res = await self.c.sync(ledger, page, timeout=self.a.timeout)
            bar(waiting, waiting)
        finally:
            watching.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await watching
            bar.close()
        if self.a.json:
            self.emit(res)
        else:
            self.note(  # on stderr, as the progress bar it follows (and as git push's)
                f"synced: {counted(res['uploaded_packs'], 'pack')} up, "
                f"{res['downloaded_packs']} down, {counted(res['rounds'], 'round')}",
                prefix="",
            )
        return 0

    async def _pending_uploads(self) -> int:
        with contextlib.suppress(LedgerError):
            st = await self.c.status(pages_limit=0)
            return int((st.get("sync") or {}).get("pending_uploads") or 0)
        return 0

    async def _sync_progress(self, bar: Progress, waiting: int) -> None:
        """On a terminal: pages uploaded out of those ``waiting`` when ``sync`` started, from
        ``/v1/status`` (the daemon reports nothing else while a sync runs); and on stderr
        unless ``--quiet``, what the daemon retries and why, when that changes."""
        said: str | None = None
        while waiting or not self.a.quiet:
            try:
                st = await self.c.status(pages_limit=0)
            except LedgerError:
                st = {}
            sync = st.get("sync") or {}
            bar(waiting - min(waiting, int(sync.get("pending_uploads") or 0)), waiting)
            if not self.a.quiet and (why := sync.get("retrying")) != said:
                said = why
                if why:
                    bar.write(retry_line(sync))
            await asyncio.sleep(SYNC_POLL)

    async def policy(self) -> int:
        doc = await self.c.policy(*self.lp, self.a.policy)
        if self.a.json:
            self.emit(doc)
            return 0
        conflict = f"  conflict: {doc['conflict']}" if doc.get("conflict") else ""
        self.line(f"{doc['policy']}  conflicts={doc.get('conflicts', 0)}{conflict}")
        return 0

    async def heads(self) -> int:
        for h in await self.c.heads(*self.lp):
            self.emit(h) if self.a.json else self.line(h["id"])
        return 0

    async def log(self) -> int:
        for c in await self.c.history(*self.lp, limit=self.a.limit):
            if self.a.json:
                self.emit(c)
                continue
            parents = ",".join(p[:12] for p in c["parents"]) or "-"
            self.line(
                f"{c['id']}  gen {c['generation']}  {when(c['timestamp'])}  parents {parents}"
            )
        return 0


DISK_NAMES = ("ledger", "page", "ledger_text", "page_text")


def _disk_note(disk: dict[str, Any]) -> str:
    if disk.get("evicted"):
        return "evicted: fetched again on its next use"
    if "error" in disk:
        return f"unknown: {disk['error']}"
    # "sync": off (no cloud), synced or pending; an older daemon sends "synced" only.
    state = disk.get("sync") or ("synced" if disk["synced"] else "pending")
    synced = {"off": "local only", "synced": "synced"}.get(state, "not synced")
    return f"{disk['retained_commits']} of {disk['commits']} commits kept, {synced}"
