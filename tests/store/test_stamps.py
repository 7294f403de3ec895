"""Versionstamped keys and values through a real page: placeholders, plain writes,
transactions, the stamp clock, and bad templates refused with nothing written."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from ledgerd.store import InvalidArgumentError, Page, Repository
from ledgerd.store.keys import tuple as fdbtuple
from ledgerd.store.keys.subspace import Subspace
from ledgerd.store.keys.tuple import Versionstamp
from ledgerd.store.page import writer as store_writer
from ledgerd.store.page.graph import DIRECT_BATCH
from ledgerd.store.page.stamps import (
    STAMPED_VALUE_LIMIT,
    StampClock,
    StampedKey,
    StampedValue,
    VersionstampError,
    device_tag,
    stamp_time,
)

LOG = Subspace(("log",))

# -- placeholders go through a real page ----------------------------------------------------

scalars = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(-(2**70), 2**70),
    st.binary(max_size=8),
    st.text(max_size=8),
    st.floats(allow_nan=False),
)


@st.composite
def stamped_tuples(draw: st.DrawFn) -> tuple[Any, ...]:
    """A tuple holding one incomplete stamp, at any position and depth."""
    stamp = Versionstamp.incomplete(draw(st.integers(0, 0xFFFF)))
    inner: Any = stamp
    for _ in range(draw(st.integers(0, 3))):  # nest it in tuples
        before = draw(st.lists(scalars, max_size=2))
        after = draw(st.lists(scalars, max_size=2))
        inner = (*before, inner, *after)
    before = draw(st.lists(scalars, max_size=3))
    after = draw(st.lists(scalars, max_size=3))
    return (*before, inner, *after)


def _fill(t: Any, tr_version: bytes) -> Any:
    """``t`` with its incomplete stamps completed by ``tr_version``."""
    if isinstance(t, Versionstamp):
        return t.completed(tr_version) if not t.is_complete() else t
    if isinstance(t, tuple):
        return tuple(_fill(x, tr_version) for x in t)
    return t


def _stamps_in(t: Any) -> list[Versionstamp]:
    if isinstance(t, Versionstamp):
        return [t]
    if isinstance(t, tuple):
        return [s for x in t for s in _stamps_in(x)]
    return []


@settings(
    max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(prefix=st.binary(max_size=12), t=stamped_tuples(), value=st.binary(max_size=40))
async def test_stamped_key_with_a_prefix_and_nested_stamps(
    repo: Repository, page: Page, prefix: bytes, t: tuple[Any, ...], value: bytes
) -> None:
    template = fdbtuple.pack_with_versionstamp(t, prefix=prefix)
    key = await page.set_versionstamped_key(template, value)
    assert key.startswith(prefix)
    assert await page.get(key) == value
    unpacked = fdbtuple.unpack(key, len(prefix))
    (stamp,) = _stamps_in(unpacked)
    assert stamp.is_complete() and stamp.tr_version is not None
    assert stamp.tr_version.endswith(device_tag(repo.device_id))
    assert unpacked == _fill(t, stamp.tr_version)
    # The same tuple stamped as a value, under a plain key.
    stored = await page.set_versionstamped_value(b"v" + key, template)
    assert await page.get(b"v" + key) == stored
    (vstamp,) = _stamps_in(fdbtuple.unpack(stored, len(prefix)))
    assert vstamp.tr_version is not None and vstamp.tr_version > stamp.tr_version


# -- plain writes -----------------------------------------------------------------------------


async def test_stamped_plain_writes_are_distinct_and_in_order(page: Page) -> None:
    template = LOG.pack_with_versionstamp((Versionstamp.incomplete(),))
    # Concurrent writes share group commits: each is stamped as it is appended.
    keys = await asyncio.gather(
        *(page.set_versionstamped_key(template, b"%d" % i) for i in range(300))
    )
    await page.flush()
    for i in range(300, 320):  # and one at a time, each its own commit
        keys.append(await page.set_versionstamped_key(template, b"%d" % i))
        await page.flush()
    assert len(set(keys)) == len(keys)
    assert keys == sorted(keys)
    res = await page.entries(prefix=LOG.key(), limit=1000)
    assert [kv.value for kv in res.items] == [b"%d" % i for i in range(320)]
    commits = await page.history(1000)
    assert len(commits) < 300  # the concurrent writes did share commits
    # The head commit is no older than any stamp it holds.
    last = LOG.unpack(keys[-1])[0].tr_version
    assert page.head.timestamp >= stamp_time(last)


async def test_a_journal_commit_is_no_older_than_its_stamps(
    page: Page, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The journal's commit takes the time of its first write, unless it holds a later
    stamp: a device that receives the commit then stamps after every stamp in it."""
    monkeypatch.setattr(store_writer, "COMMIT_DELAY", 3600)  # commit only on flush
    template = LOG.pack_with_versionstamp((Versionstamp(),))
    await page.put(b"first", b"opens the journal")
    key = await page.set_versionstamped_key(template, b"later")
    await page.flush()
    assert len(await page.history()) == 2  # one journal, one commit
    assert page.head.timestamp >= stamp_time(LOG.unpack(key)[0].tr_version)
    assert page.stamps.next()[1] > LOG.unpack(key)[0].tr_version


