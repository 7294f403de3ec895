"""How data travels as JSON between the daemon and its clients (HTTP and sessions).

This module owns the codecs: base64 for bytes (the one definition the API and
sessions share), priorities by name, commits and entries as JSON objects, a
batch's ops (versionstamped ones included), and parsing JSON from a client. It
does not own routes or transport (:mod:`daemon.api`, :mod:`daemon.session`).
"""

from __future__ import annotations

import base64
import binascii
import codecs
import json
import math
import re
import sys
from collections.abc import Sequence
from typing import Any

from ledgerd.daemon import errors as ae
from ledgerd.store import (
    Commit,
    KeyTooLargeError,
    Priority,
    RawEntry,
    StampedKey,
    StampedValue,
    VersionstampError,
    View,
    check_key,
)
from ledgerd.store.pieces import digest as dg

INLINE_VALUE_LIMIT = 1024 * 1024
"""``entries`` responses carry values up to this size; larger ones carry null and a size."""
ENTRY_GROUP = 128
"""Entries of a listing whose values are read at once (at most 128 x 64 KiB)."""


def b64(data: bytes) -> str:
    return base64.b64encode(data).decode()


def unb64(text: object, what: str, index: int | None = None) -> bytes:
    """Decode base64 from JSON; ``what`` names the field in the error (with
    ``index``, as ``ops[index].what``: formatted only when there is an error)."""
    try:
        if type(text) is not str:
            raise TypeError
        return binascii.a2b_base64(text, strict_mode=True)
    except (binascii.Error, ValueError, TypeError):
        name = what if index is None else f"ops[{index}].{what}"
        problem = "is not valid base64" if type(text) is str else "must be a base64 string"
        raise ae.BadRequest(f"{name} {problem}") from None


Change = tuple[bytes | StampedKey, bytes | StampedValue | None, Priority]
"""A change for :meth:`store.Page.write`: a stamped key or value is completed when written."""

STAMPED_OPS = ("set_versionstamped_key", "set_versionstamped_value")
OP_NAMES = "'put', 'delete', 'set_versionstamped_key' or 'set_versionstamped_value'"


def batch_changes(ops: list[Any], consume: bool = False) -> list[Change]:
    """The changes of a batch's ``ops``: ``{"op": "put", "key", "value", "priority"?}``,
    ``{"op": "delete", "key"}``, ``{"op": "set_versionstamped_key", "key", "value",
    "priority"?}`` (``key`` a template ending in its 4-byte offset) or ``{"op":
    "set_versionstamped_value", "key", "value", "priority"?}`` (``value`` a template),
    keys and values in base64. ``consume``: each op is dropped from ``ops`` (set to
    None) once decoded, so that a big batch's base64 and bytes are not held together.

    Well-formed puts and deletes take a lean loop; the first sign of trouble, or a
    versionstamped op, hands the rest of the list to the checking loop, whose error
    names the op and the field (and which decides alone whether the rest is good).
    """
    a2b, eager = binascii.a2b_base64, Priority.EAGER
    changes: list[Change] = []
    i = 0
    try:
        for i, op in enumerate(ops):  # noqa: B007 (i: where the checking loop goes on)
            kind = op["op"]
            if kind == "put":
                key, value = a2b(op["key"], strict_mode=True), a2b(op["value"], strict_mode=True)
                p = op.get("priority")
                changes.append((key, value, eager if p is None else parse_priority(p)))
            elif kind == "delete":
                changes.append((a2b(op["key"], strict_mode=True), None, eager))
            else:
                raise ValueError(kind)
            if consume:
                ops[i] = None
    except (KeyError, TypeError, ValueError, AttributeError, binascii.Error, ae.BadRequest):
        # The ops before i were good puts and deletes, which the checking loop takes
        # alike: it goes on from the op that stopped this one.
        return _checked_batch_changes(ops, changes, i, consume)
    return changes


