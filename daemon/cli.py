# PYTHON_ARGCOMPLETE_OK  (argcomplete looks for this in the first 1024 bytes)
"""``ledgerctl``: the command-line client of ledgerd.

The ``ledgerctl`` command starts in :mod:`ledgerd.daemon.cli_quick`, which prints a small
``get`` itself and hands every other command line to :func:`main` here. This module runs
the commands and owns the command line (argparse, "did you mean",
shell completion through argcomplete) and the exit statuses; how arguments become bytes
and bytes become text or JSON is :mod:`ledgerd.daemon.cli_format`'s, what ``status``
prints :mod:`ledgerd.daemon.cli_status`'s, ``import`` :mod:`ledgerd.daemon.cli_import`'s
and the progress bars :mod:`ledgerd.daemon.cli_progress`'s.

Keys, ledger names and page ids are the exact bytes given on the command line
(``os.fsencode``: UTF-8, or raw bytes that are not), hex with ``--hex``, or, for keys,
tuple literals with ``--tuple``. The daemon is found through ``--socket``,
``$LEDGERD_SOCKET`` or the daemon's default socket path.

Exit status: 0 success, 1 not found, 2 bad usage or bad input (local files and an
unsafe socket directory included), 3 the daemon cannot be reached or went away
mid-request, 4 any other error reported by the daemon (a conflict, data unavailable,
a full disk...), 5 the data read is damaged (``corrupt``), 130 interrupted.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import difflib
import json
import os
import re
import sys
from collections.abc import AsyncIterator
from typing import Any, BinaryIO, NoReturn

from ledgerd.daemon import __version__, cli_conflicts, cli_doc
from ledgerd.daemon.cli_exit import (
    EXIT_DAMAGED,
    EXIT_ERROR,
    EXIT_INTERRUPTED,
    EXIT_NOT_FOUND,
    EXIT_UNAVAILABLE,
    EXIT_USAGE,
    HEX_DIGITS,
    TerminalGuard,
    output_failed,
)
from ledgerd.daemon.cli_format import (
    UsageError,
    arg_bytes,
    counted,
    entry_doc,
    file_arg,
    human_bytes,
    name_doc,
    pack_tuple,
    positive_int,
    show,
    show_key,
    show_name,
    size_text,
    tuple_range,
    when,
)
from ledgerd.daemon.cli_import import Importer, file_size
from ledgerd.daemon.cli_progress import ENTRIES_MIN, Progress
from ledgerd.daemon.cli_status import fetch_status, pages_arg, retry_line, status_lines
from ledgerd.daemon.cli_stdio import blocking
from ledgerd.daemon.client import (
    AsyncClient,
    DaemonUnavailableError,
    Item,
    LedgerError,
    NotFoundError,
    UnsafeSocketError,
    Watch,
)
from ledgerd.daemon.client_types import NOT_A_SOCKET
from ledgerd.daemon.codec import b64

REPAIR_HINT = (
    "'ledgerctl check --repair' fetches damaged synced data again from the bucket "
    "(see docs/operations.md, Check and repair)"
)
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


class Cli:
    def __init__(self, args: argparse.Namespace, client: AsyncClient) -> None:
        self.a = args
        self.c = client
        self.out = sys.stdout

    # -- arguments -----------------------------------------------------------------

    def b(self, text: str, what: str = "key") -> bytes:
        """A ledger name or page id (or, without ``--tuple``, a key) as bytes."""
        return arg_bytes(text, self.a.hex, what)

    def key(self, text: str, what: str = "key") -> bytes:
        """A key argument: a packed tuple with ``--tuple``, else as :meth:`b`."""
        return pack_tuple(text, what) if self.a.tuple else self.b(text, what)

    def key_range(self) -> tuple[bytes | None, bytes | None, bytes | None]:
        """``--prefix``, ``--start``, ``--end`` as (prefix, start, end) bytes; with ``--tuple``
        a prefix is its tuple's range, narrowed by ``--start`` and ``--end``."""
        a = self.a
        start = self.key(a.start, "--start") if getattr(a, "start", None) is not None else None
        end = self.key(a.end, "--end") if getattr(a, "end", None) is not None else None
        if a.prefix is None:
            return None, start, end
        if not a.tuple:
            return self.b(a.prefix, "--prefix"), start, end
        lo, hi = tuple_range(a.prefix, "--prefix")
        return None, max(lo, start or lo), min(hi, end or hi)

    @property
    def at(self) -> str | None:
        """``--at``: a commit id or a unique prefix of one (as ``log`` prints them), checked
        to be hex digits before it goes into a URL (the daemon finds the commit)."""
        at: str | None = getattr(self.a, "at", None)
        if at is not None and (not at or at.strip(HEX_DIGITS)):
            raise UsageError(f"--at {at!r} is not a commit id (hex)")
        return at

    @property
    def lp(self) -> tuple[bytes, bytes]:
        return self.b(self.a.ledger, "ledger"), self.b(self.a.page, "page")

    # -- output --------------------------------------------------------------------

    def line(self, text: str) -> None:
        self.out.write(text + "\n")
        self.out.flush()

    def emit(self, doc: dict[str, Any]) -> None:
        """One ``--json`` record: one compact JSON object on a line of its own."""
        self.line(json.dumps(doc, separators=(",", ":")))

    def note(self, text: str, prefix: str = "ledgerctl: ") -> None:
        """An informational line on stderr (``--quiet`` leaves it out)."""
        if not self.a.quiet:
            print(prefix + text, file=sys.stderr)

    def progress(self, what: str, **kw: Any) -> Progress:
        """A progress bar on stderr (when it is a terminal; never with ``--quiet``)."""
        bar = Progress(what, **kw)
        bar.active = bar.active and not self.a.quiet
        return bar

    def show_key(self, key: bytes) -> str:
        return show_key(key, self.a.hex, self.a.tuple)

    def show_name(self, name: bytes) -> str:
        return show_name(name, self.a.hex)

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
                    f"no page {_typed(self.a, 'page')} in ledger {_typed(self.a, 'ledger')} "
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


