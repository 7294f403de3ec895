"""Route dispatch: the index of :class:`ledgerd.daemon.router.Router` answers exactly as
trying every route of ``ROUTES`` in order (its first match by path and method)."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from ledgerd.daemon.routes import ROUTER, ROUTES, Route

METHODS = ["GET", "HEAD", "PUT", "POST", "DELETE", "PATCH", "OPTIONS"]
LITERALS = sorted({s for r in ROUTES for s in r.path if not s.startswith("{")})
SEGMENT = st.one_of(st.sampled_from(LITERALS), st.sampled_from(["", "x", "%2F", "_id"]), st.text())


def in_order(method: str, parts: list[str]) -> tuple[Route, dict[str, str]] | None:
    """What the index stands for: every route, in order."""
    for route in ROUTES:
        found = route.match(parts)
        if found is not None and method in route.methods:
            return route, found
    return None


@st.composite
def paths(draw: st.DrawFn) -> list[str]:
    """Paths under /v1/: random segments, or a page's path then random segments (keys
    of up to twenty segments, documents' paths)."""
    rest = draw(st.lists(SEGMENT, max_size=20))
    shape = draw(st.sampled_from(["any", "page", "keys", "docs"]))
    if shape == "any":
        return rest
    page = ["ledgers", draw(SEGMENT), "pages", draw(SEGMENT)]
    return page + ([shape] if shape != "page" else []) + rest


@given(st.sampled_from(METHODS), paths())
def test_the_index_answers_as_every_route_in_order(method: str, parts: list[str]) -> None:
    assert ROUTER.find(method, parts) == in_order(method, parts)


def test_every_route_is_found_with_its_parameters() -> None:
    for route in ROUTES:
        parts = [s.strip("{}*") + "-v" if s.startswith("{") else s for s in route.path]
        for method in route.methods:
            hit = ROUTER.find(method, parts)
            assert hit is not None and hit[0] == in_order(method, parts)[0]  # type: ignore[index]


def test_key_tails_wrong_methods_and_heads() -> None:
    page = ["ledgers", "L", "pages", "P"]
    hit = ROUTER.find("GET", [*page, "keys", "a", "", "b%2F"])
    assert hit is not None
    assert hit[0].template == "/v1/ledgers/{ledger}/pages/{page}/keys/{key}"
    assert hit[1] == {"ledger": "L", "page": "P", "key": "a//b%2F"}
    assert ROUTER.find("HEAD", [*page, "keys", "k"]) is not None
    assert ROUTER.find("PATCH", [*page, "keys", "k"]) is None  # 404 not_found, as any path
    assert ROUTER.find("GET", [*page, "keys"]) is None  # a key has at least one segment
    assert ROUTER.find("GET", []) is None
    # A literal segment listed first wins; another method falls through to {id}.
    docs = [*page, "docs", "c", "_indexes"]
    assert ROUTER.find("GET", docs)[0].handler.__name__ == "list_indexes"  # type: ignore[index]
    assert ROUTER.find("PUT", docs)[0].handler.__name__ == "replace_document"  # type: ignore[index]