async def test_one_write_shares_one_stamp(page: Page) -> None:
    changes: list[Any] = [
        (StampedKey(LOG.pack_with_versionstamp((Versionstamp.incomplete(u),))), b"%d" % u)
        for u in range(3)
    ]
    changes.append((b"plain", b"p"))
    changes.append((b"meta", StampedValue(fdbtuple.pack_with_versionstamp((Versionstamp(),)))))
    done = await page.write(changes)
    assert len(done) == 4
    stamps = [LOG.unpack(k)[0] for k in done[:3]]
    assert {s.tr_version for s in stamps} == {fdbtuple.unpack(done[3])[0].tr_version}
    assert [s.user_version for s in stamps] == [0, 1, 2]
    assert await page.get(b"meta") == done[3]
    assert await page.get(b"plain") == b"p"


async def test_a_direct_batch_is_stamped(page: Page) -> None:
    template = LOG.pack_with_versionstamp(("big", Versionstamp.incomplete()))
    changes: list[Any] = [(b"k%05d" % i, b"v") for i in range(DIRECT_BATCH)]
    changes.append((StampedKey(template), b"stamped"))
    before = page.head
    (key,) = await page.write(changes)
    assert page.head.parents == (before.id,)  # committed on its own
    assert await page.get(key) == b"stamped"
    assert page.head.timestamp >= stamp_time(LOG.unpack(key)[1].tr_version)


async def test_a_later_write_to_the_key_wins_over_its_stamped_value(page: Page) -> None:
    template = fdbtuple.pack_with_versionstamp((Versionstamp(),))
    await page.write([(b"k", StampedValue(template)), (b"k", b"plain")])
    assert await page.get(b"k") == b"plain"
    (value,) = await page.write([(b"k", b"plain"), (b"k", StampedValue(template))])
    assert await page.get(b"k") == value


# -- transactions ---------------------------------------------------------------------------


async def test_a_transactions_keys_share_a_stamp(page: Page) -> None:
    await page.put(b"k", b"before")
    async with page.transaction() as txn:
        for u in (2, 0, 1):
            await txn.set_versionstamped_key(
                LOG.pack_with_versionstamp((Versionstamp.incomplete(u), "entry")), b"%d" % u
            )
        await txn.set_versionstamped_value(
            b"k", fdbtuple.pack_with_versionstamp(("at", Versionstamp.incomplete(7)))
        )
        assert (txn.versionstamp, txn.versionstamped_keys) == (None, [])  # not yet
        with pytest.raises(VersionstampError, match="cannot be read"):
            await txn.get(b"k")
        with pytest.raises(VersionstampError, match="cannot be read"):
            await txn.entries(prefix=b"k")
        assert (await txn.entries(prefix=LOG.key())).items == []  # stamped keys: not yet
        await txn.put(b"other", b"o")
    assert txn.versionstamp is not None and txn.commit_id == page.head.id
    keys = txn.versionstamped_keys
    stamps = [LOG.unpack(k)[0] for k in keys]
    assert [s.user_version for s in stamps] == [2, 0, 1]  # in the order they were set
    assert {s.tr_version for s in stamps} == {txn.versionstamp}
    assert txn.versionstamp.endswith(page.stamps.tag)
    res = await page.entries(prefix=LOG.key())
    assert [kv.value for kv in res.items] == [b"0", b"1", b"2"]
    assert fdbtuple.unpack(await page.get(b"k")) == ("at", Versionstamp(txn.versionstamp, 7))
    assert page.head.timestamp >= stamp_time(txn.versionstamp)


async def test_a_transaction_orders_stamped_and_plain_writes(page: Page) -> None:
    template = fdbtuple.pack_with_versionstamp((Versionstamp(),))
    async with page.transaction() as txn:
        await txn.set_versionstamped_value(b"a", template)
        await txn.put(b"a", b"plain")  # later: wins, and a is readable again
        assert await txn.get(b"a") == b"plain"
        await txn.put(b"b", b"plain")
        await txn.set_versionstamped_value(b"b", template)  # later: wins
        await txn.set_versionstamped_key(LOG.pack_with_versionstamp((Versionstamp(),)), b"x")
        await txn.set_versionstamped_value(b"c", template)
        await txn.delete(b"c")
    assert await page.get(b"a") == b"plain"
    assert fdbtuple.unpack(await page.get(b"b")) == (Versionstamp(txn.versionstamp, 0),)
    assert not await page.contains(b"c")
    async with page.transaction() as txn2:
        await txn2.set_versionstamped_key(LOG.pack_with_versionstamp((Versionstamp(),)), b"y")
        await txn2.set_versionstamped_value(b"d", template)
        await txn2.clear()  # drops them too
        await txn2.put(b"e", b"1")
    assert txn2.versionstamped_keys == [] and txn2.versionstamp is None
    assert [kv.key for kv in (await page.entries()).items] == [b"e"]
    assert txn.versionstamp is not None
    assert stamp_time(txn.versionstamp) < page.head.timestamp


