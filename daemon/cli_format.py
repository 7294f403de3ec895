"""``ledgerctl``'s formats: command-line arguments in, keys, names and records out.

Arguments become bytes in one of three ways: as the exact bytes given (``os.fsencode``),
as hex (``--hex``), or, for keys, as a tuple literal packed with FoundationDB's tuple
layer (``--tuple``). Bytes become text in the three ways ``ledgerctl`` prints them: keys
and values escaped on one line (:func:`show`), ledger and page names as text or hex
(:func:`show_name`), tuple keys in the Python syntax ``--tuple`` reads back
(:func:`show_tuple`). ``--json`` records are built here too, so that every command
writes the same shape (see :func:`entry_doc`, :func:`name_doc`).

It does no I/O and knows nothing of the daemon; :mod:`ledgerd.daemon.cli_commands` has
the commands.
"""

from __future__ import annotations

import argparse
import ast
import base64
import math
import os
import re
import uuid
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from ledgerd.daemon.cli_exit import UsageError as UsageError
from ledgerd.daemon.client import Item
from ledgerd.daemon.client_types import b64
from ledgerd.store import SingleFloat, Versionstamp
from ledgerd.store.errors import counted as counted  # (the CLI's commands use it from here)
from ledgerd.store.errors import named
from ledgerd.store.keys import tuple as fdbtuple

# -- arguments in ---------------------------------------------------------------------


def file_arg(value: str | None) -> Path | None:
    """A FILE argument as a path; None for standard input or output (absent, or ``-``)."""
    return None if value in (None, "-") else Path(value)


def arg_bytes(text: str, hex_mode: bool, what: str) -> bytes:
    """An argument's bytes: exactly the bytes given on the command line (even when they
    are not valid UTF-8, through ``os.fsencode``), or hex-decoded with ``--hex``."""
    if not hex_mode:
        return os.fsencode(text)
    try:
        return bytes.fromhex(text)
    except ValueError:
        raise UsageError(f"{what} {text!r} is not valid hex") from None


def _uuid(text: str) -> uuid.UUID:
    if not isinstance(text, str):
        raise TypeError("UUID() takes a string")
    return uuid.UUID(text)


def _float(text: str) -> float:
    if not isinstance(text, str) or text.strip().lower().lstrip("+-") not in ("nan", "inf"):
        raise TypeError("float() takes 'nan', 'inf' or '-inf' (write other floats as numbers)")
    return float(text)


_CALLS: dict[str, Any] = {
    "UUID": _uuid,
    "uuid.UUID": _uuid,
    "SingleFloat": SingleFloat,
    "Versionstamp": Versionstamp,
    "float": _float,
}
"""The calls a tuple literal may contain: the element types that have no literal of their
own, written as :func:`show_tuple` prints them. Their arguments are literals."""


def _call_name(node: ast.expr) -> str:
    if isinstance(node, ast.Name):
        return node.id
    if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name):
        return f"{node.value.id}.{node.attr}"
    return _brief(ast.unparse(node))


def _brief(text: str, most: int = 60) -> str:
    return text if len(text) <= most else text[: most - 3] + "..."


def _element(node: ast.expr) -> Any:
    """A tuple element: a literal (``ast.literal_eval``), a nested tuple or list, or one of
    the calls in :data:`_CALLS` with literal arguments. Nothing is executed."""
    if isinstance(node, ast.Tuple | ast.List):
        return tuple(_element(e) for e in node.elts)
    if isinstance(node, ast.Call):
        name = _call_name(node.func)
        if name not in _CALLS:
            raise ValueError(f"{name}(...) is not allowed (only {', '.join(_CALLS)})")
        if node.keywords:  # UUID(int=5): not what show_tuple prints
            arg = node.keywords[0].arg
            kw = "**" if arg is None else f"{arg}="
            raise ValueError(f"{name}() takes literal arguments by position, not {kw}")
        return _CALLS[name](*(_element(a) for a in node.args))
    try:
        value = ast.literal_eval(node)
    except ValueError:
        raise ValueError(f"{_brief(ast.unparse(node))} is not a literal (quote strings)") from None
    if isinstance(value, dict | set | frozenset | complex):
        raise ValueError(f"a {type(value).__name__} cannot be a tuple element")
    return value