def _typed(args: argparse.Namespace, name: str) -> str:
    """An argument as the user typed it, printable whatever its bytes."""
    return show(os.fsencode(getattr(args, name, None) or ""))


def _not_found(e: NotFoundError, args: argparse.Namespace) -> str:
    """What was not found, named as the user gave it, with a hint when it looks like a
    name ledgerctl printed as ``hex:...`` pasted back without ``--hex``."""
    return _not_found_text(e, args) + _hex_hint(args)


def _hex_hint(args: argparse.Namespace) -> str:
    if getattr(args, "hex", False):
        return ""
    for name in ("ledger", "page", "key"):
        typed = getattr(args, name, None)
        if isinstance(typed, str) and typed.startswith("hex:"):
            return f" (to name {typed}, give {typed[4:]} with --hex)"
    return ""


def _not_found_text(e: NotFoundError, args: argparse.Namespace) -> str:
    where = f"{_typed(args, 'ledger')}/{_typed(args, 'page')}"
    if e.code == "key_not_found" and getattr(args, "key", None) is not None:
        return f"key {_typed(args, 'key')} is not in {where}"
    if e.code == "page_not_found" and getattr(args, "page", None) is not None:
        return f"no page {_typed(args, 'page')} in ledger {_typed(args, 'ledger')}"
    if e.code == "ledger_not_found" and getattr(args, "ledger", None) is not None:
        return f"no ledger {_typed(args, 'ledger')}"
    if e.code == "commit_not_found" and getattr(args, "at", None) is not None:
        return f"commit {args.at} is not in {where}"
    return f"{e} ({e.code})"


class _Parser(argparse.ArgumentParser):
    """argparse, with "did you mean" on a mistyped command or option."""

    commands: tuple[str, ...] = ()
    options: frozenset[str] = frozenset()

    def error(self, message: str) -> NoReturn:
        bad = re.search(r"invalid choice: '([^']*)'", message)
        if bad and "COMMAND" in message:
            # A subcommand's parser (doc's) has no list of its own: argparse names them.
            choices = self.commands or tuple(
                re.findall(r"'([^']*)'", message.partition("choose from")[2])
            )
            message = f"no command {bad[1]!r}"
            near = difflib.get_close_matches(bad[1], choices, n=3, cutoff=0.6)
            if near:
                message += f"; did you mean {' or '.join(repr(n) for n in near)}?"
        elif message.startswith("unrecognized arguments: "):
            for word in message.split()[2:]:
                option = word.split("=")[0]
                near = difflib.get_close_matches(option, self.options, n=1)
                if word.startswith("--") and near:
                    if near[0] == option:  # (self.options: every command's)
                        message += f" ({option!r} is not an option of this command)"
                    else:
                        message += f" (did you mean {near[0]!r}?)"
                    break
        super().error(message)