def _checked_batch_changes(
    ops: list[Any], changes: list[Change] | None = None, start: int = 0, consume: bool = False
) -> list[Change]:
    changes = [] if changes is None else changes
    for i in range(start, len(ops)):
        op = ops[i]
        if not isinstance(op, dict):
            raise ae.BadRequest(f"ops[{i}] must be an object")
        kind = op.get("op")
        if kind != "put" and kind != "delete" and kind not in STAMPED_OPS:
            raise ae.BadRequest(f"ops[{i}].op must be {OP_NAMES}")
        key = unb64(op.get("key"), "key", i)
        if kind == "delete":
            changes.append((key, None, Priority.EAGER))
        else:
            value = unb64(op.get("value"), "value", i)
            p = op.get("priority")
            prio = Priority.EAGER if p is None else parse_priority(p)
            if kind == "put":
                changes.append((key, value, prio))
            elif kind == "set_versionstamped_key":
                changes.append((stamped_key(key, f"ops[{i}].key"), value, prio))
            else:
                changes.append((key, stamped_value(value, f"ops[{i}].value"), prio))
        if consume:
            ops[i] = None
    return changes


def batch_body_changes(body: list[bytes]) -> tuple[list[Change], int | None]:
    """The changes of a batch body ``{"ops": [...]}`` (:func:`batch_changes`), its keys
    checked (:func:`store.check_key`), and their :func:`stamp_offset`; taken out of
    ``body``, a one-item list.

    Made for a big body, on a thread (:func:`store.off_loop`): a body of over
    :data:`WHOLE_PARTS` parts is parsed an op at a time and its ops decoded a group at a
    time (:func:`_plain_batch_changes`), so that about two copies of the body are held
    at once (its bytes and its values), rather than bytes, text, ops and values."""
    data = body.pop()
    changes = _plain_batch_changes(data) if len(data) > WHOLE_PARTS * TEXT_PART else None
    if changes is None:  # small, another shape, or not JSON: parsed whole (which says why)
        doc = parse_json(data, "batch body")
        del data
        ops = doc.get("ops") if isinstance(doc, dict) else None
        if not isinstance(ops, list):
            raise ae.BadRequest('batch body must be {"ops": [...]}')
        del doc
        changes = batch_changes(ops, consume=True)
    else:
        del data
    for change in changes:  # refused before the page is made, as a bad template is
        if type(change[0]) is bytes:  # (a versionstamped key is checked when stamped)
            check_key(change[0])
    return changes, stamp_offset(changes)


def stamped_key(template: bytes, what: str) -> StampedKey:
    """``template`` as a key to complete with a versionstamp; 400 naming ``what`` if it
    is not one (no incomplete versionstamp at its trailing offset, or too long)."""
    try:
        return StampedKey(template)
    except KeyTooLargeError as e:
        raise ae.KeyTooLarge(f"{what}: {e}") from None
    except VersionstampError as e:
        raise ae.BadRequest(f"{what}: {e}") from None


def stamped_value(template: bytes, what: str) -> StampedValue:
    """``template`` as a value to complete with a versionstamp; 400 naming ``what``."""
    try:
        return StampedValue(template)
    except VersionstampError as e:
        raise ae.BadRequest(f"{what}: {e}") from None


def stamp_offset(changes: list[Change]) -> int | None:
    """Where the stamp sits in the first stamped key or value of a write (a write takes
    one stamp), to read it from the first completed one; None if nothing is stamped."""
    for key, value, _ in changes:
        stamped = key if isinstance(key, StampedKey) else value
        if isinstance(stamped, StampedKey | StampedValue):
            return int.from_bytes(stamped.template[-4:], "little")
    return None