def parse_tuple(text: str, what: str) -> tuple[Any, ...]:
    """A tuple literal in Python syntax (``("user", 42)``): its value, or UsageError."""
    try:
        tree = ast.parse(text.strip(), mode="eval")
        if not isinstance(tree.body, ast.Tuple):
            hint = " (one element needs a comma: ('x',))" if "," not in text else ""
            raise ValueError(f"not a tuple{hint}")
        value = _element(tree.body)
        assert isinstance(value, tuple)
        fdbtuple.pack(value)  # what cannot be packed is refused here, with the literal
    except (SyntaxError, ValueError, TypeError, MemoryError, RecursionError) as e:
        why = e.msg if isinstance(e, SyntaxError) else str(e) or type(e).__name__
        raise UsageError(f"{what} {_brief(text)!r} is not a tuple literal: {why}") from None
    return value


def pack_tuple(text: str, what: str) -> bytes:
    return fdbtuple.pack(parse_tuple(text, what))


def tuple_range(text: str, what: str) -> tuple[bytes, bytes]:
    """``--prefix`` with ``--tuple``: the keys of the longer tuples that start with it."""
    r = fdbtuple.range(parse_tuple(text, what))
    return r.start, r.stop


# -- bytes out ------------------------------------------------------------------------

_ESCAPES = {"\\": "\\\\", "\t": "\\t", "\n": "\\n", "\r": "\\r"}


def show(data: bytes) -> str:
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


def text_or_none(data: bytes) -> str | None:
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError:
        return None


def show_name(data: bytes, hex_mode: bool = False) -> str:
    """A ledger name or page id: its text when it is printable UTF-8, else ``hex:`` and
    its hex (give it back with ``--hex``); only hex with ``--hex``."""
    return data.hex() if hex_mode else named(data)


def show_b64_name(b64: str) -> str:
    """A name as the daemon's JSON gives it (base64): see :func:`show_name`."""
    return show_name(base64.b64decode(b64))


def _show_element(v: Any) -> str:
    if isinstance(v, tuple):
        return show_tuple(v)
    if isinstance(v, float) and not math.isfinite(v):
        return f"float({str(v)!r})"
    if isinstance(v, uuid.UUID):
        return f"UUID({str(v)!r})"
    if isinstance(v, SingleFloat):
        return f"SingleFloat({_show_element(v.value)})"
    return repr(v)


def show_tuple(t: tuple[Any, ...]) -> str:
    """A tuple in the Python syntax that :func:`parse_tuple` reads back."""
    inner = ", ".join(_show_element(v) for v in t)
    return f"({inner},)" if len(t) == 1 else f"({inner})"


def show_key(key: bytes, hex_mode: bool, tuple_mode: bool) -> str:
    """A key in a listing: a tuple with ``--tuple`` (hex when it is not one), hex with
    ``--hex``, else :func:`show`."""
    if tuple_mode:
        try:
            return show_tuple(fdbtuple.unpack(key))
        except ValueError:
            return key.hex()
    return key.hex() if hex_mode else show(key)


def size_text(n: int | None) -> str:
    """``<300.0 MiB>``: what ``ls`` prints instead of a value too large to list;
    ``<not on this device>`` for a LAZY value that ``watch`` saw come through sync."""
    if n is None:
        return "<not on this device>"
    for unit, scale in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if n >= scale:
            return f"<{n / scale:.1f} {unit}>"
    return f"<{n} bytes>"


def human_bytes(n: int) -> str:
    return size_text(n)[1:-1]


def when(us: int) -> str:
    return datetime.fromtimestamp(us / 1e6, UTC).isoformat(timespec="milliseconds")


def when_s(s: float) -> str:
    return datetime.fromtimestamp(s, UTC).isoformat(timespec="seconds")


# -- --json records -------------------------------------------------------------------


def entry_doc(item: Item) -> dict[str, Any]:
    """An entry: key, priority, value (base64) in this order; a value over the listing's
    inline limit is ``null``, with its ``size``. ``import`` reads these."""
    doc: dict[str, Any] = {
        "key": b64(item.key),
        "priority": item.priority,
        "value": None if item.value is None else b64(item.value),
    }
    if item.value is None:
        doc["size"] = item.size
    return doc


def name_doc(field: str, name: bytes) -> dict[str, Any]:
    """A ledger name or page id as the daemon's JSON has it: base64 and text (or null)."""
    return {field: b64(name), f"{field}_text": text_or_none(name)}


def positive_int(text: str) -> int:
    """An option's count (``--limit``): a positive integer, or argparse's usage error
    (exit status 2) rather than a listing that silently stops at nothing."""
    if re.fullmatch(r"-?[0-9]+", text, re.ASCII) is None:  # int() takes '1_0', ' 2', '١'
        raise argparse.ArgumentTypeError(f"{text!r:.40} is not an integer")
    try:
        n = int(text)
    except ValueError:  # over int()'s digit limit
        raise argparse.ArgumentTypeError(f"{text!r:.40} is not an integer") from None
    if n < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1, not {n}")
    return n
