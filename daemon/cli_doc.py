"""``ledgerctl doc``: documents from the command line.

This module owns the ``doc`` subcommands (their arguments and output) on
:class:`~ledgerd.daemon.client_docs.AsyncDocuments`. The rest of ``ledgerctl``
(global options, the client, exit statuses) is :mod:`daemon.cli`'s, which
runs these with :func:`run`; :mod:`daemon.cli_parser` registers them with
:func:`add_parser`.

Output: ``put``, ``rm``, ``purge``, ``detach`` print ``_id<TAB>_rev``; ``indexes``
prints ``name<TAB>partition<TAB>sort<TAB>ready|building`` (``--json``: one object a
line); ``attach`` prints ``attachment id<TAB>_rev``; ``ls`` and ``find`` print
``_id<TAB>_rev<TAB>_data`` (compact JSON; ``deleted`` or ``purged`` as a fourth
column) or, with ``--json``, one whole document per line; ``get`` prints the
document; ``changes`` one ``{"commit", "documents"}`` line per batch. ``ls`` and
``find`` list past a document that cannot be shown, name it on stderr and exit 4.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import mimetypes
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

from ledgerd.daemon.cli_command import Command
from ledgerd.daemon.cli_exit import EXIT_ERROR
from ledgerd.daemon.cli_format import file_arg, positive_int
from ledgerd.daemon.cli_stdio import blocking, write_all
from ledgerd.daemon.client_docs import AsyncDocuments, Doc
from ledgerd.daemon.client_types import LedgerError

DESCRIPTION = """documents of a page (see "Documents through the daemon" in docs/documents.md).
Output: put, rm, purge, detach print _id<TAB>_rev; indexes prints
name<TAB>partition<TAB>sort<TAB>ready|building; attach prints attachment id<TAB>_rev; ls and
find print _id<TAB>_rev<TAB>_data (compact JSON; deleted or purged as a fourth column)
or, with --json, one whole document per line; get prints the document; changes one
{"commit", "documents", "next"} line per batch."""


def add_parser(sub: Any) -> None:
    """``doc`` and its subcommands, under ``ledgerctl``'s subparsers ``sub``."""
    doc = sub.add_parser("doc", help="documents (see 'ledgerctl doc -h')", description=DESCRIPTION)
    cmds = doc.add_subparsers(dest="doc_command", required=True, metavar="SUBCOMMAND")

    def cmd(name: str, help: str, *args: str) -> argparse.ArgumentParser:
        p: argparse.ArgumentParser = cmds.add_parser(name, help=help, description=help)
        for a in ("ledger", "page", *args):
            p.add_argument(a)
        return p

    _add_documents(cmd)
    _add_indexes(cmd)
    _add_attachments(cmd)
    p = cmd("changes", "documents changed since a commit, as JSON lines")
    p.add_argument("--since", metavar="COMMIT", help="a commit id (hex) from an earlier line")
    p.add_argument("--collection")
    p.add_argument("--follow", action="store_true", help="then every later change")


_Cmd = Callable[..., argparse.ArgumentParser]
"""``cmd(name, help, *positionals)``: a ``doc`` subcommand's parser."""


def _add_documents(cmd: _Cmd) -> None:
    """``put``, ``get``, ``ls``, ``rm`` and ``purge``."""
    p = cmd(
        "put",
        "create a document (or write --id); prints _id and _rev. Example: ledgerctl doc put "
        'app people people \'{"name": "Ann"}\' --id ann@example.com',
        "collection",
    )
    p.add_argument("data", metavar="JSON", help="the document's _data ('-': standard input)")
    p.add_argument(
        "--id",
        help="the document's id: created with it when it is free (any text of 1-512 bytes "
        "of UTF-8, no leading _), replaced otherwise",
    )
    p.add_argument("--rev", help="only if its current revision is REV (with --id)")
    p = cmd("get", "print a document as JSON", "collection", "id")
    p.add_argument("--deleted", action="store_true", help="a deleted document too")
    p.add_argument(
        "--conflicts",
        action="store_true",
        help="with its kept conflicts' revisions (_meta._conflicts)",
    )
    p.add_argument("--rev", help="that revision: the current one or a kept conflict's")
    p = cmd("ls", "list a collection's documents in _id order", "collection")
    p.add_argument("--json", action="store_true", help="one whole document per line")
    p.add_argument("--deleted", action="store_true", help="deleted documents too")
    p.add_argument("--limit", type=positive_int)
    for name, help in (("rm", "delete a document (soft)"), ("purge", "purge a document")):
        p = cmd(name, help + "; prints _id and the new _rev", "collection", "id")
        p.add_argument(
            "--rev",
            help="only if its current revision is REV"
            + ("; REV a kept conflict's: remove that conflict" if name == "rm" else ""),
        )


