"""What the simulation expects: a model of every write, and the checks after a history.

The model records each write the harness issued (key or document, device, value or
delete, whether it was acknowledged, and the barrier epoch it came in); the checks
compare the devices' settled states with each other and with the model (documents with
their kept conflicts: equal everywhere, each holding data some device wrote). A finding has
a category (the symptom, used to group failures) and a message; a lossy history's
findings that a deleted object explains are notes, not failures.
"""

from __future__ import annotations

import json
from collections import defaultdict
from dataclasses import dataclass, field
from typing import Any

from tests.sim import adapter

ABSENT = None

# Symptoms, by category: each one a kind of failure the summary counts apart.
DIVERGED = "diverged"  # visible entries differ between devices
ROOT_DIVERGED = "root-diverged"  # equal entries, different root digests
DOCS_DIVERGED = "docs-diverged"
INDEX_DIVERGED = "index-diverged"
LOST_WRITE = "lost-write"  # a key one device wrote does not hold its last acked write
BAD_VALUE = "bad-value"  # a value nobody wrote, or a write after a barrier that lost
PHANTOM = "phantom-key"  # a key nobody wrote
WAITING = "waiting-pack"
REFUSED = "corrupt-refused"
HELD = "held-pack"
HELD_RETRY = "held-retry"  # held to be read again ('retry'), not a problem status reports
GAP = "gap"
STORM = "merge-storm"
NO_SETTLE = "no-settle"
HEADS = "heads"  # several heads (a conflict) left after settling
HANG = "hang"
UNEXPECTED = "unexpected-error"
UNAVAILABLE = "unavailable"  # a page could not be read (evicted, not restorable)
REOPEN = "reopen-failed"

NOTES = {HELD_RETRY}
"""Reported, never a failure by themselves."""

LOSSY_NOTES = {
    DIVERGED,
    ROOT_DIVERGED,
    DOCS_DIVERGED,
    INDEX_DIVERGED,
    LOST_WRITE,
    BAD_VALUE,
    WAITING,
    GAP,
    HEADS,
    UNAVAILABLE,
}
"""What an object deleted behind the devices' backs can explain."""


@dataclass
class Finding:
    category: str
    message: str
    note: bool = False  # explained by a lossy seed: reported, not failed


@dataclass
class Write:
    device: int
    value: bytes | None  # None: a delete
    acked: bool
    step: int
    epoch: int


def doc_value(data: dict[str, Any] | None) -> bytes | None:
    return None if data is None else json.dumps(data, sort_keys=True).encode()


@dataclass
class Model:
    """Every write issued, per (page, key) and per (page, document id)."""

    keys: dict[tuple[bytes, bytes], list[Write]] = field(default_factory=lambda: defaultdict(list))
    docs: dict[tuple[bytes, str], list[Write]] = field(default_factory=lambda: defaultdict(list))
    epoch: int = 0
    barrier_keys: dict[tuple[bytes, bytes], bytes | None] = field(default_factory=dict)
    barrier_docs: dict[tuple[bytes, str], bytes | None] = field(default_factory=dict)
    writes: dict[bytes, int] = field(default_factory=lambda: defaultdict(int))
    """Write operations per page (each at most one commit)."""
    unknown_stamps: bool = False  # a versionstamped write whose key is not known (crashed)

    def key(self, pid: bytes, key: bytes, w: Write) -> None:
        w.epoch = self.epoch
        self.keys[(pid, key)].append(w)

    def doc(self, pid: bytes, doc_id: str, w: Write) -> None:
        w.epoch = self.epoch
        self.docs[(pid, doc_id)].append(w)

    def barrier(self, states: dict[bytes, adapter.PageState]) -> None:
        """Every device settled on ``states``: later writes are judged against them."""
        self.epoch += 1
        self.barrier_keys = {
            (pid, k): st.entries.get(k) for (pid, k) in self.keys if (st := states.get(pid))
        }
        self.barrier_docs = {}
        for pid, d in self.docs:
            st = states.get(pid)
            if st is not None and st.docs is not None:
                live = st.docs.get(d)
                self.barrier_docs[(pid, d)] = None if live is None else doc_value(live[1])


def _expected(
    writes: list[Write], at_barrier: bytes | None, epoch: int
) -> tuple[set[bytes | None], str]:
    """The final values allowed for one key (or document) by its writes, and why."""
    writers = {w.device for w in writes}
    allowed: set[bytes | None]
    if len(writers) == 1:
        acked = [i for i, w in enumerate(writes) if w.acked]
        if acked:
            last = acked[-1]
            allowed = {writes[last].value} | {w.value for w in writes[last + 1 :]}
        else:
            allowed = {ABSENT}
            allowed.update(w.value for w in writes)
        why = f"written by d{next(iter(writers))} alone"
        rule = LOST_WRITE
    else:
        allowed = {w.value for w in writes}
        if not any(w.acked for w in writes):
            allowed.add(ABSENT)
        why = f"written by {', '.join(f'd{d}' for d in sorted(writers))}"
        rule = BAD_VALUE
    late = [w for w in writes if w.epoch == epoch]
    if epoch and not late and any(w.epoch < epoch for w in writes):
        allowed = {at_barrier}  # settled then, and nobody wrote it since
        why += "; nobody wrote it since the last barrier"
    elif epoch and len(late) == 1:
        w = late[0]
        before = {at_barrier} if not w.acked else set()
        allowed &= {w.value} | before
        if not allowed:  # the model's own inconsistency: the late write decides
            allowed = {w.value} | before
        why += f"; the only write since the last barrier is d{w.device}'s at step {w.step}"
    return allowed, f"{rule}|{why}"


