"""The reference docs: the site builds with strict link checking, the README's links into
it hold, and the tables that mirror the code (modules, configuration keys) list exactly
what exists."""

from __future__ import annotations

import dataclasses
import os
import re
import subprocess
import sys
from pathlib import Path

from markdown.extensions.toc import slugify

from ledgerd.daemon.config import Config

ROOT = Path(__file__).resolve().parent.parent
DOCS = ROOT / "docs"
PACKAGES = ("store", "sync", "daemon")
LEFT_OUT = {"__init__.py", "__main__.py"}
"""Modules the owner table leaves out (it says so): the packages' exports and entry."""

_LINK = re.compile(r"(?<!!)\[[^\]]*\]\(([^)\s]+)\)")
_HEADING = re.compile(r"^#{1,6}\s+(.*?)\s*#*\s*$", re.MULTILINE)
_FENCE = re.compile(r"^```.*?^```", re.MULTILINE | re.DOTALL)


def test_the_site_builds_with_strict_link_checking(tmp_path: Path) -> None:
    """``mkdocs build --strict``: any warning fails, among them a page missing from the
    nav, a link to a page or anchor that does not exist, or one out of docs/ (mkdocs.yml's
    ``validation``), and an included file that is missing (``check_paths``)."""
    done = subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "--quiet"]
        + ["--config-file", str(ROOT / "mkdocs.yml"), "--site-dir", str(tmp_path / "site")],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=240,
        env={**os.environ, "NO_MKDOCS_2_WARNING": "1"},
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert "WARNING" not in done.stderr, done.stderr
    for page in DOCS.glob("*.md"):
        built = tmp_path / "site" / ("" if page.stem == "index" else page.stem) / "index.html"
        assert built.is_file(), f"{page.name} was not built"
    # The included files made it into their pages.
    results = (tmp_path / "site" / "results" / "index.html").read_text()
    assert "bench.sim" in results
    configuration = (tmp_path / "site" / "configuration" / "index.html").read_text()
    assert "metrics_listen" in configuration and "--8&lt;--" not in configuration


def _anchors(page: Path) -> set[str]:
    """The anchors of a Markdown file's headings, as the site's ``toc`` makes them."""
    text = _FENCE.sub("", page.read_text())
    return {slugify(h.replace("`", ""), "-") for h in _HEADING.findall(text)}


def _relative_links(page: Path) -> list[str]:
    text = _FENCE.sub("", page.read_text())
    return [
        link
        for link in _LINK.findall(text)
        if not re.match(r"[a-z][a-z0-9+.-]*:", link) and not link.startswith("#")
    ]


def test_the_readmes_links_into_the_repository_exist() -> None:
    """The README is not part of the site, so mkdocs does not check it: every relative
    link it has must name a file that exists, and an anchor its page has."""
    links = _relative_links(ROOT / "README.md")
    assert sum(link.startswith("docs/") for link in links) >= 10, links
    broken = []
    for link in links:
        path, _, anchor = link.partition("#")
        target = ROOT / path
        if not target.exists():
            broken.append(f"{link}: no such file")
        elif anchor and anchor not in _anchors(target):
            broken.append(f"{link}: no heading makes #{anchor}")
    assert not broken, "broken links in README.md:\n" + "\n".join(broken)


def test_every_docs_page_is_linked_from_the_readme() -> None:
    """The README's map reaches every reference page."""
    linked = {Path(link.partition("#")[0]).name for link in _relative_links(ROOT / "README.md")}
    missing = sorted(p.name for p in DOCS.glob("*.md") if p.name not in linked)
    assert missing in ([], ["results.md"]), f"the README does not link {missing}"


def _table_after(page: Path, heading: str) -> list[list[str]]:
    """The rows (cells, stripped) of the first table after ``heading``."""
    text = page.read_text()
    start = text.index(f"\n{heading}\n")
    rows: list[list[str]] = []
    for line in text[start:].splitlines()[1:]:
        if line.startswith("|"):
            rows.append([c.strip() for c in line.strip().strip("|").split(" | ")])
        elif rows:
            break
    return rows[2:]  # past the header and its rule


def test_the_owner_table_names_every_module() -> None:
    """docs/architecture.md's "Who owns what" has one row per module of store/, sync/
    and daemon/, subpackages included (but their __init__ and __main__): no module is
    missing, none is named that does not exist."""
    rows = _table_after(DOCS / "architecture.md", "## Who owns what")
    named = [re.fullmatch(r"`((?:[a-z0-9_]+/)+[a-z0-9_]+\.py)`", row[0]) for row in rows]
    assert all(named), [row[0] for row, m in zip(rows, named, strict=True) if not m]
    listed = [m.group(1) for m in named if m]
    assert len(listed) == len(set(listed)), "a module is listed twice"
    assert all(row[1] for row in rows), "a module's row says nothing"
    exist = {
        path.relative_to(ROOT).as_posix()
        for package in PACKAGES
        for path in (ROOT / package).rglob("*.py")
        if path.name not in LEFT_OUT
    }
    missing, extra = sorted(exist - set(listed)), sorted(set(listed) - exist)
    where = "docs/architecture.md's owner table"
    assert not missing and not extra, f"{where}: missing {missing}, not a module {extra}"


def test_the_configuration_table_names_every_key() -> None:
    """docs/configuration.md's "Every key" lists the keys of daemon/config.py, in order."""
    rows = _table_after(DOCS / "configuration.md", "## Every key")
    listed = [row[0].strip("`") for row in rows]
    keys = [f.name for f in dataclasses.fields(Config)]
    assert listed == keys, (
        f"missing {sorted(set(keys) - set(listed))}, extra {sorted(set(listed) - set(keys))}"
    )