def parse_json(data: bytes | str, what: str) -> Any:
    """Decode JSON from a client: any failure is a 400 naming ``what``. Besides syntax
    errors, that covers what ``json`` raises on hostile input: nesting deep enough to
    exhaust the recursion limit, integers past Python's int-string conversion limit
    (both ValueError or RecursionError, not JSONDecodeError), bodies that are not
    UTF-8, ``NaN``/``Infinity`` (not JSON: Python's json would take them), and strings
    holding half a UTF-16 pair (``"\\ud800"``: valid JSON that no UTF-8 text can hold,
    so it could be neither stored nor answered)."""
    try:
        if isinstance(data, bytes):
            text, decoded = data.decode(), True
        else:
            text, decoded = data, False
        value = json.loads(text, parse_constant=_not_json)
        if may_hold_surrogate(text, decoded):  # rare: only then can a string be unencodable
            json.dumps(value, ensure_ascii=False).encode()
        return value
    except UnicodeEncodeError:
        raise ae.BadRequest(
            f"{what} is not valid JSON: a string holds a lone UTF-16 surrogate"
        ) from None
    except RecursionError:
        raise ae.BadRequest(f"{what} is nested too deeply") from None
    except ValueError as e:  # JSONDecodeError, UnicodeDecodeError, int-string limit
        if not isinstance(e, json.JSONDecodeError) and "integer string conversion" in str(e):
            # (Python's message ends with advice for this server's code: not for clients)
            limit = sys.get_int_max_str_digits()
            raise ae.BadRequest(f"{what} holds an integer of over {limit} digits") from None
        raise ae.BadRequest(f"{what} is not valid JSON: {e}") from None


_SURROGATE = re.compile(r"\\u[dD][89a-fA-F]|[\ud800-\udfff]")
"""An escaped UTF-16 surrogate in JSON text (or a raw one in a ``str``), the only ways
a decoded string can hold a lone surrogate."""


def may_hold_surrogate(text: str, decoded: bool) -> bool:
    """Whether JSON ``text`` may hold a UTF-16 surrogate (:data:`_SURROGATE`): escaped,
    or raw unless ``decoded`` (text that UTF-8 decoding made holds no raw one).

    Most bodies (a batch's base64, say) hold no ``\\u`` escape at all: a substring test
    answers for them, and only the rest are searched with the pattern, whose search
    of every body cost a batch a large share of the event loop's time."""
    if "\\u" not in text and (decoded or text.isascii()):
        return False
    return _SURROGATE.search(text) is not None


def _not_json(name: str) -> Any:
    raise ValueError(f"{name} is not a JSON value")


_DECODER = json.JSONDecoder(parse_constant=_not_json)
_BLANKS = re.compile(r"[ \t\n\r]*")
_OPS_START = re.compile(r'[ \t\n\r]*\{[ \t\n\r]*"ops"[ \t\n\r]*:[ \t\n\r]*\[[ \t\n\r]*')


TEXT_PART = 1024 * 1024
"""Bytes of a batch body decoded to text at a time (:func:`_plain_batch_changes`)."""
OPS_GROUP = 1024
"""Ops of a big batch body parsed before they are decoded (:func:`_plain_batch_changes`)."""
WHOLE_PARTS = 4
"""A batch body of at most this many :data:`TEXT_PART` is parsed whole, by one
``json.loads``: it holds the GIL about 3 ms a MiB, and parsing op by op took four times
the CPU (a batch of 10,000 small puts spent a fifth of its time there)."""