def _add_indexes(cmd: _Cmd) -> None:
    """``index``, ``indexes``, ``drop-index``, ``rebuild-index`` and ``find``."""
    p = cmd("index", "declare an index", "collection", "name")
    p.add_argument(
        "--partition",
        required=True,
        metavar="PATH",
        help="e.g. address.city, or a JSON array of names: '[\"a.b\"]' for a field named a.b",
    )
    p.add_argument("--sort", metavar="PATH")
    p = cmd("indexes", "list a collection's indexes: name, partition, sort, state", "collection")
    p.add_argument("--json", action="store_true", help="one index per line, as JSON")
    cmd("drop-index", "drop an index (its entries go; the documents stay)", "collection", "name")
    cmd("rebuild-index", "build an index again from the documents", "collection", "name")
    p = cmd("find", "query an index (VALUEs are JSON, or else strings)", "collection", "name")
    p.add_argument("--eq", required=True, metavar="VALUE", help="the partition value")
    p.add_argument("--start", metavar="VALUE", help="sort values from VALUE (included)")
    p.add_argument("--end", metavar="VALUE", help="sort values up to VALUE (excluded)")
    p.add_argument("--json", action="store_true", help="one whole document per line")
    p.add_argument("--deleted", action="store_true", help="deleted documents too")
    p.add_argument("--limit", type=positive_int)


def _add_attachments(cmd: _Cmd) -> None:
    """``attach``, ``detach`` and ``attachment``."""
    p = cmd("attach", "attach a file; prints the attachment id and _rev", "collection", "id")
    p.add_argument("file")
    p.add_argument("--name", help="its filename (default: FILE's name)")
    p.add_argument("--type", help="its content type (default: guessed from the name)")
    p.add_argument("--replace", metavar="ATTACHMENT_ID", help="replace this attachment")
    p.add_argument("--rev", help="only if the document's current revision is REV")
    p = cmd("detach", "remove an attachment; prints _id and the new _rev", "collection", "id")
    p.add_argument("attachment_id")
    p.add_argument("--rev", help="only if the document's current revision is REV")
    p = cmd(
        "attachment",
        "write an attachment to standard output (or -o FILE)",
        "collection",
        "id",
        "attachment_id",
    )
    p.add_argument("-o", "--output", help="write it to this file ('-': standard output)")


async def _put_id(docs: AsyncDocuments, collection: str, doc_id: str, data: Any) -> Doc:
    """``put --id`` without ``--rev``: the document created with that id, or, when a
    document has it, a new revision of whatever revision is current."""
    try:
        return await docs.create(collection, data, id=doc_id)
    except LedgerError as e:
        if e.code != "conflict":
            raise
    return await docs.replace(collection, doc_id, data)


def _value(text: str) -> Any:
    """A command-line VALUE: JSON if it parses as JSON, else the text as a string."""
    try:
        return json.loads(text)
    except ValueError:
        return text


def _bound(text: str | None, option: str, usage: type[Exception]) -> Any:
    """``find``'s ``--start``/``--end`` VALUE, or None without one. ``null`` is refused, as
    the HTTP API refuses it: the client sends no bound for None, and null is the lowest
    sort value, not "no bound" (``--end null`` would list every document, not none)."""
    if text is None:
        return None
    value = _value(text)
    if value is None:
        raise usage(
            f"{option} null: null is the lowest sort value, not a bound;"
            " leave it out for an open range"
        )
    return value


def _not_json(name: str) -> Any:
    raise ValueError(f"{name} is not a JSON value")


def _path(text: str) -> str | list[str]:
    """A command-line index PATH: a JSON array of names (``'["a.b"]'``, a name holding a
    dot), else dotted text (``address.city``)."""
    if not text.startswith("["):
        return text
    with contextlib.suppress(ValueError):
        names = json.loads(text)
        if isinstance(names, list) and all(isinstance(n, str) for n in names):
            return names
    return text


def _compact(value: Any) -> str:
    return json.dumps(value, ensure_ascii=False, separators=(",", ":"))


def _row(d: Doc) -> str:
    meta = d["_meta"]
    state = "\tpurged" if meta.get("_purged") else "\tdeleted" if meta.get("_deleted") else ""
    return f"{meta['_id']}\t{meta['_rev']}\t{_compact(d['_data'])}{state}"


async def run(cli: Command, usage: type[Exception]) -> int:
    """Run ``ledgerctl doc SUBCOMMAND``; ``usage`` is the error for a wrong command line."""
    command = _DocCommand(cli, usage)
    name = cli.a.doc_command.replace("-", "_")
    return int(await getattr(command, _ALIASES.get(name, name))())


_ALIASES = {"find": "ls", "purge": "rm", "index": "declare_index"}
"""The subcommands that share a method (or whose name is not a method's)."""