def _complete_ledger(prefix: str, parsed_args: argparse.Namespace, **_: Any) -> list[str]:
    """Shell completion of a ledger name: the daemon's ledgers (none if it is not running)."""
    from ledgerd.daemon.client import Client

    with contextlib.suppress(Exception), Client(getattr(parsed_args, "socket", None)) as c:
        return [show_name(n, parsed_args.hex) for n in c.ledgers()]
    return []


def _complete_page(prefix: str, parsed_args: argparse.Namespace, **_: Any) -> list[str]:
    from ledgerd.daemon.client import Client

    with contextlib.suppress(Exception), Client(getattr(parsed_args, "socket", None)) as c:
        ledger = arg_bytes(parsed_args.ledger, parsed_args.hex, "ledger")
        return [show_name(n, parsed_args.hex) for n in c.pages(ledger)]
    return []


def _common(p: argparse.ArgumentParser, top: bool) -> None:
    """The options every command takes, before or after its name. After it they default
    to nothing (``SUPPRESS``), so that they never undo the same option given before it;
    a command's own ``--json`` (its own help) is kept, with that default."""
    kw: dict[str, Any] = {} if top else {"default": argparse.SUPPRESS}
    p.add_argument(
        "--socket",
        help="daemon socket (default: $LEDGERD_SOCKET or the daemon's default)",
        **kw,
    )
    p.add_argument(
        "--hex", action="store_true", help="keys, ledger names and page ids are hex", **kw
    )
    p.add_argument(
        "-q",
        "--quiet",
        action="store_true",
        help="leave out informational lines on stderr (progress, counts, waiting)",
        **kw,
    )
    p.add_argument(
        "--tuple",
        action="store_true",
        help="keys are tuple literals, e.g. '(\"user\", 42)'; listings show keys as tuples",
        **kw,
    )
    own = p._option_string_actions.get("--json")
    if own is not None:
        own.default = kw.get("default", own.default)
        return
    p.add_argument(
        "--json", action="store_true", help="print data as JSON lines (see docs/cli.md)", **kw
    )


def _common_below(p: argparse.ArgumentParser) -> None:
    """:func:`_common` on the commands that other modules register (``doc``, ``check``,
    ``gc``, ``evict``) and on their own subcommands (``doc ls``, ...)."""
    if "--socket" not in p._option_string_actions:
        _common(p, top=False)
    for action in p._actions:
        if isinstance(action, argparse._SubParsersAction):
            for q in action.choices.values():
                _common_below(q)


