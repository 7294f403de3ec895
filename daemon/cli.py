"""``ledgerctl``: the command-line client of ledgerd.

Keys, ledger names and page ids are the exact bytes given on the command line
(``os.fsencode``: UTF-8, or raw bytes that are not), or hex with ``--hex``. The
daemon is found through ``--socket``, ``$LEDGERD_SOCKET`` or the daemon's default
socket path.

Exit status: 0 success, 1 not found, 2 bad usage or bad input (local files and an
unsafe socket directory included), 3 the daemon cannot be reached or went away
mid-request, 4 any other error reported by the daemon.
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import binascii
import contextlib
import json
import os
import re
import sys
import time
from collections.abc import AsyncIterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, BinaryIO, TextIO

from ledgerd.daemon import __version__, cli_doc
from ledgerd.daemon.client import (
    AsyncClient,
    DaemonUnavailableError,
    Item,
    LedgerError,
    NotFoundError,
    UnsafeSocketError,
)

EXIT_NOT_FOUND, EXIT_USAGE, EXIT_UNAVAILABLE, EXIT_ERROR = 1, 2, 3, 4
IMPORT_BATCH_ENTRIES = 10_000
IMPORT_BATCH_BYTES = 16 * 1024 * 1024
IMPORT_INLINE_VALUE = 1024 * 1024
"""``import`` sends larger values on their own, as a streamed PUT, not in a batch."""
IMPORT_LINE_LIMIT = 2 * 1024 * 1024
"""``import`` parses lines up to this size whole; longer ones are streamed (export's layout)."""
LIST_PAGE_SIZE = 100
"""Entries per listing request: at most this many inline values (1 MiB each) in memory."""
PROGRESS_MIN = 8 * 1024 * 1024
B64_IN = 3 * 64 * 1024


class UsageError(Exception):
    """The command line is wrong (exit status 2)."""


def _arg_bytes(text: str, hex_mode: bool, what: str) -> bytes:
    """An argument's bytes: exactly the bytes given on the command line (even when they
    are not valid UTF-8, through ``os.fsencode``), or hex-decoded with ``--hex``."""
    if not hex_mode:
        return os.fsencode(text)
    try:
        return bytes.fromhex(text)
    except ValueError:
        raise UsageError(f"{what} {text!r} is not valid hex") from None


_ESCAPES = {"\\": "\\\\", "\t": "\\t", "\n": "\\n", "\r": "\\r"}


def _show(data: bytes) -> str:
    """Bytes as one line of text: printable UTF-8 as is, everything else escaped.

    A backslash is doubled, tab, newline and CR become ``\\t \\n \\r``, bytes that are
    not valid UTF-8 become ``\\xNN`` and other non-printable characters ``\\xNN`` or
    ``\\uNNNN``, so distinct keys always print distinctly.
    """
    out = []
    for ch in data.decode("utf-8", "surrogateescape"):
        if ch in _ESCAPES:
            out.append(_ESCAPES[ch])
        elif "\udc80" <= ch <= "\udcff":
            out.append(f"\\x{ord(ch) - 0xDC00:02x}")
        elif ch.isprintable():
            out.append(ch)
        elif ord(ch) < 0x100:
            out.append(f"\\x{ord(ch):02x}")
        else:
            out.append(f"\\u{ord(ch):04x}")
    return "".join(out)


class Progress:
    """A progress bar on stderr, only when stderr is a terminal and the transfer is large."""

    def __init__(self, label: str, stream: TextIO = sys.stderr) -> None:
        self.label = label
        self.stream = stream
        self.active = stream.isatty()
        self.last = 0.0
        self.shown = False

    def __call__(self, done: int, total: int | None) -> None:
        if not self.active or (total if total is not None else done) < PROGRESS_MIN:
            return
        now = time.monotonic()
        if now - self.last < 0.1 and (total is None or done < total):
            return
        self.last = now
        mib = done / 1048576
        if total:
            frac = done / total
            bar = "#" * int(frac * 30)
            line = f"\r{self.label} [{bar:<30}] {frac * 100:5.1f}% {mib:,.1f} MiB"
        else:
            line = f"\r{self.label} {mib:,.1f} MiB"
        self.stream.write(line)
        self.stream.flush()
        self.shown = True

    def done(self) -> None:
        if self.shown:
            self.stream.write("\n")
            self.stream.flush()


async def _stdin_chunks() -> AsyncIterator[bytes]:
    stdin = sys.stdin.buffer
    read = getattr(stdin, "read1", stdin.read)
    while chunk := await asyncio.to_thread(read, 256 * 1024):
        yield chunk


def _item_json(item: Item) -> str:
    """One ``ls --json``/``export`` line: key, priority, value (base64) in this order.

    A value over the listing's inline limit comes as ``null`` with its ``size``.
    """
    doc: dict[str, Any] = {
        "key": base64.b64encode(item.key).decode(),
        "priority": item.priority,
        "value": None if item.value is None else base64.b64encode(item.value).decode(),
    }
    if item.value is None:
        doc["size"] = item.size
    return json.dumps(doc, separators=(",", ":"))


def _size_text(n: int) -> str:
    """``<300.0 MiB>``: what ``ls`` prints instead of a value too large to list."""
    for unit, scale in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if n >= scale:
            return f"<{n / scale:.1f} {unit}>"
    return f"<{n} bytes>"


_STREAMED_HEAD = re.compile(
    rb'\s*\{\s*"key"\s*:\s*"([A-Za-z0-9+/]*={0,2})"\s*,\s*"priority"\s*:\s*"(eager|lazy)"'
    rb'\s*,\s*"value"\s*:\s*"'
)


def _parse_line(raw: bytes, n: int) -> tuple[bytes, bytes, str]:
    try:
        doc = json.loads(raw.decode("utf-8"))
        key = base64.b64decode(doc["key"], validate=True)
        if doc["value"] is None:
            raise ValueError("the value is null ('ls --json' leaves out large values: use export)")
        value = base64.b64decode(doc["value"], validate=True)
        prio = doc.get("priority", "eager")
        if prio not in ("eager", "lazy"):
            raise ValueError(f"priority {prio!r}")
    except (ValueError, KeyError, TypeError, binascii.Error) as e:  # incl. bad UTF-8
        raise UsageError(f"line {n}: not an entry in the 'ls --json' format: {e}") from None
    return key, value, prio


class _StreamedValue:
    """The base64 value of one long ``import`` line, decoded as it is read (bounded memory).

    ``error`` keeps what was wrong with the line: the upload it fed fails with
    whatever aiohttp makes of the exception, the caller reports this instead.
    """

    def __init__(self, first: bytes, src: BinaryIO, n: int) -> None:
        self.first, self.src, self.n = first, src, n
        self.error: UsageError | None = None

    def _bad(self, why: str) -> UsageError:
        self.error = UsageError(f"line {self.n}: {why}")
        return self.error

    async def __aiter__(self) -> AsyncIterator[bytes]:
        pending = b""
        data = self.first
        while True:
            end = data.find(b'"')
            pending += data if end < 0 else data[:end]
            cut = len(pending) - len(pending) % 4
            if cut:
                try:
                    yield base64.b64decode(pending[:cut], validate=True)
                except binascii.Error as e:
                    raise self._bad(f"the value is not valid base64: {e}") from None
                pending = pending[cut:]
            if end >= 0:
                tail = data[end + 1 :]
                while not tail.endswith(b"\n") and len(tail) < 1024:
                    more = await asyncio.to_thread(self.src.readline, 1024)
                    if not more:
                        break
                    tail += more
                if pending or tail.strip() != b"}":
                    raise self._bad("a long line must end with the value and '}'")
                return
            if data.endswith(b"\n"):
                raise self._bad("the line ends inside the value")
            data = await asyncio.to_thread(self.src.readline, B64_IN)
            if not data:
                raise self._bad("the input ends inside the value")


def _when(us: int) -> str:
    return datetime.fromtimestamp(us / 1e6, UTC).isoformat(timespec="milliseconds")


class Cli:
    def __init__(self, args: argparse.Namespace, client: AsyncClient) -> None:
        self.a = args
        self.c = client
        self.out = sys.stdout
        self.batch_bytes = IMPORT_BATCH_BYTES
        """``import``'s batch size: smaller once the daemon found a batch too large."""

    def b(self, text: str, what: str = "key") -> bytes:
        return _arg_bytes(text, self.a.hex, what)

    @property
    def at(self) -> str | None:
        """``--at``: a commit id, checked to be hex before it goes into a URL."""
        at: str | None = getattr(self.a, "at", None)
        if at is not None:
            try:
                bytes.fromhex(at)
            except ValueError:
                raise UsageError(f"--at {at!r} is not a commit id (hex)") from None
        return at

    @property
    def lp(self) -> tuple[bytes, bytes]:
        return self.b(self.a.ledger, "ledger"), self.b(self.a.page, "page")

    def line(self, text: str) -> None:
        self.out.write(text + "\n")
        self.out.flush()

    async def status(self) -> int:
        st = await self.c.status()
        if self.a.json:
            self.line(json.dumps(st, indent=2))
            return 0
        self.line(f"ledgerd {st['version']} (pid {st['pid']}), up {st['uptime_s']:.0f}s")
        self.line(f"device   {st['device_id']}")
        self.line(f"data     {st['data_dir']}")
        self.line(f"cloud    {st.get('cloud') or 'off'}")
        if st.get("sync_error"):
            self.line(f"sync     error: {st['sync_error']}")
        for p in st.get("open_pages", []):
            name = f"{p['ledger_text'] or p['ledger']}/{p['page_text'] or p['page']}"
            extra = f"  heads={p['heads']}" if p["heads"] != 1 else ""
            if p.get("unsynced_commits"):
                extra += f"  unsynced={p['unsynced_commits']}"
            if p.get("last_sync"):
                when = datetime.fromtimestamp(p["last_sync"], UTC).isoformat(timespec="seconds")
                extra += f"  synced {when}"
            if p.get("conflict"):
                extra += f"  conflict: {p['conflict']}"
            if p.get("last_error"):
                extra += f"  error: {p['last_error']}"
            self.line(f"page     {name}{extra}")
        return 0

    async def ledgers(self) -> int:
        for n in await self.c.ledgers():
            self.line(n.hex() if self.a.hex else _show(n))
        return 0

    async def pages(self) -> int:
        for n in await self.c.pages(self.b(self.a.ledger, "ledger")):
            self.line(n.hex() if self.a.hex else _show(n))
        return 0

    async def put(self) -> int:
        ledger, page = self.lp
        key = self.b(self.a.key)
        if self.a.value is not None and self.a.file is not None:
            raise UsageError("give either VALUE or --file, not both")
        value: Any
        if self.a.file is not None:
            value = Path(self.a.file)
            if not value.is_file():
                raise UsageError(f"--file {value}: no such file")
        elif self.a.value is not None:
            value = os.fsencode(self.a.value)
        else:
            value = _stdin_chunks()
        bar = Progress("put")
        try:
            await self.c.put(ledger, page, key, value, lazy=self.a.lazy, progress=bar)
        finally:
            bar.done()
        return 0

    async def get(self) -> int:
        ledger, page = self.lp
        key = self.b(self.a.key)
        at = self.at
        target = Path(self.a.output) if self.a.output else None
        if target is not None:
            if target.is_dir():
                raise UsageError(f"-o {target}: is a directory")
            if not target.parent.is_dir():
                raise UsageError(f"-o {target}: directory {target.parent} does not exist")
        bar = Progress("get")
        try:
            if target is not None:
                try:
                    await self.c.get_to_file(ledger, page, key, target, progress=bar, at=at)
                except (FileNotFoundError, PermissionError, IsADirectoryError) as e:
                    raise UsageError(f"-o {target}: {e.strerror}") from None
            else:
                out = sys.stdout.buffer
                async for chunk in self.c.get_stream(ledger, page, key, at=at, progress=bar):
                    out.write(chunk)
                out.flush()
        finally:
            bar.done()
        return 0

    async def delete(self) -> int:
        ledger, page = self.lp
        await self.c.delete(ledger, page, self.b(self.a.key))
        return 0

    async def clear(self) -> int:
        await self.c.clear(*self.lp)
        return 0

    async def _entries(self, whole: bool) -> AsyncIterator[Item]:
        """The listing, a few entries at a time; values over 1 MiB come as None (not fetched)."""
        ledger, page = self.lp
        kw: dict[str, Any] = {"at": self.at, "page_size": LIST_PAGE_SIZE}
        if not whole:
            kw.update(
                prefix=self.b(self.a.prefix) if self.a.prefix is not None else None,
                start=self.b(self.a.start) if self.a.start is not None else None,
                end=self.b(self.a.end) if self.a.end is not None else None,
                limit=self.a.limit,
            )
        async for item in self.c.entries(ledger, page, **kw):
            yield item

    async def ls(self) -> int:
        async for item in self._entries(whole=False):
            if self.a.json:
                self.line(_item_json(item))
            elif item.value is None:
                key = item.key.hex() if self.a.hex else _show(item.key)
                self.line(f"{key}\t{_size_text(item.size)}")
            elif self.a.hex:
                self.line(f"{item.key.hex()}\t{item.value.hex()}")
            else:
                self.line(f"{_show(item.key)}\t{_show(item.value)}")
        return 0

    async def export(self) -> int:
        ledger, page = self.lp
        async for item in self._entries(whole=True):
            if item.value is not None:
                self.line(_item_json(item))
                continue
            # Too large to list: streamed and encoded a chunk at a time.
            head = '{"key":"%s","priority":"%s","value":"' % (  # noqa: UP031
                base64.b64encode(item.key).decode(),
                item.priority,
            )
            self.out.write(head)
            carry = b""
            async for chunk in self.c.get_stream(ledger, page, item.key, at=self.at):
                data = carry + chunk
                cut = len(data) - len(data) % 3
                self.out.write(base64.b64encode(data[:cut]).decode())
                carry = data[cut:]
            self.line(base64.b64encode(carry).decode() + '"}')
        return 0

    async def import_(self) -> int:
        ledger, page = self.lp
        try:
            src: BinaryIO = open(self.a.file, "rb") if self.a.file else sys.stdin.buffer  # noqa: SIM115
        except OSError as e:
            raise UsageError(f"{self.a.file}: {e.strerror}") from None
        batch: list[tuple[bytes, bytes, str]] = []
        size = total = n = 0
        try:
            while raw := src.readline(IMPORT_LINE_LIMIT):
                n += 1
                if len(raw) == IMPORT_LINE_LIMIT and not raw.endswith(b"\n"):
                    total += await self._send(ledger, page, batch)
                    batch, size = [], 0
                    await self._put_streamed(ledger, page, raw, src, n)
                    total += 1
                    continue
                if not raw.strip():
                    continue
                key, value, prio = _parse_line(raw, n)
                if len(value) > IMPORT_INLINE_VALUE:
                    total += await self._send(ledger, page, batch)
                    batch, size = [], 0
                    total += await self._send(ledger, page, [(key, value, prio)])
                    continue
                batch.append((key, value, prio))
                size += len(key) + len(value)
                if len(batch) >= IMPORT_BATCH_ENTRIES or size >= self.batch_bytes:
                    total += await self._send(ledger, page, batch)
                    batch, size = [], 0
            total += await self._send(ledger, page, batch)
        finally:
            if src is not sys.stdin.buffer:
                src.close()
        print(f"imported {total} entries", file=sys.stderr)
        return 0

    async def _send(self, ledger: bytes, page: bytes, batch: list[tuple[bytes, bytes, str]]) -> int:
        """Write ``batch`` (in order): one batch request, split in halves while the daemon
        finds it over its ``max_batch_bytes``; a single entry that is goes as a PUT."""
        if not batch:
            return 0
        if len(batch) > 1 or len(batch[0][1]) <= IMPORT_INLINE_VALUE:
            try:
                return await self.c.batch(ledger, page, batch)
            except LedgerError as e:
                if e.code != "too_large":
                    raise
        if len(batch) == 1:
            key, value, prio = batch[0]
            await self.c.put(ledger, page, key, value, lazy=prio == "lazy")
            return 1
        half = len(batch) // 2
        self.batch_bytes = max(
            1, min(self.batch_bytes, sum(len(k) + len(v) for k, v, _ in batch) // 2)
        )
        return await self._send(ledger, page, batch[:half]) + await self._send(
            ledger, page, batch[half:]
        )

    async def _put_streamed(
        self, ledger: bytes, page: bytes, first: bytes, src: BinaryIO, n: int
    ) -> None:
        """A line too long to parse whole: key and priority first, then the value streamed
        into a PUT (the layout export writes)."""
        m = _STREAMED_HEAD.match(first)
        if m is None:
            raise UsageError(
                f"line {n}: a line over {IMPORT_LINE_LIMIT} bytes must be export's layout: "
                '{"key":...,"priority":...,"value":...}'
            )
        key = base64.b64decode(m.group(1))
        value = _StreamedValue(first[m.end() :], src, n)
        try:
            await self.c.put(ledger, page, key, value, lazy=m.group(2) == b"lazy")
        except Exception:
            if value.error is not None:
                raise value.error from None
            raise

    async def watch(self) -> int:
        ledger, page = self.lp
        prefix = self.b(self.a.prefix) if self.a.prefix else b""
        async for ch in self.c.watch(ledger, page, prefix):
            if self.a.json:
                self.line(
                    json.dumps(
                        {
                            "commit": ch.commit,
                            "changed": [
                                {
                                    "key": base64.b64encode(i.key).decode(),
                                    "value": None
                                    if i.value is None
                                    else base64.b64encode(i.value).decode(),
                                    "priority": i.priority,
                                    "size": i.size,
                                }
                                for i in ch.changed
                            ],
                            "deleted": [base64.b64encode(k).decode() for k in ch.deleted],
                        }
                    )
                )
                continue
            for i in ch.changed:
                shown = _show(i.value) if i.value is not None else _size_text(i.size)
                self.line(f"put\t{_show(i.key)}\t{shown}")
            for k in ch.deleted:
                self.line(f"delete\t{_show(k)}")
        # Only the daemon ends a watch (it is shutting down, or closed the page).
        print("ledgerctl: the daemon ended the watch", file=sys.stderr)
        return 1

    async def sync(self) -> int:
        ledger = self.b(self.a.ledger, "ledger") if self.a.ledger else None
        page = self.b(self.a.page, "page") if self.a.page else None
        res = await self.c.sync(ledger, page, timeout=self.a.timeout)
        print(
            f"synced: {res['uploaded_packs']} packs up, {res['downloaded_packs']} down, "
            f"{res['rounds']} rounds",
            file=sys.stderr,
        )
        return 0

    async def policy(self) -> int:
        doc = await self.c.policy(*self.lp, self.a.policy)
        conflict = f"  conflict: {doc['conflict']}" if doc.get("conflict") else ""
        self.line(f"{doc['policy']}  heads={doc['heads']}{conflict}")
        return 0

    async def heads(self) -> int:
        for h in await self.c.heads(*self.lp):
            self.line(h["id"])
        return 0

    async def log(self) -> int:
        for c in await self.c.history(*self.lp, limit=self.a.limit):
            merge = " merge" if c["merge"] else ""
            parents = ",".join(p[:12] for p in c["parents"]) or "-"
            self.line(
                f"{c['id']}  gen {c['generation']}  {_when(c['timestamp'])}{merge}"
                f"  parents {parents}"
            )
        return 0


def parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog="ledgerctl", description="Command-line client of ledgerd.")
    ap.add_argument("--version", action="version", version=f"ledgerctl {__version__}")
    ap.add_argument(
        "--socket", help="daemon socket (default: $LEDGERD_SOCKET or the daemon's default)"
    )
    ap.add_argument("--hex", action="store_true", help="keys, ledger names and page ids are hex")
    sub = ap.add_subparsers(dest="command", required=True, metavar="COMMAND")

    def cmd(name: str, help: str, *lp: str) -> argparse.ArgumentParser:
        p = sub.add_parser(name, help=help, description=help)
        for a in lp:
            p.add_argument(a)
        return p

    cmd("status", "show the daemon's state").add_argument("--json", action="store_true")
    cmd("ledgers", "list ledgers")
    cmd("pages", "list the pages of a ledger", "ledger")
    p = cmd(
        "put", "set a key (value from VALUE, --file or standard input)", "ledger", "page", "key"
    )
    p.add_argument("value", nargs="?")
    p.add_argument("--file", help="read the value from this file")
    p.add_argument(
        "--lazy", action="store_true", help="LAZY priority: other devices fetch on first read"
    )
    p = cmd("get", "write a value to standard output (or -o FILE)", "ledger", "page", "key")
    p.add_argument("-o", "--output", help="write the value to this file")
    p.add_argument("--at", help="read at this commit (hex id)")
    cmd("delete", "delete a key", "ledger", "page", "key")
    cmd("clear", "delete every entry of a page", "ledger", "page")
    p = cmd("ls", "list entries: key<TAB>value per line (or --json)", "ledger", "page")
    for opt in ("--prefix", "--start", "--end"):
        p.add_argument(opt)
    p.add_argument("--limit", type=int)
    p.add_argument("--at", help="list at this commit (hex id)")
    p.add_argument(
        "--json",
        action="store_true",
        help='one {"key","priority","value"} (base64; null and "size" over 1 MiB) per line',
    )
    p = cmd("watch", "print every change until interrupted", "ledger", "page")
    p.add_argument("--prefix")
    p.add_argument("--json", action="store_true", help="one JSON object per commit")
    p = cmd("import", "write entries in the 'ls --json' format in large batches", "ledger", "page")
    p.add_argument("file", nargs="?", help="(default: standard input)")
    cmd("export", "the whole page in the 'ls --json' format", "ledger", "page")
    p = cmd("sync", "upload pending changes, fetch and merge remote ones, until quiet")
    p.add_argument("ledger", nargs="?")
    p.add_argument("page", nargs="?")
    p.add_argument("--timeout", type=float, default=60.0, help="give up after S seconds")
    p = cmd("policy", "show or set the page's merge policy", "ledger", "page")
    p.add_argument(
        "policy", nargs="?", choices=["last_one_wins", "automatic_with_fallback", "custom"]
    )
    cmd("heads", "list the page's head commits", "ledger", "page")
    p = cmd("log", "commit history, newest first", "ledger", "page")
    p.add_argument("--limit", type=int, default=20)
    cli_doc.add_parser(sub)  # ledgerctl doc ... (daemon/cli_doc.py)
    # -- subcommands of their own modules (each sets a handler(args, client)) ---------
    from ledgerd.daemon import cli_check

    cli_check.register(sub)
    return ap


async def run(args: argparse.Namespace) -> int:
    async with AsyncClient(args.socket) as client:
        if (handler := getattr(args, "handler", None)) is not None:  # see parser()
            return int(await handler(args, client))
        cli = Cli(args, client)
        if args.command == "doc":  # ledgerctl doc ... (daemon/cli_doc.py)
            return await cli_doc.run(cli, UsageError)
        name = {"import": "import_"}.get(args.command, args.command)
        return int(await getattr(cli, name)())


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)
    try:
        return asyncio.run(run(args))
    except UsageError as e:
        print(f"ledgerctl: {e}", file=sys.stderr)
        return EXIT_USAGE
    except UnsafeSocketError as e:
        print(f"ledgerctl: {e}", file=sys.stderr)
        return EXIT_USAGE
    except DaemonUnavailableError as e:
        print(f"ledgerctl: {e} (is ledgerd running? start it with: ledgerd)", file=sys.stderr)
        return EXIT_UNAVAILABLE
    except NotFoundError as e:
        print(f"ledgerctl: {e}", file=sys.stderr)
        return EXIT_NOT_FOUND
    except LedgerError as e:
        print(f"ledgerctl: {e} ({e.code})", file=sys.stderr)
        return EXIT_USAGE if e.status in (400, 413, 416) else EXIT_ERROR
    except KeyboardInterrupt:
        return 130
    except BrokenPipeError:
        with contextlib.suppress(Exception):
            sys.stdout.close()
        return 0


if __name__ == "__main__":
    sys.exit(main())
