"""Names in the bucket: what sync writes where, and strict parsing of what it lists.

This module owns the bucket layout (below) and the bucket marker's format; it does
no I/O. Every name that comes back from a listing is parsed strictly here before
sync acts on it: a name that is not exactly what some ledgerd would write is
ignored, never opened as a page.

Layout 4::

    ledgerd-bucket.4                                          the marker, written once
    packs/{time:013d}.{device}.{seq:016d}.{head_end}.{eager_end}   one pack per round
    checkpoints/{tag}/{time:013d}.{device}.{head_end}.{eager_end}   a page's state, whole

``time`` is the pack's feed time in ms (a hybrid logical clock: never below the
device's previous pack nor below the newest name it has listed), so that one
listing of ``packs/`` after a cursor shows every device's new packs.

``tag`` names the page without saying its names (a hash of ledger and page, see
:func:`page_tag`); one LIST of ``checkpoints/`` shows every page's checkpoints,
one of ``checkpoints/{tag}/`` one page's. ``time`` is the writer's feed time.

``device`` is a repository's 128-bit id in lowercase hex (in an encrypted bucket, a
keyed hash of it); ``seq`` counts from 1. Layouts 1-3 (unreleased development
versions, whose packs carried commit graphs) are not read.
"""

from __future__ import annotations

import base64
import hashlib
import json
import re
from dataclasses import dataclass

from ledgerd.store import NAME_LIMIT, decode_name, encode_name
from ledgerd.sync import pack
from ledgerd.sync.errors import BucketLayoutError

MARKER = "ledgerd-bucket"
BUCKET_FORMAT = 5
"""Version of the bucket layout; the marker carries it. A bucket of another one is
refused: a newer one by "upgrade ledgerd", an older one (an unreleased development
layout) by "use a new cloud URL". 4 is pack format 3: deltas of stamped entries
(``docs/convergence.md``); 5 is the same packs with values of up to 128 bytes inside
their digests (:data:`ledgerd.store.pieces.digest.INLINE_LIMIT`, 32 in 4)."""

MAX_EAGER_END = 1 << 40
"""Largest ``eager_end`` a pack name may carry (sync never writes one near it)."""

NAMED_TIME_CEILING = 9 * 10**12
"""The highest feed time (ms, in 2255) a listed name moves this device's hybrid
logical clock to. A name's time has 13 digits and a device's next feed time follows
the newest listed: a name at the end of them (a hostile or broken device) made every
device's next names 14 digits long, unreadable to all, for good. Above the ceiling,
10**12 more packs still fit."""
NAMED_SEQ_CEILING = 9 * 10**15
"""The highest sequence a listed name of this device's own moves its next one to
(a name of 16 digits; as for :data:`NAMED_TIME_CEILING`)."""

_DEVICE = re.compile(r"[0-9a-f]{32}")
_SEQ = re.compile(r"[0-9]{16}")
_NUMBER = re.compile(r"0|[1-9][0-9]{0,15}")
_TIME = re.compile(r"[0-9]{13}")
PACKS = "packs/"
_B64 = re.compile(r"[A-Za-z0-9_-]{2,171}")


def b64(raw: bytes) -> str:
    """A ledger or page name as status shows it (standard base64)."""
    return base64.b64encode(raw).decode()


def text_or_none(raw: bytes) -> str | None:
    """A name as text for status, if it is UTF-8."""
    try:
        return raw.decode()
    except UnicodeDecodeError:
        return None


def device_ok(text: str) -> bool:
    return _DEVICE.fullmatch(text) is not None


def _name(text: str) -> bytes | None:
    if not _B64.fullmatch(text):
        return None
    raw = decode_name(text)
    if raw is None or not 1 <= len(raw) <= NAME_LIMIT or encode_name(raw) != text:
        return None
    return raw


def feed_after(time_ms: int) -> str:
    """A listing bound: every pack with a feed time of ``time_ms`` or later is after it."""
    return f"{PACKS}{max(0, time_ms):013d}"


@dataclass(frozen=True)
class PackName:
    """A pack's name: feed time, device, sequence, and where its parts end."""

    time: int
    device: str
    seq: int
    head_end: int
    eager_end: int
    name: str

    @classmethod
    def make(cls, time: int, device: str, seq: int, head_end: int, eager_end: int) -> PackName:
        if not (0 <= time < 10**13 and 1 <= seq < 10**16):
            raise ValueError(f"feed time {time} or sequence {seq} does not fit in a pack name")
        name = f"{PACKS}{time:013d}.{device}.{seq:016d}.{head_end}.{eager_end}"
        return cls(time, device, seq, head_end, eager_end, name)

    @classmethod
    def parse(cls, name: str) -> PackName | None:
        """The pack a name stands for, or None unless it is exactly such a name."""
        if not name.startswith(PACKS):
            return None
        fields = name[len(PACKS) :].split(".")
        if len(fields) != 5:
            return None
        time, device, seq, head_end, eager_end = fields
        if not (
            _TIME.fullmatch(time)
            and device_ok(device)
            and _SEQ.fullmatch(seq)
            and _NUMBER.fullmatch(head_end)
            and _NUMBER.fullmatch(eager_end)
        ):
            return None
        n, head, end = int(seq), int(head_end), int(eager_end)
        if n < 1 or not pack.PREFIX <= head <= end <= MAX_EAGER_END:
            return None
        return cls(int(time), device, n, head, end, name)

    @property
    def ident(self) -> str:
        """The pack's identity without where its parts end (``packs/{time}.{device}.{seq}``):
        what an encrypted pack's parts are bound to (:class:`sync.crypto.Context`)."""
        return self.name.rsplit(".", 2)[0]


