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
import sys
import time
from collections.abc import AsyncIterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, BinaryIO, TextIO

from ledgerd.daemon import __version__
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
PROGRESS_MIN = 8 * 1024 * 1024


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


def _item_json(item: Item, value: bytes) -> str:
    return json.dumps(
        {
            "key": base64.b64encode(item.key).decode(),
            "value": base64.b64encode(value).decode(),
            "priority": item.priority,
        },
        separators=(",", ":"),
    )


def _when(us: int) -> str:
    return datetime.fromtimestamp(us / 1e6, UTC).isoformat(timespec="milliseconds")


class Cli:
    def __init__(self, args: argparse.Namespace, client: AsyncClient) -> None:
        self.a = args
        self.c = client
        self.out = sys.stdout

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

    async def _items(self, whole: bool) -> AsyncIterator[tuple[Item, bytes]]:
        ledger, page = self.lp
        kw: dict[str, Any] = {"at": self.at}
        if not whole:
            kw.update(
                prefix=self.b(self.a.prefix) if self.a.prefix is not None else None,
                start=self.b(self.a.start) if self.a.start is not None else None,
                end=self.b(self.a.end) if self.a.end is not None else None,
                limit=self.a.limit,
            )
        async for item in self.c.entries(ledger, page, **kw):
            value = item.value
            if value is None:  # too large to travel inline: fetch it on its own
                value = await self.c.get(ledger, page, item.key, at=kw["at"])
            yield item, value

    async def ls(self) -> int:
        async for item, value in self._items(whole=False):
            if self.a.json:
                self.line(_item_json(item, value))
            elif self.a.hex:
                self.line(f"{item.key.hex()}\t{value.hex()}")
            else:
                self.line(f"{_show(item.key)}\t{_show(value)}")
        return 0

    async def export(self) -> int:
        async for item, value in self._items(whole=True):
            self.line(_item_json(item, value))
        return 0

    async def import_(self) -> int:
        ledger, page = self.lp
        try:
            src: BinaryIO = open(self.a.file, "rb") if self.a.file else sys.stdin.buffer  # noqa: SIM115
        except OSError as e:
            raise UsageError(f"{self.a.file}: {e.strerror}") from None
        batch: list[tuple[bytes, bytes, str]] = []
        size = total = 0
        try:
            for n, raw in enumerate(src, 1):
                if not raw.strip():
                    continue
                try:
                    doc = json.loads(raw.decode("utf-8"))
                    key = base64.b64decode(doc["key"], validate=True)
                    value = base64.b64decode(doc["value"], validate=True)
                    prio = doc.get("priority", "eager")
                    if prio not in ("eager", "lazy"):
                        raise ValueError(f"priority {prio!r}")
                except (ValueError, KeyError, TypeError, binascii.Error) as e:  # incl. bad UTF-8
                    raise UsageError(
                        f"line {n}: not an entry in the 'ls --json' format: {e}"
                    ) from None
                batch.append((key, value, prio))
                size += len(key) + len(value)
                if len(batch) >= IMPORT_BATCH_ENTRIES or size >= IMPORT_BATCH_BYTES:
                    total += await self.c.batch(ledger, page, batch)
                    batch, size = [], 0
            if batch:
                total += await self.c.batch(ledger, page, batch)
        finally:
            if src is not sys.stdin.buffer:
                src.close()
        print(f"imported {total} entries", file=sys.stderr)
        return 0

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
                shown = _show(i.value) if i.value is not None else f"<{i.size} bytes>"
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
        "--json", action="store_true", help='one {"key","value","priority"} (base64) per line'
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
    return ap


async def run(args: argparse.Namespace) -> int:
    async with AsyncClient(args.socket) as client:
        cli = Cli(args, client)
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
