"""``ledgerctl --tuple``: keys as tuple literals, packed with the tuple layer (issue 14)."""

from __future__ import annotations

import math
import uuid
from collections.abc import Iterator
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ledgerd.daemon.cli_format import UsageError, parse_tuple, show_tuple
from ledgerd.daemon.client import Client
from ledgerd.store import SingleFloat, Versionstamp
from ledgerd.store.keys import tuple as fdbtuple
from tests.daemon.conftest import Daemon
from tests.daemon.test_cli import ctl, ctl_all, ctl_fails, ledger, outputs, seed, shared_daemon

__all__ = ["ledger"]  # a fixture


@pytest.fixture(scope="module")
def shared() -> Iterator[Daemon]:
    yield from shared_daemon()


# -- literals, without a daemon --------------------------------------------------------

scalars = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(-(2**100), 2**100),
    st.floats(allow_nan=False),
    st.floats(width=32, allow_nan=False).map(SingleFloat),
    st.text(max_size=10),
    st.binary(max_size=10),
    st.uuids(),
    st.builds(Versionstamp, st.binary(min_size=10, max_size=10), st.integers(0, 0xFFFF)),
)
tuples = st.recursive(
    st.lists(scalars, max_size=4).map(tuple),
    lambda inner: st.lists(st.one_of(scalars, inner), max_size=4).map(tuple),
    max_leaves=12,
)


@settings(deadline=None)  # a shared, loaded machine: no per-example deadline
@given(tuples)
def test_what_is_shown_reads_back_as_the_same_key(t: tuple[Any, ...]) -> None:
    """``ls --tuple`` prints a key in the syntax ``--tuple`` reads: paste it back, same key."""
    assert fdbtuple.pack(parse_tuple(show_tuple(t), "key")) == fdbtuple.pack(t)


def test_literals_that_are_not_python_literals_are_refused() -> None:
    for text, why in [
        ('("user", 42', "was never closed"),
        ('"user"', "not a tuple (one element needs a comma"),
        ("(x,)", "x is not a literal (quote strings)"),
        ('(__import__("os").system("touch /tmp/pwned"),)', "is not allowed"),
        ('(open("/etc/passwd").read(),)', "is not allowed"),
        ("({1: 2},)", "a dict cannot be a tuple element"),
        ("({1},)", "a set cannot be a tuple element"),
        ("(1j,)", "a complex cannot be a tuple element"),
        ("(UUID(int=5),)", "UUID() takes literal arguments by position, not int="),
        ("(SingleFloat(value=1.5),)", "SingleFloat() takes literal arguments by position"),
        ('(UUID("not-a-uuid"),)', "badly formed hexadecimal UUID string"),
        ("(Versionstamp(None, 1),)", ""),  # incomplete: has no bytes yet
        ("(" * 500 + "1" + ",)" * 500, ""),  # deeper than the tuple layer nests
        ("(" * 100_000, ""),
    ]:
        with pytest.raises(UsageError) as e:
            parse_tuple(text, "key")
        msg = str(e.value)
        assert msg.startswith("key ") and "is not a tuple literal: " in msg and why in msg, msg
        assert "\n" not in msg and len(msg) < 300, msg
    assert parse_tuple("(float('-inf'), float('nan'))", "key")[0] == -math.inf
    assert parse_tuple("(uuid.UUID('12345678123456781234567812345678'),)", "key") == (
        uuid.UUID(int=0x12345678123456781234567812345678),
    )
    assert parse_tuple("([1, [2]],)", "key") == ((1, (2,)),)  # lists are nested tuples


# -- ledgerctl --tuple -----------------------------------------------------------------


def test_tuple_keys_put_get_ls_delete(shared: Daemon, ledger: str) -> None:
    u = uuid.UUID(int=7)
    puts = [
        ('("user", 42, "name")', "Ada"),
        ('("user", 42, "email")', "ada@example.org"),
        ('("user", 7, "name")', "Bob"),
        ('("user", 42)', "the user itself"),
        (f"('item', UUID('{u}'), -1.5, b'\\x00', None, True)", "odd"),
    ]
    outputs(ctl_all(shared, *[["--tuple", "put", ledger, "p", k, v] for k, v in puts]))
    seed(shared, ledger, "p", [(b"\xffraw", b"not a tuple", "eager")])
    with Client(shared.socket) as c:
        assert c.get(ledger, "p", fdbtuple.pack(("user", 42, "name"))) == b"Ada"

    whole, prefixed, start_end, got, got_hex = outputs(
        ctl_all(
            shared,
            ["--tuple", "ls", ledger, "p"],
            ["ls", "--tuple", ledger, "p", "--prefix", '("user", 42)'],
            ["--tuple", "ls", ledger, "p", "--start", "('user', 8)", "--end", "('user', 42, 'f')"],
            ["--tuple", "get", ledger, "p", "('user', 42, 'name')"],
            ["--tuple", "--hex", "get", ledger.encode().hex(), "70", "('user', 7, 'name')"],
        )
    )
    assert whole.decode().splitlines() == [
        "('item', UUID('00000000-0000-0000-0000-000000000007'), -1.5, b'\\x00', None, True)\todd",
        "('user', 7, 'name')\tBob",
        "('user', 42)\tthe user itself",
        "('user', 42, 'email')\tada@example.org",
        "('user', 42, 'name')\tAda",
        "ff726177\tnot a tuple",  # not a tuple: hex
    ]
    # The prefix is the tuple's range(): the longer tuples, not the tuple itself.
    assert prefixed == b"('user', 42, 'email')\tada@example.org\n('user', 42, 'name')\tAda\n"
    assert start_end == b"('user', 42)\tthe user itself\n('user', 42, 'email')\tada@example.org\n"
    assert (got, got_hex) == (b"Ada", b"Bob")

    # What ls printed is what --tuple takes.
    odd = whole.decode().splitlines()[0].split("\t")[0]
    assert ctl(shared, "--tuple", "get", ledger, "p", odd) == b"odd"
    ctl(shared, "--tuple", "delete", ledger, "p", odd)
    assert b"odd" not in ctl(shared, "ls", ledger, "p")


def test_a_bad_tuple_literal_is_one_line_exit_2(shared: Daemon, ledger: str) -> None:
    cases = [
        (["--tuple", "put", ledger, "p", '("user", 42', "v"], "key '(\"user\", 42' is not a"),
        (["--tuple", "get", ledger, "p", "user"], "key 'user' is not a tuple literal"),
        (["--tuple", "ls", ledger, "p", "--prefix", "(os.system('x'),)"], '--prefix "(os.sys'),
        (["--tuple", "ls", ledger, "p", "--start", "(1,"], "--start '(1,' is not"),
    ]
    for args, says in cases:
        err = ctl_fails(shared, 2, *args)
        assert says in err and err.count("\n") == 1, err
    with Client(shared.socket) as c:
        assert ledger.encode() not in c.ledgers()
