"""Versionstamps in a page: the ten bytes that complete a versionstamped key or value.

This module owns where a versionstamp's ten bytes come from in ledgerd (a page's
:class:`StampClock`) and how a versionstamped write is checked and completed
(:class:`StampedKey`, :class:`StampedValue`). It does not pack tuples
(:mod:`store.keys.tuple` does; :func:`store.keys.tuple.pack_with_versionstamp` makes the key
or value given here) nor decide when a write is stamped: :mod:`store.page.writer`
stamps a plain write when it appends it to the journal (just before it is
acknowledged), one stamp per write; :mod:`store.page.transaction` stamps a transaction
when it commits, one stamp shared by all its stamped keys and values.

The ten bytes
    8 bytes, big endian: the page's stamp clock, microseconds since the UNIX epoch,
    then 2 bytes derived from the device id (:func:`device_tag`). The clock is a
    hybrid logical clock: each stamp takes ``max(now, last stamp + 1, head commit's
    timestamp + 1)``, and a commit holding stamps is timestamped no earlier than its
    latest stamp. So on one device, stamps strictly increase in the order writes are
    acknowledged (a plain write) or committed (a transaction); across devices they
    interleave by the devices' clocks; and a device whose clock is slow still stamps
    after every stamp it has received through sync (the heads it merged carry their
    times). Two stamps from different devices are equal only if the two devices'
    tags are equal (1 in 65,536 for a pair of devices) and they stamp in the same
    microsecond.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable
from dataclasses import dataclass

from ledgerd.store.errors import InvalidArgumentError
from ledgerd.store.keys.tuple import complete_versionstamp
from ledgerd.store.page.staging import SMALL_VALUE
from ledgerd.store.page.view import check_key
from ledgerd.store.tree import commit

STAMP_SIZE = 10
"""Bytes a versionstamped write fills in: 8 of clock, 2 of device tag."""

OFFSET_SIZE = 4
"""The little-endian offset that ends a key or value given for stamping."""

STAMPED_VALUE_LIMIT = SMALL_VALUE
"""Largest versionstamped value, in bytes (it is split in memory when stamped)."""

_PLACEHOLDER = b"\xff" * STAMP_SIZE
_TUPLE_PLACEHOLDER = b"\x33" + _PLACEHOLDER
"""An incomplete versionstamp as the tuple layer packs it (its type code, ten 0xff)."""


class VersionstampError(InvalidArgumentError):
    """A versionstamped write needs exactly one incomplete versionstamp, at its offset."""


def device_tag(device_id: bytes) -> bytes:
    """The two bytes that end a device's stamps (a hash, so any id spreads evenly)."""
    return hashlib.blake2b(device_id, digest_size=2).digest()


def stamp_time(tr_version: bytes) -> int:
    """When a stamp was taken (µs since the UNIX epoch): its first 8 bytes."""
    if len(tr_version) != STAMP_SIZE:
        raise VersionstampError(f"a stamp is {STAMP_SIZE} bytes, not {len(tr_version)}")
    return int.from_bytes(tr_version[:8], "big")


class StampClock:
    """The versionstamps of one page: ten bytes each, strictly increasing.

    ``floor`` gives the timestamp of the page's head commit, which every stamp
    follows. Called on the event loop only."""

    def __init__(
        self,
        device_id: bytes,
        floor: Callable[[], int],
        clock_us: Callable[[], int] = commit.now_us,
    ) -> None:
        self.tag = device_tag(device_id)
        self._floor = floor
        self._clock_us = clock_us
        self.last = 0
        """The time of the last stamp given (µs)."""

    def next(self) -> tuple[int, bytes]:
        """A new stamp: its time (µs) and its ten bytes."""
        t = max(self._clock_us(), self.last + 1, self._floor() + 1)
        self.last = t
        return t, t.to_bytes(8, "big") + self.tag


def check_template(data: object, what: str) -> bytes:
    """``data`` if it holds exactly one incomplete versionstamp where its trailing
    4-byte offset says (as :func:`store.keys.tuple.pack_with_versionstamp` makes it)."""
    if not isinstance(data, bytes | bytearray | memoryview):
        raise VersionstampError(f"a versionstamped {what} is bytes, not {type(data).__name__}")
    data = bytes(data)
    end = len(data) - OFFSET_SIZE
    if end < STAMP_SIZE:
        raise VersionstampError(
            f"a versionstamped {what} holds 10 placeholder bytes and ends in a 4-byte offset;"
            f" {len(data)} bytes are too few"
        )
    offset = int.from_bytes(data[end:], "little")
    if offset + STAMP_SIZE > end:
        raise VersionstampError(
            f"versionstamp offset {offset} is outside the {end}-byte {what}"
            " (pack it with pack_with_versionstamp)"
        )
    if data[offset : offset + STAMP_SIZE] != _PLACEHOLDER:
        raise VersionstampError(f"no incomplete versionstamp at byte {offset} of the {what}")
    rest = data[:offset] + bytes(STAMP_SIZE) + data[offset + STAMP_SIZE : end]
    if _TUPLE_PLACEHOLDER in rest:
        raise VersionstampError(
            f"the {what} holds a second incomplete versionstamp besides the one at byte {offset}"
        )
    return data


@dataclass(frozen=True, slots=True)
class StampedKey:
    """A key to be completed with the write's versionstamp: a change's key in
    :meth:`store.page.page.Page.write`. Checked when made."""

    template: bytes

    def __post_init__(self) -> None:
        template = check_template(self.template, "key")
        check_key(template[:-OFFSET_SIZE])  # the completed key's length
        object.__setattr__(self, "template", template)

    def complete(self, stamp: bytes) -> bytes:
        return complete_versionstamp(self.template, stamp)


@dataclass(frozen=True, slots=True)
class StampedValue:
    """A value (bytes) to be completed with the write's versionstamp: a change's
    value in :meth:`store.page.page.Page.write`. Checked when made."""

    template: bytes

    def __post_init__(self) -> None:
        template = check_template(self.template, "value")
        if len(template) - OFFSET_SIZE > STAMPED_VALUE_LIMIT:
            raise VersionstampError(
                f"a versionstamped value is at most {STAMPED_VALUE_LIMIT} bytes,"
                f" not {len(template) - OFFSET_SIZE}"
            )
        object.__setattr__(self, "template", template)

    def complete(self, stamp: bytes) -> bytes:
        return complete_versionstamp(self.template, stamp)