def parser() -> argparse.ArgumentParser:
    ap = _Parser(
        prog="ledgerctl",
        description="Command-line client of ledgerd.",
        epilog="Exit status: 0 success, 1 not found, 2 bad usage or input, 3 the daemon "
        "cannot be reached, 4 refused by the daemon (conflict, unavailable, ...), "
        "5 the data read is damaged, 130 interrupted.",
    )
    ap.add_argument("--version", action="version", version=f"ledgerctl {__version__}")
    _common(ap, top=True)
    sub = ap.add_subparsers(dest="command", required=True, metavar="COMMAND")

    def cmd(name: str, help: str, *names: str) -> argparse.ArgumentParser:
        p = sub.add_parser(name, help=help, description=help)
        for n in names:
            arg = p.add_argument(n)
            if n in ("ledger", "page"):
                arg.completer = _complete_ledger if n == "ledger" else _complete_page  # type: ignore[attr-defined]
        _common(p, top=False)
        return p

    p = cmd("status", "show the daemon's state: sync, devices, every page, conflicts")
    p.add_argument(
        "--pages",
        type=pages_arg,
        default=None,
        metavar="N|all",
        help="show at most N pages (default: 20, with --json 1000), or all",
    )
    cmd("version", "show the versions of ledgerctl and of the daemon")
    cmd("ledgers", "list ledgers")
    cmd("pages", "list the pages of a ledger", "ledger")
    p = cmd("du", "entries and bytes (keys and values) per page, and its disk use")
    p.add_argument("ledger", nargs="?").completer = _complete_ledger  # type: ignore[attr-defined]
    p.add_argument("page", nargs="?").completer = _complete_page  # type: ignore[attr-defined]
    p = cmd(
        "put", "set a key (value from VALUE, --file or standard input)", "ledger", "page", "key"
    )
    p.add_argument("value", nargs="?")
    p.add_argument("--file", help="read the value from this file ('-': standard input)")
    p.add_argument(
        "--lazy", action="store_true", help="LAZY priority: other devices fetch on first read"
    )
    p = cmd("get", "write a value to standard output (or -o FILE)", "ledger", "page", "key")
    p.add_argument("-o", "--output", help="write the value to this file ('-': standard output)")
    p.add_argument("--at", help="read at this commit (hex id, or a unique prefix: 4+ digits)")
    p.add_argument(
        "--force", action="store_true", help="write a binary value to a terminal all the same"
    )
    cmd("delete", "delete a key", "ledger", "page", "key")
    cmd("clear", "delete every entry of a page", "ledger", "page")
    p = cmd("rm", "delete a page, or a whole ledger, on every device", "ledger")
    p.add_argument("page", nargs="?").completer = _complete_page  # type: ignore[attr-defined]
    p.add_argument("-y", "--yes", action="store_true", help="delete a whole ledger without asking")
    p = cmd("ls", "list entries: key<TAB>value per line (or --json)", "ledger", "page")
    for opt, what in (
        ("--prefix", "only keys that start with P (with --tuple: a tuple prefix)"),
        ("--start", "only keys from S on"),
        ("--end", "only keys before E"),
    ):
        p.add_argument(opt, metavar=opt[2].upper(), help=what)
    p.add_argument("--limit", type=positive_int, metavar="N", help="at most N entries")
    p.add_argument(
        "--at", metavar="COMMIT", help="list at this commit (hex id, or a unique prefix)"
    )
    p = cmd("watch", "print every change until interrupted", "ledger", "page")
    p.add_argument("--prefix", metavar="P", help="only keys that start with P")
    p = cmd("import", "write entries in the 'ls --json' format in large batches", "ledger", "page")
    p.add_argument("file", nargs="?", help="(default, or '-': standard input)")
    cmd("export", "the whole page in the 'ls --json' format", "ledger", "page")
    p = cmd("sync", "upload pending writes, fetch and join other devices', until quiet")
    p.add_argument("ledger", nargs="?").completer = _complete_ledger  # type: ignore[attr-defined]
    p.add_argument("page", nargs="?").completer = _complete_page  # type: ignore[attr-defined]
    p.add_argument("--timeout", type=float, default=60.0, help="give up after S seconds")
    p = cmd("policy", "show or set the page's merge policy", "ledger", "page")
    p.add_argument(
        "policy", nargs="?", choices=["last_one_wins", "automatic_with_fallback", "custom"]
    )
    cmd("heads", "the page's head commit (history is a line: one head)", "ledger", "page")
    p = cmd("log", "commit history, newest first", "ledger", "page")
    p.add_argument("--limit", type=positive_int, default=20, metavar="N", help="(default 20)")
    cli_doc.add_parser(sub)  # ledgerctl doc ... (daemon/cli_doc.py)
    # -- subcommands of their own modules (each sets a handler(args, client)) ---------
    from ledgerd.daemon import cli_check, cli_gc

    cli_check.register(sub)
    cli_gc.register(sub)
    cli_conflicts.register(sub)
    for q in sub.choices.values():
        _common_below(q)
    _explain(ap, "")

    ap.commands = tuple(sub.choices)
    ap.options = frozenset(
        o for q in [ap, *sub.choices.values()] for a in q._actions for o in a.option_strings
    )
    return ap


