"""The commands ``ledgerctl conflicts`` prints to paste: they name the ledger, page and
key so that ``ledgerctl`` reads them back as the same bytes."""

from __future__ import annotations

import argparse
import shlex

import pytest

from ledgerd.daemon.cli import parser
from ledgerd.daemon.cli_conflicts import command_line
from ledgerd.daemon.cli_format import arg_bytes, pack_tuple
from ledgerd.store.keys import tuple as fdbtuple


def _args(*, hex: bool = False, tuple: bool = False) -> argparse.Namespace:
    return argparse.Namespace(hex=hex, tuple=tuple, socket=None)


def _read_back(line: str) -> tuple[bytes, bytes, bytes]:
    args = parser().parse_args([*shlex.split(line)[1:], "--take", "ours"])
    key = pack_tuple(args.key, "key") if args.tuple else arg_bytes(args.key, args.hex, "key")
    return arg_bytes(args.ledger, args.hex, "l"), arg_bytes(args.page, args.hex, "p"), key


@pytest.mark.parametrize(
    ("ledger", "page", "key", "tuple_mode", "expected"),
    [
        (b"notes", b"inbox", b"greeting", False, "ledgerctl resolve notes inbox greeting"),
        (b"notes", b"in box", b"it's", False, "ledgerctl resolve notes 'in box' \"it's\""),
        (b"notes", b"\xff", b"k", False, "ledgerctl resolve --hex 6e6f746573 ff 6b"),
        (b"notes", b"p", b"a\nb", False, "ledgerctl resolve --hex 6e6f746573 70 610a62"),
        (
            b"notes",
            b"t",
            fdbtuple.pack(("user", 42)),
            True,
            "ledgerctl resolve --tuple notes t \"('user', 42)\"",
        ),
    ],
)
def test_a_printed_command_reads_back_as_the_same_bytes(
    ledger: bytes, page: bytes, key: bytes, tuple_mode: bool, expected: str
) -> None:
    line = command_line(_args(tuple=tuple_mode), "resolve", ledger, page, key)
    assert line == expected
    assert _read_back(line) == (ledger, page, key)
