"""Tuple layer benchmark: pack and unpack rates of :mod:`store.keys.tuple` next to ``fdb.tuple``.

    python -m bench.tuples [--ops 100000] [--repeat 7]

Prints JSON: for a typical 3-element key (str, int, UUID) and a 10-element mixed key
(str, bytes, ints, float, bool, None, UUID, str with 0x00, nested tuple), the pack and
unpack rates in operations per second (best of ``--repeat`` runs of ``--ops`` calls),
next to the ``foundationdb`` package's pure-Python ``fdb.tuple`` measured in the same
run, and ours divided by theirs (target >= 1.0): the median of the ``--repeat`` paired
rounds' ratios (``ratio``, with each round's in ``ratio_rounds``), the side that goes first
alternating. Without the ``foundationdb`` package the ``fdb`` figures are ``null`` and a
note says why.
"""

from __future__ import annotations

import argparse
import statistics
import time
import uuid
from collections.abc import Callable
from typing import Any

from bench.common import emit
from ledgerd.store.keys import tuple as ours

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


def _seconds(fn: Callable[[Any], Any], arg: Any, ops: int) -> float:
    start = time.perf_counter()
    for _ in range(ops):
        fn(arg)
    return time.perf_counter() - start


def _rates(
    libs: dict[str, Any], key: tuple[Any, ...], ops: int, repeat: int
) -> tuple[dict[str, Any], dict[str, list[float]]]:
    """Pack and unpack calls per second of each library, the best of ``repeat`` runs of
    ``ops`` calls, and each round's ratio of the first library's time to the second's
    (none with one library): the libraries take turns, the one that goes first
    alternating, so that both see the same machine load."""
    packed = {name: lib.pack(key) for name, lib in libs.items()}
    best = {(name, op): float("inf") for name in libs for op in ("pack", "unpack")}
    rounds: dict[str, list[float]] = {"pack_per_s": [], "unpack_per_s": []}
    names = list(libs)
    for r in range(repeat):
        took: dict[tuple[str, str], float] = {}
        for name in names if r % 2 == 0 else names[::-1]:
            lib = libs[name]
            for op, fn, arg in (("pack", lib.pack, key), ("unpack", lib.unpack, packed[name])):
                took[name, op] = _seconds(fn, arg, ops)
                best[name, op] = min(best[name, op], took[name, op])
        if len(names) == 2:
            for op in ("pack", "unpack"):
                rounds[f"{op}_per_s"].append(took[names[1], op] / took[names[0], op])
    rates = {
        name: {f"{op}_per_s": round(ops / best[name, op]) for op in ("pack", "unpack")}
        for name in libs
    }
    return rates, rounds


def run(ops: int, repeat: int) -> dict[str, Any]:
    out: dict[str, Any] = {"ops": ops, "repeat": repeat}
    libs: dict[str, Any] = {"ledgerd": ours}
    if theirs is None:
        out["note"] = "foundationdb is not installed (pip install foundationdb): no fdb figures"
    else:
        libs["fdb"] = theirs
    for name, key in KEYS.items():
        if theirs is not None:
            assert ours.pack(key) == theirs.pack(key), "encodings differ"
        rates, rounds = _rates(libs, key, ops, repeat)
        mine, other = rates["ledgerd"], rates.get("fdb")
        out[name] = {
            "ledgerd": mine,
            "fdb": other,
            "ratio": None
            if other is None
            else {k: round(statistics.median(v), 2) for k, v in rounds.items()},
            "ratio_rounds": None
            if other is None
            else {k: [round(x, 2) for x in v] for k, v in rounds.items()},
        }
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    ap.add_argument("--ops", type=int, default=100_000)
    ap.add_argument("--repeat", type=int, default=7)
    args = ap.parse_args()
    emit("tuples", run(args.ops, args.repeat))


if __name__ == "__main__":
    main()