DOC_ID = "01M845D77GCBCEDRNYKWHJ1QF9"
EXAMPLES = {
    "status": "ledgerctl status\nledgerctl status --pages all --json   # every page, one document",
    "version": "ledgerctl version --json",
    "ledgers": "ledgerctl ledgers",
    "pages": "ledgerctl pages notes",
    "du": "ledgerctl du notes inbox",
    "put": "ledgerctl put notes inbox greeting 'hello world'\n"
    "echo 'from stdin' | ledgerctl put notes inbox note/1\n"
    "ledgerctl put notes inbox photo --file photo.bin --lazy",
    "get": "ledgerctl get notes inbox greeting\n"
    "ledgerctl get notes inbox photo -o photo.bin\n"
    "ledgerctl get --at ce72cb29519f notes inbox greeting   # a commit id (prefix) from log",
    "delete": "ledgerctl delete notes inbox greeting",
    "clear": "ledgerctl clear notes inbox",
    "rm": "ledgerctl rm notes inbox\nledgerctl rm notes --yes   # every page of the ledger",
    "ls": "ledgerctl ls notes inbox --prefix note/ --limit 10\nledgerctl ls notes inbox --json",
    "watch": "ledgerctl watch notes inbox --prefix note/",
    "import": "ledgerctl import notes backup inbox.jsonl\n"
    "ledgerctl export notes inbox | ledgerctl import notes backup",
    "export": "ledgerctl export notes inbox > inbox.jsonl",
    "sync": "ledgerctl sync\nledgerctl sync notes inbox --timeout 30",
    "policy": "ledgerctl policy notes inbox\nledgerctl policy notes inbox automatic_with_fallback",
    "heads": "ledgerctl heads notes inbox",
    "log": "ledgerctl log notes inbox --limit 5",
    "doc": 'ledgerctl doc put app people people \'{"name": "Ann"}\'',
    "doc put": 'ledgerctl doc put app people people \'{"name": "Ann", "age": 41}\'',
    "doc get": f"ledgerctl doc get app people people {DOC_ID}",
    "doc ls": "ledgerctl doc ls app people people --json",
    "doc rm": f"ledgerctl doc rm app people people {DOC_ID}",
    "doc purge": f"ledgerctl doc purge app people people {DOC_ID}",
    "doc index": "ledgerctl doc index app people people by_city --partition address.city "
    "--sort age",
    "doc indexes": "ledgerctl doc indexes app people people",
    "doc drop-index": "ledgerctl doc drop-index app people people by_city",
    "doc rebuild-index": "ledgerctl doc rebuild-index app people people by_city",
    "doc find": "ledgerctl doc find app people people by_city --eq Oslo --start 30",
    "doc attach": f"ledgerctl doc attach app people people {DOC_ID} photo.jpg",
    "doc detach": f"ledgerctl doc detach app people people {DOC_ID} ATTACHMENT_ID",
    "doc attachment": f"ledgerctl doc attachment app people people {DOC_ID} ATTACHMENT_ID "
    "-o copy.jpg",
    "doc changes": "ledgerctl doc changes app people --since COMMIT --follow",
    "check": "ledgerctl check notes\nledgerctl check --cloud --repair",
    "gc": "ledgerctl gc notes inbox",
    "evict": "ledgerctl evict notes inbox",
    **cli_conflicts.EXAMPLES,
}
"""An example for each command's ``--help`` (tests/daemon/test_cli_conventions.py
checks that every command has one)."""
POSITIONALS = {
    "ledger": "ledger name (hex with --hex)",
    "page": "page id in the ledger (hex with --hex)",
    "key": "the key (hex with --hex, a tuple literal with --tuple)",
    "value": "the value (default: --file, or else standard input)",
    "policy": "the policy to set (default: show the current one)",
    "collection": "the collection of documents",
    "id": "a document's _id",
    "name": "the index's name",
    "attachment_id": "the attachment's id (as attach printed it)",
    "file": "the file to read",
}
"""What a positional argument is, by name, where its command does not say."""