class _BodyText:
    """A batch body's text, decoded a :data:`TEXT_PART` at a time, and a position ``i``
    in what is left of it (:func:`_plain_batch_changes`)."""

    def __init__(self, body: bytes) -> None:
        decoder = codecs.getincrementaldecoder("utf-8")()
        view = memoryview(body)
        self.parts = (
            decoder.decode(view[i : i + TEXT_PART], i + TEXT_PART >= len(body))
            for i in range(0, len(body), TEXT_PART)
        )
        self.text, self.i = "", 0

    def more(self) -> bool:
        """Append the next part to what is left of the text; False at the end."""
        part = next(self.parts, None)
        if part is None:
            return False
        self.text, self.i = self.text[self.i :] + part, 0
        return True

    def past_blanks(self) -> bool:
        """Move ``i`` past blanks; False if the text ends there."""
        while True:
            m = _BLANKS.match(self.text, self.i)
            self.i = self.i if m is None else m.end()
            if self.i < len(self.text) or not self.more():
                return self.i < len(self.text)

    def op(self) -> list[Any] | None:
        """``[op]``, the JSON value at ``i`` (``i`` moves past it); None when it is not
        one, is over a part or two long, or holds an escaped UTF-16 surrogate."""
        while True:
            try:
                op, end = _DECODER.raw_decode(self.text, self.i)
                whole = end < len(self.text)  # else a number may go on in the next part
            except ValueError:
                whole = False
            if whole:
                break
            # The op may go on in the next part (or be bad); one of over a part or two
            # is parsed whole by the caller.
            if len(self.text) - self.i > 2 * TEXT_PART or not self.more():
                return None
        if self.text.find("\\u", self.i, end) != -1 and _SURROGATE.search(self.text, self.i, end):
            return None
        self.i = end
        return [op]

    def changes(self) -> list[Change] | None:
        """The changes of the list of ops whose first op (or ``]``) is at ``i``, its
        ops decoded :data:`OPS_GROUP` at a time as they are parsed (:func:`batch_changes`),
        and ``i`` past its ``]``; None when it is not a plain list of JSON values."""
        changes: list[Change] = []
        ops: list[Any] = []
        if self.text[self.i] == "]":
            self.i += 1
            return changes
        while True:
            found = self.op()
            if found is None or not self.past_blanks():
                return None
            ops.extend(found)
            sep = self.text[self.i]
            self.i += 1
            if sep == "]" or len(ops) == OPS_GROUP:
                changes.extend(batch_changes(ops, consume=True))
                ops.clear()
            if sep == "]":
                return changes
            if sep != "," or not self.past_blanks():
                return None


def _plain_batch_changes(body: bytes) -> list[Change] | None:
    """The changes of a batch body of the plain shape ``{"ops": [...]}`` (blanks
    aside), decoded to text a :data:`TEXT_PART` at a time and parsed an op at a time;
    None for any other shape, any error (a bad op's included), or an escaped UTF-16
    surrogate (the caller parses the body whole: the same changes, or the error).

    A thread that decodes, searches or parses a whole big body in one call holds the
    GIL throughout (for 55 MB, one ``json.loads`` took seconds, decoding and searching
    the text about 100 ms), stalling the event loop as if it ran there; here no call
    covers more than a part or an op, and the loop gets its turn between them. Ops are
    decoded as they are parsed, so the parsed ops of the whole body are never held."""
    body_text = _BodyText(body)
    try:
        body_text.more()
        start = _OPS_START.match(body_text.text)
        if start is None:
            return None
        body_text.i = start.end()
        if not body_text.past_blanks():
            return None
        changes = body_text.changes()
        if changes is None:
            return None
        rest = body_text.text[body_text.i :] + "".join(body_text.parts)
    except (ValueError, RecursionError, ae.BadRequest):  # (UnicodeDecodeError, a nesting
        return None  # too deep, a bad op: the whole-body parse says which)
    return changes if rest.strip(" \t\n\r") == "}" else None


FLAG_TRUE = ("1", "true", "yes")
FLAG_FALSE = ("0", "false", "no", "")
"""What a query flag (``?deleted=``, ``?follow=``, ``?values=``, ``?sync=``) may be, in
any case; empty (``?deleted=`` or a bare ``?deleted``) is false. Anything else is 400."""


def flag_param(name: str, text: str) -> bool:
    """A query flag's value (:data:`FLAG_TRUE`, :data:`FLAG_FALSE`); 400 otherwise."""
    v = text.lower()
    if v in FLAG_TRUE:
        return True
    if v in FLAG_FALSE:
        return False
    raise ae.BadRequest(
        f"query parameter {name} must be 1 or 0 (true or false, yes or no), not {text[:40]!r}"
    )


def integer_param(name: str, text: str) -> int:
    """A query integer: ASCII digits, a minus sign allowed (for the "at least" message
    its caller gives); 400 otherwise. ``int()`` alone also takes ``1_0``, blanks, a
    plus sign and other scripts' digits (a full-width ``１``)."""
    if not _INTEGER.fullmatch(text):
        raise ae.BadRequest(f"query parameter {name} must be an integer")
    return int(text)


def number_param(name: str, text: str) -> float:
    """A query number of seconds: ASCII decimal (``1``, ``0.5``, ``.5``, ``1e3``), NaN
    for anything else, whose caller refuses it with its own bounds. ``float()`` alone
    also takes ``1_0``, blanks, ``inf`` and other scripts' digits."""
    return float(text) if _DECIMAL.fullmatch(text) else math.nan