class _DocCommand:
    """The ``doc`` subcommands, a method each (its exit status)."""

    def __init__(self, cli: Command, usage: type[Exception]) -> None:
        self.cli, self.a, self.usage = cli, cli.a, usage
        self.docs = AsyncDocuments(cli.c, *cli.lp)

    def _written(self, d: Doc) -> int:
        self.cli.line(f"{d['_meta']['_id']}\t{d['_meta']['_rev']}")
        return 0

    async def put(self) -> int:
        a, usage = self.a, self.usage
        text = sys.stdin.read() if a.data == "-" else a.data
        try:
            data = json.loads(text, parse_constant=_not_json)
            json.dumps(data, allow_nan=False)  # 1e400 parses as inf, which JSON cannot hold
        except ValueError as e:
            if isinstance(e, json.JSONDecodeError) or "Out of range float" not in str(e):
                raise usage(f"JSON: not valid JSON: {e}") from None
            raise usage("JSON: a number is past the largest double (1.8e308)") from None
        if a.rev is not None and a.id is None:
            raise usage("--rev needs --id (a new document has no revision to expect)")
        if a.id is None:
            return self._written(await self.docs.create(a.collection, data))
        if a.rev is None:
            return self._written(await _put_id(self.docs, a.collection, a.id, data))
        return self._written(await self.docs.replace(a.collection, a.id, data, rev=a.rev))

    async def get(self) -> int:
        a = self.a
        doc = await self.docs.get(
            a.collection, a.id, deleted=a.deleted, conflicts=a.conflicts, rev=a.rev
        )
        self.cli.line(_compact(doc) if a.json else json.dumps(doc, indent=2))
        return 0

    async def ls(self) -> int:
        """``ls`` and ``find``."""
        a, docs = self.a, self.docs
        damaged: list[dict[str, Any]] = []
        if a.doc_command == "ls":
            found = docs.list_documents(
                a.collection, deleted=a.deleted, limit=a.limit, on_damaged=damaged.append
            )
        else:
            found = docs.find(
                a.collection,
                a.name,
                _value(a.eq),
                start=_bound(a.start, "--start", self.usage),
                end=_bound(a.end, "--end", self.usage),
                deleted=a.deleted,
                limit=a.limit,
                on_damaged=damaged.append,
            )
        async for d in found:
            self.cli.line(_compact(d) if a.json else _row(d))
        for d in damaged:  # (listed past, as the daemon does: exit 4 at the end)
            print(f"ledgerctl: {d['message']}", file=sys.stderr)
        return EXIT_ERROR if damaged else 0

    async def rm(self) -> int:
        """``rm`` and ``purge``."""
        a = self.a
        op = self.docs.delete if a.doc_command == "rm" else self.docs.purge
        return self._written(await op(a.collection, a.id, rev=a.rev))

    async def declare_index(self) -> int:
        a = self.a
        sort = None if a.sort is None else _path(a.sort)
        info = await self.docs.declare_index(a.collection, a.name, _path(a.partition), sort)
        self.cli.line(f"{info['name']}\t{'ready' if info['ready'] else 'building'}")
        return 0

    async def indexes(self) -> int:
        for info in await self.docs.indexes(self.a.collection):
            if self.a.json:
                self.cli.line(_compact(info))
            elif info.get("code") is not None:  # a definition this ledgerd cannot read
                self.cli.line(f"{info['name']}\t-\t-\t{info['code']}")
            else:
                sort = "-" if info["sort"] is None else _compact(info["sort"])
                state = "ready" if info["ready"] else "building"
                self.cli.line(f"{info['name']}\t{_compact(info['partition'])}\t{sort}\t{state}")
        return 0

    async def drop_index(self) -> int:
        await self.docs.drop_index(self.a.collection, self.a.name)
        return 0

    async def rebuild_index(self) -> int:
        await self.docs.rebuild_index(self.a.collection, self.a.name)
        return 0

    async def detach(self) -> int:
        a = self.a
        d = await self.docs.delete_attachment(a.collection, a.id, a.attachment_id, rev=a.rev)
        return self._written(d)

    async def attach(self) -> int:
        a = self.a
        path = Path(a.file)
        if path.is_dir():
            raise self.usage(f"{path}: is a directory")
        if not path.is_file():
            raise self.usage(f"{path}: no such file")
        name = a.name or path.name
        ctype = a.type or mimetypes.guess_type(name)[0] or "application/octet-stream"
        res = await self.docs.put_attachment(
            a.collection,
            a.id,
            path,
            filename=name,
            content_type=ctype,
            attachment_id=a.replace,
            rev=a.rev,
        )
        self.cli.line(f"{res['attachment']['_id']}\t{res['document']['_meta']['_rev']}")
        return 0

    async def attachment(self) -> int:
        a = self.a
        if (target := file_arg(a.output)) is not None:
            if not target.parent.is_dir():
                raise self.usage(f"-o {target}: directory {target.parent} does not exist")
            try:
                await self.docs.attachment_to_file(a.collection, a.id, a.attachment_id, target)
            except (PermissionError, IsADirectoryError) as e:
                raise self.usage(f"-o {target}: {e.strerror}") from None
            return 0
        sys.stdout.flush()
        out = sys.stdout.buffer
        out.flush()
        async for chunk in self.docs.attachment_stream(a.collection, a.id, a.attachment_id):
            await blocking.run(write_all, out.fileno(), chunk)
        return 0

    async def changes(self) -> int:
        a = self.a
        if not a.follow:
            async for page in self.docs.all_changes(a.since, collection=a.collection):
                self.cli.line(_compact(page))
            return 0
        async for batch in self.docs.follow(a.since, collection=a.collection):
            self.cli.line(_compact(batch))
        print("ledgerctl: the daemon ended the changes feed", file=sys.stderr)
        return 1
