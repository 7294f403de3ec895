"""Every seed that ever failed (tests/sim/regressions.py), replayed in the suite."""

from __future__ import annotations

import pytest

from tests.sim.regressions import SEEDS
from tests.sim.runner import run_many
from tests.sim.test_sim import report


@pytest.mark.timeout(1800)
def test_every_seed_that_ever_failed_passes() -> None:
    summary = run_many([seed for seed, _ in SEEDS], jobs=2)
    notes = dict(SEEDS)
    assert not summary.failures, (
        report(summary)
        + "\n\nwhat they did before:\n"
        + "\n".join(f"  seed {o.seed}: {notes[o.seed]}" for o in summary.failures)
    )


def test_each_seed_is_listed_once_with_a_note() -> None:
    seeds = [seed for seed, _ in SEEDS]
    assert len(seeds) == len(set(seeds))
    assert all(note.strip() and "\n" not in note for _, note in SEEDS)
