"""Tuple layer benchmark: pack and unpack rates of :mod:`store.tuple` next to ``fdb.tuple``.

    python -m bench.tuples [--ops 100000] [--repeat 5]

Prints JSON: for a typical 3-element key (str, int, UUID) and a 10-element mixed key
(str, bytes, ints, float, bool, None, UUID, str with 0x00, nested tuple), the pack and
unpack rates in operations per second (best of ``--repeat`` runs of ``--ops`` calls),
next to the ``foundationdb`` package's pure-Python ``fdb.tuple`` measured in the same
run, and ours divided by theirs (target >= 1.0). Without the ``foundationdb`` package the
``fdb`` figures are ``null`` and a note says why.
"""

from __future__ import annotations

import argparse
import time
import uuid
from collections.abc import Callable
from typing import Any

from ledgerd.store import tuple as ours

from bench.common import emit

try:
    import fdb.tuple as theirs
except ImportError:  # the test extra installs it; the benchmark runs without it
    theirs = None

KEY_ID = uuid.UUID("8a0f3a57-6a8e-4c43-9d69-3b1e5c2f7a10")


KEYS: dict[str, tuple[Any, ...]] = {
    "key3": ("users", 1234567, KEY_ID),
    "key10": (
        "orders",
        b"\x01\x02\x03",
        2024,
        -17,
        1.5,
        True,
        None,
        KEY_ID,
        "line\x00item",
        ("tag", 7),
    ),
}


def _rate(fn: Callable[[Any], Any], arg: Any, ops: int, repeat: int) -> float:
    """Calls per second of ``fn(arg)``: the best of ``repeat`` runs of ``ops`` calls."""
    best = float("inf")
    for _ in range(repeat):
        start = time.perf_counter()
        for _ in range(ops):
            fn(arg)
        best = min(best, time.perf_counter() - start)
    return ops / best


def _measure(lib: Any, key: tuple[Any, ...], ops: int, repeat: int) -> dict[str, float]:
    packed = lib.pack(key)
    return {
        "pack_per_s": round(_rate(lib.pack, key, ops, repeat)),
        "unpack_per_s": round(_rate(lib.unpack, packed, ops, repeat)),
    }


def run(ops: int, repeat: int) -> dict[str, Any]:
    out: dict[str, Any] = {"ops": ops, "repeat": repeat}
    if theirs is None:
        out["note"] = "foundationdb is not installed (pip install foundationdb): no fdb figures"
    for name, key in KEYS.items():
        mine = _measure(ours, key, ops, repeat)
        fig: dict[str, Any] = {"ledgerd": mine, "fdb": None, "ratio": None}
        if theirs is not None:
            assert ours.pack(key) == theirs.pack(key), "encodings differ"
            other = _measure(theirs, key, ops, repeat)
            fig["fdb"] = other
            fig["ratio"] = {k: round(mine[k] / other[k], 2) for k in mine}
        out[name] = fig
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    ap.add_argument("--ops", type=int, default=100_000)
    ap.add_argument("--repeat", type=int, default=5)
    args = ap.parse_args()
    emit("tuples", run(args.ops, args.repeat))


if __name__ == "__main__":
    main()