def _show(v: bytes | None) -> str:
    if v is None:
        return "absent"
    return repr(v[:60])


def check_values(
    model: Model, states: dict[bytes, adapter.PageState], kinds: dict[bytes, str]
) -> list[Finding]:
    """Oracle 2 and 3 over one device's settled states (the devices agree, or the
    convergence check already failed)."""
    out: list[Finding] = []
    for (pid, key), writes in sorted(model.keys.items()):
        st = states.get(pid)
        if st is None or kinds[pid] != "kv":
            continue
        final = st.entries.get(key)
        allowed, why = _expected(writes, model.barrier_keys.get((pid, key)), model.epoch)
        if final not in allowed:
            rule, text = why.split("|", 1)
            shown = ", ".join(sorted(_show(v) for v in allowed))
            out.append(
                Finding(
                    rule,
                    f"page {pid.decode()} key {key!r}: {_show(final)}, expected one of "
                    f"{{{shown}}} ({text})",
                )
            )
    for pid, st in sorted(states.items()):
        if kinds[pid] != "kv":
            continue
        for key in st.entries:
            if (pid, key) in model.keys:
                continue
            if model.unknown_stamps and key.startswith(adapter.VS.key()):
                continue
            out.append(Finding(PHANTOM, f"page {pid.decode()} key {key!r}: nobody wrote it"))
    for (pid, doc_id), writes in sorted(model.docs.items()):
        st = states.get(pid)
        if st is None or st.docs is None:
            continue
        live = st.docs.get(doc_id)
        final = None if live is None else doc_value(live[1])
        written = {w.value for w in writes}
        for rev, data in () if live is None else live[2]:
            if doc_value(data) not in written | {None}:  # (a purged one keeps no data)
                out.append(
                    Finding(
                        BAD_VALUE,
                        f"page {pid.decode()} document {doc_id}: kept conflict {rev} holds "
                        f"{_show(doc_value(data))}, which nobody wrote",
                    )
                )
        allowed, why = _expected(writes, model.barrier_docs.get((pid, doc_id)), model.epoch)
        if final not in allowed:
            rule, text = why.split("|", 1)
            shown = ", ".join(sorted(_show(v) for v in allowed))
            out.append(
                Finding(
                    rule,
                    f"page {pid.decode()} document {doc_id}: {_show(final)}, expected one of "
                    f"{{{shown}}} ({text})",
                )
            )
    return out


def compare(states: list[dict[bytes, adapter.PageState]], labels: list[str]) -> list[Finding]:
    """Oracle 1: every page the same on every device."""
    out: list[Finding] = []
    pids = sorted({pid for s in states for pid in s})
    first = states[0]
    for pid in pids:
        ref = first.get(pid)
        for label, s in zip(labels[1:], states[1:], strict=True):
            st = s.get(pid)
            if ref is None or st is None:
                if ref is not st:
                    out.append(
                        Finding(DIVERGED, f"page {pid.decode()}: on {labels[0]} xor {label}")
                    )
                continue
            if st.entries != ref.entries:
                diff = sorted(
                    k
                    for k in set(st.entries) | set(ref.entries)
                    if st.entries.get(k) != ref.entries.get(k)
                )
                shown = "; ".join(
                    f"{k!r}: {_show(ref.entries.get(k))} vs {_show(st.entries.get(k))}"
                    for k in diff[:4]
                )
                out.append(
                    Finding(
                        DIVERGED,
                        f"page {pid.decode()}: {labels[0]} and {label} differ in {len(diff)} "
                        f"keys ({shown})",
                    )
                )
            elif st.root != ref.root:
                out.append(
                    Finding(
                        ROOT_DIVERGED,
                        f"page {pid.decode()}: {labels[0]} and {label} read the same entries "
                        f"from different roots",
                    )
                )
            if st.docs != ref.docs:
                out.append(
                    Finding(DOCS_DIVERGED, f"page {pid.decode()}: {labels[0]} and {label} differ")
                )
            if st.index != ref.index:
                out.append(
                    Finding(
                        INDEX_DIVERGED,
                        f"page {pid.decode()}: index {adapter.INDEX} answers differ on "
                        f"{labels[0]} and {label}",
                    )
                )
    return out
