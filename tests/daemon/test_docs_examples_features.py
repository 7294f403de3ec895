"""Issue 41's "done when": the README or the docs show each feature with an example that a
test runs. Each feature below names the page a user would look in and what a runnable
example there must hold (every pattern in one example); the examples run in
``tests/test_readme.py`` (``<!-- example -->``), ``tests/daemon/test_readme_examples.py``
(``<!-- example: daemon -->``) and ``tests/daemon/test_docs_examples_shell.py``
(``<!-- example: shell -->``)."""

from __future__ import annotations

import re
from collections.abc import Callable
from pathlib import Path

import pytest

from tests import test_readme
from tests.daemon import test_docs_examples_shell, test_readme_examples

ROOT = Path(__file__).resolve().parents[2]

KINDS: dict[str, Callable[[Path], list[str]]] = {
    "python": test_readme.examples_in,
    "daemon": test_readme_examples.examples_in,
    "shell": test_docs_examples_shell.examples_in,
}

FEATURES: list[tuple[str, str, str, list[str]]] = [
    # (feature, page, kind of example, patterns its example holds)
    ("chosen id: ledgerctl", "docs/documents.md", "shell", [r"ledgerctl doc put .*--id \S"]),
    ("chosen id: embedded", "docs/documents.md", "python", [r"\.create\(.*\bid="]),
    ("chosen id: client", "docs/python-api.md", "daemon", [r"\.create\(.*\bid=", "conflict"]),
    (
        "chosen id: PUT creates when free, 409 conflict when taken",
        "docs/documents.md",
        "shell",
        [r"-X PUT", r"\} 201$", r'"code": "conflict"', r"\} 409$"],
    ),
    ("_bulk_docs", "docs/documents.md", "shell", [r"/_bulk_docs", r'"error":"conflict"']),
    ("_bulk_docs: client", "docs/python-api.md", "daemon", [r"\.bulk_docs\("]),
    ("_find, paged by its bookmark", "docs/documents.md", "shell", [r"/_find", r"bookmark"]),
    ("_find: client", "docs/python-api.md", "daemon", [r"\.select\(.*", r"bookmark="]),
    (
        "_explain: a scan, then an index",
        "docs/documents.md",
        "shell",
        [r"/_explain", r'"scan":true', r'"scan":false'],
    ),
    ("ledgerctl doc find", "docs/documents.md", "shell", [r"^\$ ledgerctl doc find "]),
    (
        "ledgerctl get and put on the quick path",
        "docs/cli.md",
        "shell",
        [r"^\$ ledgerctl put \S+ \S+ \S+ \S", r"^\$ time ledgerctl get "],
    ),
    (
        "ls --at a unique commit-id prefix",
        "docs/cli.md",
        "shell",
        [r"cut -c1-6", r"^\$ ledgerctl ls .*--at "],
    ),
    (
        "watch on a missing page says it waits",
        "docs/cli.md",
        "shell",
        [r"ledgerctl watch ", r"waiting for it"],
    ),
    ("ledgerctl with no arguments prints help", "docs/cli.md", "shell", [r"^\$ ledgerctl\s*(#|$)"]),
    ("--quiet", "docs/cli.md", "shell", [r"ledgerctl --quiet ", r"^imported 1 entry$"]),
    (
        "POST /v1/sync?timeout=0.0001: 400 invalid_timeout",
        "docs/http-api.md",
        "shell",
        [r"/v1/sync\?timeout=0\.0001", r'"invalid_timeout".*400$'],
    ),
    (
        "a file://host cloud URL is refused",
        "docs/configuration.md",
        "shell",
        [r"--cloud file://host/", r"^\$ echo \$\?\n2$"],
    ),
    (
        "damaged data: exit status 5, check --repair",
        "docs/operations.md",
        "shell",
        [r"^ledgerctl: damaged data: ", r"^\$ echo \$\?\n5$", r"^\$ ledgerctl check --repair "],
    ),
    (
        "status: every page's sync, the devices, a conflict and how to resolve it",
        "docs/operations.md",
        "shell",
        [
            r"--cloud file://",
            r"automatic_with_fallback",
            r"^\$ ledgerctl status$",
            r"^page +\S+ +synced +last synced … UTC \(… s ago\)",
            r"^device +…  clock …, newest pack ",
            r"^conflict .*→ ledgerctl conflicts .*ledgerctl resolve ",
            r"^\$ kill ",
        ],
    ),
    (
        "ledgerctl conflicts and resolve, the resolution synced to the other device",
        "docs/merging.md",
        "shell",
        [
            r"--cloud file://",
            r"^\$ ledgerctl conflicts \S+ \S+$",
            r"^    theirs ",
            r"^\$ ledgerctl resolve \S+ \S+ \S+ --take ",
            r"^resolved 1 key",
            r"^\$ ledgerctl .*sync",
            r"^\$ ledgerctl --socket \S+ conflicts .*\nno conflicts in ",
        ],
    ),
    (
        "GET …/conflicts and POST …/conflicts/resolve",
        "docs/merging.md",
        "shell",
        [
            r"curl .*--unix-socket \S+ \S+/conflicts\b",
            r"-X POST \S+/conflicts/resolve",
            r'^\{"resolved": \[.*\], "conflicts": 0\}$',
        ],
    ),
    (
        "sync says what it retries while the bucket cannot be reached",
        "docs/cli.md",
        "shell",
        [
            r"--cloud s3://",
            r"ENDPOINT_URL=http://127\.0\.0\.1:9 ",
            r"^\$ ledgerctl sync --timeout \d+$",
            r"^retrying: … cannot reach http://127\.0\.0\.1:9 \(connection refused\)",
            r"^\$ echo \$\?\n4$",
        ],
    ),
    (
        "kept conflicts: ledgerctl doc get --conflicts/--rev, doc rm --rev, synced",
        "docs/documents.md",
        "shell",
        [
            r"--cloud file://",
            r"^\$ ledgerctl .*doc get \S+ \S+ \S+ \S+ --conflicts",
            r'"_conflicts":\["01…"\]',
            r"^\$ ledgerctl .*doc get \S+ \S+ \S+ \S+ --rev ",
            r"^\$ ledgerctl .*doc rm \S+ \S+ \S+ \S+ --rev ",
            r"^\$ ledgerctl .*sync",
            # then, on the other device, the document without _conflicts
            r"^\$ ledgerctl --socket \S+ doc get .* --conflicts --json\n\{\"_meta\":\{[^}\[]*\},",
        ],
    ),
    (
        "kept conflicts over HTTP: ?conflicts=1, _changes, ?rev=, PUT ?resolves=",
        "docs/documents.md",
        "shell",
        [
            r"--cloud file://",
            r"curl .*/people/ann\?conflicts=1",
            r"/_changes\?conflicts=1",
            r"\?rev=\$R",
            r"-X PUT .*\?resolves=\$R",
            r"-X DELETE .*\?rev=\$R",
            r"\} 409$",
        ],
    ),
    (
        "conflicts() and resolve(): client",
        "docs/merging.md",
        "daemon",
        [r"\.conflicts\(", r"\.resolve\(.*expect="],
    ),
]


@pytest.mark.parametrize(
    ("feature", "page", "kind", "patterns"), FEATURES, ids=[f[0] for f in FEATURES]
)
def test_the_feature_has_an_example_that_runs(
    feature: str, page: str, kind: str, patterns: list[str]
) -> None:
    examples = KINDS[kind](ROOT / page)
    assert any(
        all(re.search(p, example, re.MULTILINE) for p in patterns) for example in examples
    ), f"{page} has no {kind} example of {feature} (one holding {patterns})"