_INTEGER = re.compile(r"-?[0-9]+", re.ASCII)
_DECIMAL = re.compile(r"-?(?:[0-9]+(?:\.[0-9]*)?|\.[0-9]+)(?:[eE][-+]?[0-9]+)?", re.ASCII)


def repeated_param(name: str) -> ae.BadRequest:
    """The refusal of a query parameter given more than once (each takes one value)."""
    return ae.BadRequest(f"query parameter {name} is given more than once: it takes one value")


def token_param(text: str) -> bytes:
    """A continuation token from a query string. Tokens are standard base64, whose ``+``
    a query string reads as a blank unless it was percent-encoded; base64 holds no blank,
    so a blank is taken back as ``+`` (``?token=NEXT`` pasted as is works)."""
    return unb64(text.replace(" ", "+"), "token")


def from_hex(text: str) -> bytes:
    """The bytes of ``text``, hex digits only (``bytes.fromhex`` also skips blanks, so a
    commit id sent as ``%20`` would be the empty id); ValueError otherwise."""
    if _HEX.fullmatch(text) is None:
        raise ValueError(f"not hex: {text!r}")
    return bytes.fromhex(text)


_HEX = re.compile(r"(?:[0-9a-fA-F]{2})*")


def text_or_none(data: bytes) -> str | None:
    try:
        return data.decode()
    except UnicodeDecodeError:
        return None


def commit_json(c: Commit) -> dict[str, Any]:
    return {
        "id": c.id.hex(),
        "parents": [p.hex() for p in c.parents],
        "timestamp": c.timestamp,
        "generation": c.generation,
    }


def parse_priority(text: object) -> Priority:
    """A priority as clients give it: absent (None), ``eager`` or ``lazy``; anything
    else (a number, another word) is a 400."""
    if text is None or text == "":
        return Priority.EAGER
    if isinstance(text, str) and text.lower() in ("eager", "lazy"):
        return Priority.LAZY if text.lower() == "lazy" else Priority.EAGER
    raise ae.BadRequest(f"priority must be 'eager' or 'lazy', not {text!r}")


def priority_name(p: int) -> str:
    return "lazy" if p == Priority.LAZY else "eager"


ENTRY_OVERHEAD = 64
"""Bytes counted per entry of a listing besides its base64 key and value (names, quotes,
priority, size)."""


def _b64_len(n: int) -> int:
    return 4 * -(-n // 3)


async def entries_json(
    view: View, found: Sequence[RawEntry], with_values: bool, budget: int
) -> tuple[list[dict[str, Any]], int]:
    """JSON objects for entries (key, priority, size, and the value when small enough),
    and how many of ``found`` they are: they stop before the one that would take
    the JSON past ``budget`` bytes (but hold at least one entry), so that a listing
    of large values never builds an unbounded body. Values are read a group at a
    time, a group's single-piece values in one query."""
    out: list[dict[str, Any]] = []
    used = 0
    for g in range(0, len(found), ENTRY_GROUP):
        group = found[g : g + ENTRY_GROUP]
        small = [e[1] for e in group if not dg.is_index(e[1])]
        values = await view.objects.read_many(small) if with_values else {}
        for i, (key, value, prio, *_) in enumerate(group, g):
            item: dict[str, Any] = {"key": b64(key), "priority": priority_name(prio)}
            cost = len(item["key"]) + ENTRY_OVERHEAD
            if value in values:
                item["size"] = len(values[value])
                cost += _b64_len(item["size"])
            else:
                item["size"] = size = await view.objects.size(value)
                if with_values:
                    inline = size <= INLINE_VALUE_LIMIT
                    cost += _b64_len(size) if inline else 0
                    if out and used + cost > budget:  # don't read what will not be sent
                        return out, i
                    item["value"] = b64(await view.objects.read_all(value)) if inline else None
            if out and used + cost > budget:
                return out, i
            if value in values:
                item["value"] = b64(values[value])
            used += cost
            out.append(item)
    return out, len(found)