CHECKPOINTS = "checkpoints/"
_TAG = re.compile(r"[0-9a-f]{32}")


def page_tag(ledger: bytes, page: bytes) -> str:
    """The name a page's checkpoints go under: a hash of its ledger and page names."""
    h = hashlib.sha256(b"ledgerd-page\0" + len(ledger).to_bytes(2, "big") + ledger + page)
    return h.hexdigest()[:32]


@dataclass(frozen=True)
class CheckpointName:
    """A checkpoint's name: its page's tag, the writer's feed time and device, and
    where its header and EAGER section end."""

    tag: str
    time: int
    device: str
    head_end: int
    eager_end: int
    name: str

    @classmethod
    def make(
        cls, tag: str, time: int, device: str, head_end: int, eager_end: int
    ) -> CheckpointName:
        name = f"{CHECKPOINTS}{tag}/{time:013d}.{device}.{head_end}.{eager_end}"
        return cls(tag, time, device, head_end, eager_end, name)

    @classmethod
    def parse(cls, name: str) -> CheckpointName | None:
        """The checkpoint a name stands for, or None unless it is exactly such a name."""
        if not name.startswith(CHECKPOINTS):
            return None
        tag, slash, rest = name[len(CHECKPOINTS) :].partition("/")
        fields = rest.split(".")
        if not slash or not _TAG.fullmatch(tag) or len(fields) != 4:
            return None
        time, device, head_end, eager_end = fields
        if not (
            _TIME.fullmatch(time)
            and device_ok(device)
            and _NUMBER.fullmatch(head_end)
            and _NUMBER.fullmatch(eager_end)
        ):
            return None
        head, end = int(head_end), int(eager_end)
        if not pack.PREFIX <= head <= end <= MAX_EAGER_END:
            return None
        return cls(tag, int(time), device, head, end, name)

    @property
    def ident(self) -> str:
        """The checkpoint's identity without where its parts end (what an encrypted
        checkpoint's parts are bound to)."""
        return self.name.rsplit(".", 2)[0]


def marker_name(version: int = BUCKET_FORMAT) -> str:
    return f"{MARKER}.{version}"


def marker_version(name: str) -> int | None:
    """The layout version a marker's name carries (None if it is not a marker's name)."""
    head, _, version = name.partition(".")
    if head != MARKER or not _NUMBER.fullmatch(version):
        return None
    return int(version)


def marker(device: str | None, created: float, encrypted: bool) -> bytes:
    """The marker object's content: version, who (``device``, left out when None) and
    when, for people reading the bucket, and whether the bucket is encrypted, for
    devices (see :func:`marker_encrypted`)."""
    doc: dict[str, object] = {
        "ledgerd_bucket": BUCKET_FORMAT,
        "created_at": created,
        "encrypted": encrypted,
    }
    if device is not None:
        doc["created_by"] = device
    return json.dumps(doc, sort_keys=True).encode()


def marker_encrypted(data: bytes) -> bool | None:
    """Whether the marker ``data`` says its bucket is encrypted; None when it does not
    say (a marker of an older ledgerd, or one that does not parse).

    The marker is written once, and only if absent, so the first device's word
    holds: the encryption descriptor may not be written yet (its device writes it
    after the marker), and a device that starts on the same empty bucket at the same
    moment learns from the marker whether it may go on."""
    try:
        doc = json.loads(data)
    except ValueError:
        return None
    value = doc.get("encrypted") if isinstance(doc, dict) else None
    return value if isinstance(value, bool) else None


def check_version(version: int) -> None:
    """BucketLayoutError unless this ledgerd can use a bucket of layout ``version``."""
    if version > BUCKET_FORMAT:
        raise BucketLayoutError(
            f"the bucket has layout version {version}; this ledgerd supports "
            f"{BUCKET_FORMAT}: upgrade ledgerd"
        )
    if version < BUCKET_FORMAT:
        raise BucketLayoutError(
            f"the bucket has layout version {version}, written by an unreleased development "
            f"version of ledgerd; this ledgerd reads only layout {BUCKET_FORMAT}: sync to a "
            "new cloud URL (each device uploads its pages again)"
        )