# -- the clock --------------------------------------------------------------------------------


def test_the_clock_never_runs_back_nor_behind_the_head() -> None:
    now = [5_000_000]
    head = [0]
    clock = StampClock(b"device", lambda: head[0], lambda: now[0])
    t1, s1 = clock.next()
    assert t1 == 5_000_000 and s1 == t1.to_bytes(8, "big") + device_tag(b"device")
    now[0] = 1_000  # the clock is set back
    t2, s2 = clock.next()
    assert t2 == t1 + 1 and s2 > s1
    head[0] = 9_000_000  # a commit from a device whose clock is ahead was merged
    t3, _ = clock.next()
    assert t3 == 9_000_001
    assert device_tag(b"device") != device_tag(b"other")  # (these two differ)


async def test_stamps_after_a_reopen_follow_the_old_ones_on_a_slow_clock(
    tmp_path: Path,
) -> None:
    template = LOG.pack_with_versionstamp((Versionstamp(),))
    async with await Repository.open(tmp_path / "d") as repo:
        page = await repo.ledger("l").page("p")
        first = await page.set_versionstamped_key(template, b"1")
    slow = lambda: time.time() - 3600  # noqa: E731 - an hour slow
    async with await Repository.open(tmp_path / "d", clock=slow) as repo:
        page = await repo.ledger("l").page("p")
        second = await page.set_versionstamped_key(template, b"2")
    assert first < second


# -- bad templates ----------------------------------------------------------------------------


async def test_bad_templates_are_refused_and_write_nothing(page: Page) -> None:
    good = LOG.pack_with_versionstamp((Versionstamp(),))
    off = len(good) - 4
    bad_keys = [
        b"",  # no room for anything
        b"\xff" * 10 + b"\x00\x00",  # offset cut short
        LOG.pack(("x",)) + b"\x00\x00\x00\x00",  # offset 0 holds no placeholder
        good[:-4] + (off + 5).to_bytes(4, "little"),  # placeholder runs past the key
        good[:-4] + (1000).to_bytes(4, "little"),  # offset outside the key
        # a second incomplete tuple stamp besides the one at the offset
        fdbtuple.pack_with_versionstamp((Versionstamp(),), prefix=b"\x33" + b"\xff" * 12),
    ]
    for bad in bad_keys:
        with pytest.raises(VersionstampError) as info:
            await page.set_versionstamped_key(bad, b"v")
        assert isinstance(info.value, InvalidArgumentError)
        with pytest.raises(VersionstampError):
            await page.set_versionstamped_value(b"k", bad)
        async with page.transaction() as txn:
            with pytest.raises(VersionstampError):
                await txn.set_versionstamped_key(bad, b"v")
            with pytest.raises(VersionstampError):
                await txn.set_versionstamped_value(b"k", bad)
    with pytest.raises(VersionstampError, match="not str"):
        await page.set_versionstamped_key("text", b"v")  # type: ignore[arg-type]
    with pytest.raises(VersionstampError, match="key or its value"):
        await page.write([(StampedKey(good), StampedValue(good))])
    with pytest.raises(VersionstampError, match="needs a value"):
        await page.write([(StampedKey(good), None)])
    big = fdbtuple.pack_with_versionstamp((Versionstamp(),), prefix=b"x" * STAMPED_VALUE_LIMIT)
    with pytest.raises(VersionstampError, match="at most"):
        await page.set_versionstamped_value(b"k", big)
    with pytest.raises(InvalidArgumentError, match="over the"):
        await page.set_versionstamped_key(
            fdbtuple.pack_with_versionstamp((Versionstamp(),), prefix=b"k" * 5000), b"v"
        )
    # A batch with one bad change writes none of it.
    with pytest.raises(VersionstampError):
        await page.write([(b"a", b"1"), (StampedKey(bad_keys[2]), b"v")])
    await page.flush()
    assert (await page.entries()).items == []
    assert len(await page.history()) == 1


def test_structured_keys_are_exported_for_embedded_users() -> None:
    import ledgerd.store as store
    from ledgerd.store.keys import subspace

    assert store.tuple is fdbtuple and store.tuple.pack(("a", 1)) == b"\x02a\x00\x15\x01"
    assert store.Subspace is subspace.Subspace and store.Versionstamp is Versionstamp
    assert store.StampedKey is StampedKey and store.VersionstampError is VersionstampError
    assert {"tuple", "Subspace", "Versionstamp", "TupleError"} <= set(store.__all__)