def _explain(p: argparse.ArgumentParser, path: str) -> None:
    """Give ``p`` (the command ``path``) and its subcommands their example and a line for
    every positional argument."""
    example = EXAMPLES.get(path)
    if example is not None:
        p.formatter_class = argparse.RawDescriptionHelpFormatter
        p.epilog = "example:\n" + "\n".join("  " + line for line in example.splitlines())
    for action in p._actions:
        if not action.option_strings and action.help is None and action.dest in POSITIONALS:
            action.help = POSITIONALS[action.dest]
        if isinstance(action, argparse._SubParsersAction):
            for name, q in action.choices.items():
                _explain(q, f"{path} {name}".strip())


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


async def run(args: argparse.Namespace) -> int:
    if args.socket == "":  # (not left out: given empty, e.g. an unset variable)
        raise UsageError("--socket: the path is empty")
    async with AsyncClient(args.socket) as client:
        if (handler := getattr(args, "handler", None)) is not None:  # see parser()
            return int(await handler(args, client))
        cli = Cli(args, client)
        if args.command == "doc":  # ledgerctl doc ... (daemon/cli_doc.py)
            return await cli_doc.run(cli, UsageError)
        name = {"import": "import_"}.get(args.command, args.command)
        return int(await getattr(cli, name)())


def _unreachable(e: DaemonUnavailableError, args: argparse.Namespace) -> str:
    """The message for a daemon that cannot be reached (what failed: the clients leave
    out aiohttp's host and TLS details) and a hint that names the socket the user gave,
    if any."""
    text = str(e)
    if NOT_A_SOCKET in text:  # (ledgerd would not start there: the reason says what to do)
        return text
    if args.socket:
        hint = f"is ledgerd running there? start it with: ledgerd --socket {args.socket}"
    elif os.environ.get("LEDGERD_SOCKET"):
        hint = "is ledgerd running there? $LEDGERD_SOCKET chose it; start it with: ledgerd"
    else:
        hint = "is ledgerd running? start it with: ledgerd"
    return f"{text} ({hint})"


def _claim_closed_streams() -> None:
    """Standard input or output closed (``<&-``, ``>&-``): Python leaves it None. Its
    descriptor gets /dev/null opened the other way round, so that reading (or writing)
    it fails as a closed one does, with EBADF, and no socket opened later takes it."""
    for fd, name, flags, mode in ((0, "stdin", os.O_WRONLY, "r"), (1, "stdout", os.O_RDONLY, "w")):
        if getattr(sys, name) is None:
            with contextlib.suppress(OSError):
                null = os.open(os.devnull, flags)
                if null != fd:
                    os.dup2(null, fd)
                    os.close(null)
                setattr(sys, name, open(fd, mode, closefd=False))  # noqa: SIM115


def main(argv: list[str] | None = None) -> int:
    _claim_closed_streams()
    ap = parser()
    if "_ARGCOMPLETE" in os.environ:  # the shell asks for completions (docs/cli.md)
        import argcomplete

        argcomplete.autocomplete(ap)
    if not (sys.argv[1:] if argv is None else argv):  # no command: what there is to say
        ap.print_help()
        return 0
    args = ap.parse_args(argv)
    try:
        return asyncio.run(run(args))
    except (UsageError, UnsafeSocketError) as e:
        print(f"ledgerctl: {e}", file=sys.stderr)
        return EXIT_USAGE
    except DaemonUnavailableError as e:
        print(f"ledgerctl: {_unreachable(e, args)}", file=sys.stderr)
        return EXIT_UNAVAILABLE
    except NotFoundError as e:
        print(f"ledgerctl: {_not_found(e, args)}", file=sys.stderr)
        return EXIT_NOT_FOUND
    except LedgerError as e:
        if e.code == "corrupt":  # the daemon runs, and found the data damaged
            print(f"ledgerctl: damaged data: {e} (corrupt); {REPAIR_HINT}", file=sys.stderr)
            return EXIT_DAMAGED
        print(f"ledgerctl: {e} ({e.code})", file=sys.stderr)
        return EXIT_USAGE if e.status in (400, 413, 414, 416) else EXIT_ERROR
    except KeyboardInterrupt:
        return EXIT_INTERRUPTED
    except OSError as e:  # standard input or output (or a local file) failed
        return output_failed(e)


if __name__ == "__main__":
    sys.exit(main())
