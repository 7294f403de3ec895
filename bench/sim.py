"""The deterministic simulation of the whole sync, run over many seeds.

    python -m bench.sim --histories 10000 [--seed-start S] [--devices-max 8] [--jobs 2]
    python -m bench.sim --replay SEED [--verbose]

Each history is one seed of ``tests/sim`` (devices, bucket with faults, clocks,
crashes; see tests/sim/harness.py). Prints progress to stderr and, at the end, one
JSON line: the histories run, the failures with their seeds and symptoms, the seconds
and histories per second. ``--replay`` runs one seed exactly as it ran before and
prints its whole history (every step, every device's clock, every fault and crash,
ledgerd's warnings) and the oracle's findings.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from typing import Any

HASH_SEED = "0"
STEPS = (40, 120)
"""tests.sim.harness.STEPS (not imported: --help loads nothing of ledgerd)."""


def _replay(seed: int, devices_max: int, steps: tuple[int, int]) -> int:
    from tests.sim.harness import run_history

    r = run_history(seed, devices_max=devices_max, steps=steps, verbose=True)
    print()
    print(f"findings of seed {seed} ({'FAILED' if r.failed else 'passed'}):")
    for f in r.findings:
        print(f"  {f.category}{' (note)' if f.note else ''}: {f.message}")
    if not r.findings:
        print("  none")
    out: dict[str, Any] = {
        "seed": seed,
        "failed": r.failed,
        "symptoms": r.categories(),
        "seconds": round(r.seconds, 2),
        "stats": r.stats,
    }
    print(json.dumps(out))
    return 1 if r.failed else 0


def main() -> None:
    ap = argparse.ArgumentParser(prog="python -m bench.sim", description=__doc__.splitlines()[0])
    ap.add_argument("--histories", type=int, default=1000, help="how many seeds to run")
    ap.add_argument("--seed-start", type=int, default=0, help="the first seed")
    ap.add_argument("--devices-max", type=int, default=8, help="most devices in a history")
    ap.add_argument("--jobs", type=int, default=2, help="worker processes")
    ap.add_argument("--steps-min", type=int, default=STEPS[0], help="fewest steps in a history")
    ap.add_argument("--steps-max", type=int, default=STEPS[1], help="most steps in a history")
    ap.add_argument("--replay", type=int, metavar="SEED", help="replay one seed and print it")
    ap.add_argument(
        "--verbose", action="store_true", help="print every failure's findings as it comes"
    )
    args = ap.parse_args()
    if args.devices_max < 2:
        ap.error("--devices-max must be at least 2")
    if os.environ.get("PYTHONHASHSEED") != HASH_SEED:
        # Every history runs under the same hash seed as its replays (set iteration order).
        os.environ["PYTHONHASHSEED"] = HASH_SEED
        os.execv(sys.executable, [sys.executable, "-m", "bench.sim", *sys.argv[1:]])
    steps = (args.steps_min, max(args.steps_min, args.steps_max))
    if args.replay is not None:
        sys.exit(_replay(args.replay, args.devices_max, steps))

    from tests.sim.runner import Outcome, Summary, run_many

    seeds = list(range(args.seed_start, args.seed_start + args.histories))
    replay_args = "".join(
        f" --{name} {value}"
        for name, value, default in (
            ("devices-max", args.devices_max, 8),
            ("steps-min", args.steps_min, STEPS[0]),
            ("steps-max", args.steps_max, STEPS[1]),
        )
        if value != default
    )
    last = [time.monotonic()]

    def progress(s: Summary, o: Outcome) -> None:
        if o.failed:
            print(
                f"seed {o.seed} FAILED ({', '.join(o.categories)}): replay with "
                f"python -m bench.sim --replay {o.seed}" + replay_args,
                file=sys.stderr,
                flush=True,
            )
            if args.verbose:
                for cat, msg, note in o.findings:
                    print(f"    {cat}{' (note)' if note else ''}: {msg}", file=sys.stderr)
        now = time.monotonic()
        if now - last[0] >= 10 or s.histories == len(seeds):
            last[0] = now
            print(
                f"{s.histories}/{len(seeds)} histories, {len(s.failures)} failed",
                file=sys.stderr,
                flush=True,
            )

    summary = run_many(
        seeds, jobs=args.jobs, devices_max=args.devices_max, steps=steps, progress=progress
    )
    out = summary.json()
    out["seed_start"] = args.seed_start
    print(json.dumps(out))


if __name__ == "__main__":
    main()
