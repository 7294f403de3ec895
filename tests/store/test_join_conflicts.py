"""Property: a document's group joins as a semilattice (commutative, associative,
idempotent) over the states devices reach by writing, resolving and joining, kept
conflicts included; and a write leaves at most the bound of them."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from ledgerd.store.documents import doclayout
from ledgerd.store.documents.docjoin import join_group
from ledgerd.store.documents.doclayout import State
from ledgerd.store.pieces.digest import TOMBSTONE, value_chunk_digest
from ledgerd.store.tree import dots
from ledgerd.store.tree.btree import RawEntry

DEVICES = 4
BOUND = 2
GROUP = doclayout.doc_prefix("c", b"\x01" * 16)
HEAD = doclayout.head_key_of_group(GROUP)
BODY = doclayout.body_key_of_group(GROUP)
ATTACHMENT = doclayout.attachment_key("c", b"\x01" * 16, b"\x02" * 16)

Group = dict[bytes, RawEntry]


@dataclass
class Device:
    tag: bytes
    group: Group = field(default_factory=dict)
    ctx: dots.Context = field(default_factory=dict)
    time: int = 0
    max_rev: int = 0


def _join(a: tuple[Group, dots.Context], b: tuple[Group, dots.Context]) -> Any:
    g = join_group(a[0], b[0], dots.seen_by(a[1]), dots.seen_by(b[1]))
    return dict(g), dots.join_contexts(a[1], b[1])


def _kept(group: Group) -> list[tuple[bytes, bytes]]:
    """(key, dot) of the live kept conflicts, highest ranked first."""
    prefix = doclayout.conflicts_of_group(GROUP)
    live = [(k, e[3]) for k, e in group.items() if k.startswith(prefix) and e[1] != TOMBSTONE]
    return sorted(live, reverse=True)


def _write(d: Device, step: int, resolve: int, state: int, attach: bool) -> None:
    """A write of the document on ``d``, as the document store makes one: a new head and
    body (and maybe an attachment) with a new dot, its conflicts carried but those
    ``resolve`` (a bit mask) names and those past the bound, each such one a tombstone."""
    d.time += 1
    dot = dots.make(d.time, d.tag)
    d.max_rev += step
    rev = d.max_rev.to_bytes(16, "big")
    g = dict(d.group)
    kept = _kept(g)
    for i, (k, _) in enumerate(kept):
        if resolve >> i & 1 or i >= BOUND:
            g[k] = (k, TOMBSTONE, 0, dot)
    g[HEAD] = (HEAD, value_chunk_digest(doclayout.encode_head(rev, State(state))), 0, dot)
    g[BODY] = (BODY, value_chunk_digest(b"body %d" % d.max_rev), 0, dot)
    if attach:
        g[ATTACHMENT] = (ATTACHMENT, value_chunk_digest(b"att %d" % d.max_rev), 1, dot)
    d.group = g
    d.ctx = {**d.ctx, d.tag: d.time}
    assert len(_kept(g)) <= BOUND


def _max_rev(group: Group) -> int:
    revs = [int.from_bytes(k[-34:-18], "big") for k, _ in _kept(group)]
    h = group.get(HEAD)
    if h is not None and h[1] != TOMBSTONE:
        revs.append(int.from_bytes(h[1][1:17], "big"))
    return max(revs, default=0)


step = st.one_of(
    st.tuples(
        st.just("write"),
        st.integers(0, DEVICES - 1),
        st.tuples(st.integers(1, 50), st.integers(0, 15), st.integers(0, 2), st.booleans()),
    ),
    st.tuples(st.just("join"), st.integers(0, DEVICES - 1), st.integers(0, DEVICES - 1)),
)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(step, min_size=1, max_size=40))
def test_the_group_join_is_a_semilattice(steps: list[Any]) -> None:
    devices = [Device(bytes([i + 1]) * 8) for i in range(DEVICES)]
    states: list[tuple[Group, dots.Context]] = [({}, {})]
    for kind, i, arg in steps:
        d = devices[i]
        if kind == "write":
            _write(d, *arg)
        else:
            other = devices[arg]
            d.group, d.ctx = _join((d.group, d.ctx), (other.group, other.ctx))
            d.time = max(d.time, dots.latest(d.ctx))
            d.max_rev = max(d.max_rev, other.max_rev, _max_rev(d.group))
        states.append((d.group, d.ctx))
    picked = states[:: max(1, len(states) // 8)][-8:] + [(d.group, d.ctx) for d in devices]
    for a in picked:
        assert _join(a, a) == (a[0], a[1])
        for b in picked:
            ab = _join(a, b)
            assert ab == _join(b, a)
            for c in picked:
                assert _join(ab, c) == _join(a, _join(b, c))


def test_concurrent_revisions_are_both_kept_in_either_order() -> None:
    """Two devices write the document concurrently: the join keeps the higher-ranked
    revision whole and the other as a kept conflict with its own dot, whichever side
    joins which."""
    a, b = Device(b"a" * 8), Device(b"b" * 8)
    _write(a, 5, 0, 0, True)
    _write(b, 3, 0, 0, False)
    ab = _join((a.group, a.ctx), (b.group, b.ctx))
    assert ab == _join((b.group, b.ctx), (a.group, a.ctx))
    g = ab[0]
    assert g[HEAD] == a.group[HEAD] and g[ATTACHMENT] == a.group[ATTACHMENT]
    ((key, dot),) = _kept(g)
    assert dot == b.group[HEAD][3] and g[key][1] == b.group[BODY][1]


def test_the_bound_is_no_part_of_the_join() -> None:
    """Why a write, not the join, drops conflicts past the bound: were the join to keep
    only the highest-ranked conflicts, joining A (y, x kept), B (z) and C (x resolved
    by w, z unseen) would depend on the grouping (z gone one way, kept the other)."""
    p, q, r, s = (Device(bytes([n]) * 8) for n in (1, 2, 3, 4))
    _write(p, 10, 0, 0, False)  # x
    _write(q, 20, 0, 0, False)  # y
    _write(s, 5, 0, 0, False)  # z
    a = _join((q.group, q.ctx), (p.group, p.ctx))
    assert len(_kept(a[0])) == 1
    r.group, r.ctx, r.max_rev = a[0], a[1], 20
    _write(r, 10, 0b1, 0, False)  # w, resolving x
    b, c = (s.group, s.ctx), (r.group, r.ctx)
    left = _join(_join(a, b), c)
    assert left == _join(a, _join(b, c))
    assert left[0][HEAD] == r.group[HEAD]
    assert [dot for _, dot in _kept(left[0])] == [s.group[HEAD][3]]  # z stays
