"""What an integrity check of a page reports (:mod:`store.page.check` runs it).

This module owns the report: the problem codes (stable: the API and ``ledgerctl check
--json`` carry them), :class:`Problem`, :class:`PageCheck`, and the :class:`ContentCheck`
protocol through which the document layer reads its records. It reads nothing itself.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, NamedTuple, Protocol

SCAN_ROWS = 256
"""Stored pieces read and verified per query of the scan (pieces are at most 64 KiB)."""

INTEGRITY_ERRORS = 20
"""Most lines of ``PRAGMA integrity_check`` kept in a report."""

MAX_PROBLEMS = 1000
"""Most problems one page's report lists (the count says how many there were)."""

# Problem codes (stable: the API and ``ledgerctl check --json`` carry them).
SQLITE = "sqlite"
CORRUPT_PIECE = "corrupt_piece"
MISSING_PIECE = "missing_piece"
TRANSIENT_PIECE = "transient_piece"
COMMIT = "commit"
HEADS = "heads"
JOURNAL = "journal"
UNSYNCED = "unsynced"
REMOTE = "remote_pieces"
DUPLICATE_PIECE = "duplicate_piece"
"""A digest stored in more than one row (the repair keeps the first)."""
NOT_IN_CLOUD = "not_in_cloud"
CLOUD = "cloud"
NOT_CHECKED = "not_checked"
"""The page could not be opened for its check (every open-page slot in use): nothing
is known to be wrong with it; check it again."""
DAMAGED_DOCUMENT = "damaged_document"
"""A document record of the head does not decode (its pieces are sound)."""
UNSUPPORTED_LAYOUT = "unsupported_layout"
"""A document record or index definition of the head is of a layout a newer ledgerd wrote."""
DAMAGED_INDEX_DEFINITION = "damaged_index_definition"
"""An index definition of the head does not decode (its pieces are sound)."""
DOCUMENT_CODES = (DAMAGED_DOCUMENT, UNSUPPORTED_LAYOUT, DAMAGED_INDEX_DEFINITION)
"""Problems of documents, not of pieces: reported, never repaired here."""


class ContentRecord(NamedTuple):
    """A value the content check reads: what it is (the start of a problem's message),
    and whether it counts among :attr:`PageCheck.documents`."""

    where: str
    counted: bool


class ContentCheck(Protocol):
    """What the check reads in a document page's values beyond their pieces: the
    document layer's records (:data:`store.documents.doccheck.DOCUMENT_CHECK`)."""

    def record_of(self, key: bytes, value: bytes) -> ContentRecord | None:
        """The record the entry (``key``, its value's digest) holds, or None: none to read."""
        ...

    def problem_of(self, key: bytes, data: bytes) -> tuple[str, str] | None:
        """The problem code and why of the record at ``key`` whose contents are
        ``data``, or None: it reads."""
        ...


_content: list[ContentCheck] = []


def set_content_check(check: ContentCheck) -> None:
    """Make ``check`` the one that reads records (``ledgerd.store`` sets the document
    layer's when it is imported; a second, different one is refused)."""
    if _content and _content[0] is not check:
        raise ValueError("the check's content check is set already")
    _content[:] = [check]


def content_check() -> ContentCheck:
    """The check set by :func:`set_content_check`."""
    if not _content:
        raise RuntimeError("no content check: ledgerd.store sets it when it is imported")
    return _content[0]


@dataclass
class Problem:
    """One thing wrong with a page. ``digest``/``key``/``commit`` say where, when known."""

    code: str
    message: str
    digest: bytes | None = None
    key: bytes | None = None
    commit: bytes | None = None
    repaired: bool = False

    def json(self) -> dict[str, Any]:
        return {
            "code": self.code,
            "message": self.message,
            "digest": self.digest.hex() if self.digest is not None else None,
            "key": self.key,
            "commit": self.commit.hex() if self.commit is not None else None,
            "repaired": self.repaired,
        }


@dataclass
class PageCheck:
    """What :func:`check_page` found in one page."""

    ledger: bytes
    page: bytes
    problems: list[Problem] = field(default_factory=list)
    dropped: int = 0
    """Problems found beyond MAX_PROBLEMS (not listed)."""
    commits: int = 0
    stored: int = 0
    """Stored pieces read and verified."""
    reachable: int = 0
    """Distinct hashed pieces reachable from commits and journals."""
    remote: int = 0
    """Of those, the ones known to be in the cloud only (LAZY values not fetched)."""
    documents: int = 0
    """Document records of the head read and decoded (0: not a document page)."""

    def add(self, p: Problem) -> None:
        if len(self.problems) < MAX_PROBLEMS:
            self.problems.append(p)
        else:
            self.dropped += 1

    @property
    def healthy(self) -> bool:
        """Nothing is wrong, or everything that was has been repaired."""
        return not self.dropped and all(p.repaired for p in self.problems)

    def open_problems(self, *codes: str) -> list[Problem]:
        return [p for p in self.problems if not p.repaired and (not codes or p.code in codes)]

    def bad_pieces(self) -> list[bytes]:
        """Digests of pieces that are corrupt or missing here (to get from the cloud)."""
        out = [
            p.digest
            for p in self.open_problems(CORRUPT_PIECE, MISSING_PIECE)
            if p.digest is not None
        ]
        return list(dict.fromkeys(out))
