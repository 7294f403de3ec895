"""The SQLite schemas: one per-page database and the repository-wide page-usage database.

This module owns every ``CREATE`` statement and the schema version
(``PRAGMA user_version``), with the migrations between versions. It runs no
queries of its own beyond creating and migrating.

Sync status of a stored piece:

======  ===========  ==========================================================
value   name         meaning
======  ===========  ==========================================================
0       transient    staged by an open journal (or a value still being written)
1       local        a value this device wrote, not yet in the cloud
2       synced       in the cloud (uploaded by us or seen in another device's
                     pack), or a tree node (which never leaves the device)
======  ===========  ==========================================================

Schema version 2 keeps the first two in ``unsynced``, a narrow table keyed by the
piece's ``objects.id``; a stored piece without such a row is synced, and a piece
not stored but listed in ``remote_pieces`` is synced too. Version 1 kept every
status in a table keyed by digest, so storing a piece cost two random index
inserts; now the second is an append (new pieces get increasing ids), and an
upload deletes narrow rows rather than rewriting the pieces' own rows.
"""

from __future__ import annotations

import functools
import logging
import sqlite3

from ledgerd.store.errors import CorruptDatabaseError, SchemaError

FORMAT_VERSION = 3
"""Path component of the repository layout: ``{data_dir}/{FORMAT_VERSION}/ledgers/...``.
Format 3 carries values of up to 128 bytes inside their digests
(:data:`store.pieces.digest.INLINE_LIMIT`; 32 before); format 2 kept a dot in every entry
(:mod:`store.tree.dots`). Formats 1 and 2 (unreleased development versions) are not
read: the same value had another digest there."""

SCHEMA_VERSION = 3
"""``PRAGMA user_version`` of a current page database. Version 3 stores a tree node a
commit rewrote as a delta against the node it replaced (``objects.base``,
:mod:`store.pieces.delta`) and indexes four bytes of each piece's digest
(``objects_digest``); version 2 stored every piece whole and indexed eight bytes;
version 1 had a unique index on the whole digest."""


def digest_key(digest: str) -> str:
    """The SQL of what ``objects_digest`` indexes, for the digest ``digest`` (a column or
    a parameter): four bytes of its hash, after the digest's type byte. A query finds a
    piece by digest through the index only if it says this expression. (Four bytes tell
    apart the pieces of a page of a hundred million with one row too many read in
    forty lookups; each new piece's entry is one random insert into the index, whose
    pages a commit dirties: smaller entries dirty fewer, see docs/performance.md.)"""
    return f"substr({digest}, 2, 4)"


DIGEST_KEY = digest_key("digest")
"""``objects_digest``'s expression, as :data:`PAGE_SCHEMA` and the migration write it."""

DIGEST_IN = f"{DIGEST_KEY} IN ({{keys}}) AND digest IN ({{marks}})"
"""SQL for :meth:`store.sqlite.db.Database.read_in`: ``objects`` rows whose digest is
one of a chunk's (``{keys}`` becomes the chunk's prefixes, ``{marks}`` its digests)."""


def digest_is(column: str, value: str) -> str:
    """SQL true when ``column`` (``digest`` or ``o.digest`` of ``objects``) equals the
    digest ``value`` (a parameter such as ``?1`` or another table's column), found
    through ``objects_digest``."""
    return f"{digest_key(column)} = {digest_key(value)} AND {column} = {value}"


CHAIN_LIMIT = 64
"""Rows a chain query follows at most past the piece asked for: more than any chain
storage makes (:data:`store.pieces.delta.MAX_DEPTH`), so that a damaged file whose
bases loop ends the query, and the chain is reported as not ending."""


def chain_of(where: str) -> str:
    """SQL of the rows that rebuild the pieces of ``objects`` that ``where`` selects: for
    each, ``(digest, data, is a delta, 0, digest)``, then its base's row at depth 1
    (``(digest asked for, data, is a delta, 1, the base's digest)``), and so on to a
    piece stored whole (:func:`store.pieces.delta.assemble`). One statement, so
    one snapshot of the file: a chain read in two could lose its base to a collection
    in between."""
    return (
        "WITH RECURSIVE chain(asked, data, base, depth, digest) AS ("
        f"SELECT digest, data, base, 0, digest FROM objects WHERE {where} "
        "UNION ALL SELECT c.asked, o.data, o.base, c.depth + 1, o.digest FROM chain c "
        f"CROSS JOIN objects o ON o.id = c.base WHERE c.depth < {CHAIN_LIMIT}) "
        "SELECT asked, data, base IS NOT NULL, depth, digest FROM chain"
    )


CHAIN_IN = chain_of(DIGEST_IN)
""":func:`chain_of` the pieces a :meth:`store.sqlite.db.Database.read_in` chunk names."""


TRANSIENT, LOCAL, SYNCED = 0, 1, 2
CONTEXT_ROW = "context"
"""``page_metadata`` row: the head's context (:func:`store.tree.dots.encode_context`)."""
UPLOADED_ROW = "uploaded"
"""``sync_metadata`` row: the clock time (decimal) up to which this device's own writes
to the page are uploaded; its writes past it are not (:mod:`store.page.exchange`)."""
UPLOADED_AT_ROW = "uploaded_at"
"""``sync_metadata`` row: the commit that was the head when the last upload was read
(an upload diffs from its tree)."""
PIECES_WAITING = "pieces/"
"""Prefix of ``sync_metadata`` rows, one per device, that sync sets while value pieces
from the cloud wait for the entries that refer to them (a large upload spreads them
over packs before the one with its entries): the sequence numbers of those packs
(``0``: none; :func:`store.page.exchange.waiting_seqs`). Garbage collection keeps the
pieces from the cloud while any row is not ``0``, for nothing refers to them yet."""
INCREMENTAL_VACUUM = 2
"""``PRAGMA auto_vacuum`` of a page file."""

log = logging.getLogger(__name__)

PAGE_SCHEMA = """
-- objects: stored pieces (chunks and index pieces of values and of tree nodes).
--   id:     assigned on insert, increasing; never reused while the row exists and
--           never changed (an INTEGER PRIMARY KEY: VACUUM keeps it), so that
--           unsynced can refer to it.
--   digest: a hashed digest (store.pieces.digest); inline pieces are never rows.
--   data:   the piece's exact content when base is NULL; else a delta against the
--           piece whose id is base (store.pieces.delta), which may be a delta too.
--           The piece rebuilt verifies against digest unless the file was damaged,
--           which every read checks.
--   base:   NULL, or the id of the piece data is a delta against: only a tree node
--           a commit rewrote (store.sqlite.sql.put_deltas). Garbage collection
--           stores a kept delta whole before it deletes its base (store.page.gc).
--   depth:  NULL for a whole piece, else 1 + its base's depth (at most
--           store.pieces.delta.MAX_DEPTH): rows a cold read follows.
--   Rows are deleted only when transient and garbage (see unsynced).
--   A digest has at most one row: store.sqlite.sql.put_pieces inserts only those not
--   stored, in the write transaction (no UNIQUE constraint: see objects_digest).
CREATE TABLE objects (
    id     INTEGER PRIMARY KEY,
    digest BLOB NOT NULL,
    data   BLOB NOT NULL,
    base   INTEGER,
    depth  INTEGER
);

-- objects_digest: finds a piece by four bytes of its digest's hash (DIGEST_KEY); a
--   lookup compares the whole digest after it (digest_is, DIGEST_IN). Digests are
--   random, so a commit's new pieces land all over this index and dirty most of its
--   pages, which SQLite writes whole to the WAL and again at the checkpoint: entries of
--   four bytes and a row id, a quarter the size of the whole digest's, dirty about a
--   quarter of the pages.
CREATE INDEX objects_digest ON objects (substr(digest, 2, 4));

-- unsynced: the stored value pieces not yet in the cloud, by objects.id: status 0
--   transient, 1 local (see the module docstring). No row: synced (or a tree node). A status
--   only increases (a row goes from 0 to 1, and is deleted when the piece is
--   synced). A status 0 piece with no journal_pieces row is garbage (a discarded
--   journal's): it is deleted with its objects row. Small in steady state.
-- The CHECK says BETWEEN, not IN (0, 1): SQLite builds an IN list's lookup table
--   at every execution, which cost a third of a batch's inserts.
CREATE TABLE unsynced (
    id     INTEGER PRIMARY KEY,
    status INTEGER NOT NULL CHECK (status BETWEEN 0 AND 1)
);

-- piece_status: every stored piece with its status (for reading, tests and
--   operators; the code writes objects and unsynced). Pieces known only through
--   remote_pieces (synced, not fetched) are not in it.
CREATE VIEW piece_status AS
    SELECT o.id, o.digest, o.data, coalesce(u.status, 2) AS status
    FROM objects o LEFT JOIN unsynced u ON u.id = o.id;

-- journal_pieces: which open journal staged which piece. journal_id starts with
--   'I' (implicit journal, survives a crash), 'E' (explicit journal/transaction,
--   discarded on start) or 'U' (a value being streamed in, discarded on start).
--   Rows exist only while the journal is open, so the table stays small and
--   has no index by digest (collection scans it once).
CREATE TABLE journal_pieces (
    journal_id TEXT NOT NULL,
    digest     BLOB NOT NULL,
    PRIMARY KEY (journal_id, digest)
) WITHOUT ROWID;

-- commits: every commit of this page's local history (a line: store.page.graph). id =
--   hash of data (store.tree.commit); data is the deterministic encoding; the other
--   columns are copies of fields of data, kept for queries. generation = 1 + the
--   parent's, 0 for the first commit. Rows are never changed or deleted (a pruned
--   commit keeps its row: see pruned_commits).
CREATE TABLE commits (
    id         BLOB PRIMARY KEY,
    data       BLOB NOT NULL,
    generation INTEGER NOT NULL,
    timestamp  INTEGER NOT NULL,
    root       BLOB NOT NULL
) WITHOUT ROWID;

-- commit_parents: edges of the commit graph (child -> parent).
CREATE TABLE commit_parents (
    child  BLOB NOT NULL,
    parent BLOB NOT NULL,
    PRIMARY KEY (child, parent)
) WITHOUT ROWID;

-- heads: the page's current commit: one row once the page has its first commit.
CREATE TABLE heads (
    commit_id BLOB PRIMARY KEY,
    timestamp INTEGER NOT NULL
) WITHOUT ROWID;

-- conflicts: the keys whose entry in the head holds siblings of different values
--   (concurrent writes: store.tree.dots), kept by every commit that changes them. Derived
--   from the head's tree: a key is here exactly when its entry has such siblings.
CREATE TABLE conflicts (
    key BLOB PRIMARY KEY
) WITHOUT ROWID;

-- journals: open journals. id as in journal_pieces; implicit journals ('I...')
--   apply to the page's head when they are committed. cleared = 1 if the journal
--   starts by dropping every entry (a 'clear'); entries then apply to the empty
--   page. since is when the journal's first write was acknowledged (UNIX µs): its
--   commit is stamped with it, also when a crash left the journal; NULL: unknown.
CREATE TABLE journals (
    id      TEXT PRIMARY KEY,
    cleared INTEGER NOT NULL DEFAULT 0,
    since   INTEGER
) WITHOUT ROWID;

-- journal_entries: the changes of an open journal, one per key (the last write
--   to a key wins within a journal). value IS NULL means delete; otherwise value
--   is the value's root digest and priority 0 = EAGER, 1 = LAZY.
CREATE TABLE journal_entries (
    journal_id TEXT NOT NULL,
    key        BLOB NOT NULL,
    value      BLOB,
    priority   INTEGER NOT NULL DEFAULT 0,
    PRIMARY KEY (journal_id, key)
) WITHOUT ROWID;

-- pruned_commits: commits whose tree and values are no longer kept here (history
--   retention, store.page.gc). Their commits rows stay, so that the graph, generations
--   and common ancestors still work; reading at one of them is refused
--   (HistoryPrunedError). A row is never deleted: once pruned, a commit's pieces may
--   be gone. The head is never pruned.
CREATE TABLE pruned_commits (
    commit_id BLOB PRIMARY KEY
) WITHOUT ROWID;

-- sync_metadata: small named values owned by sync (what was uploaded last, cursors).
CREATE TABLE sync_metadata (
    name  TEXT PRIMARY KEY,
    value BLOB NOT NULL
) WITHOUT ROWID;

-- remote_pieces: where a piece that is in the cloud but not stored here can be
--   fetched (LAZY values): an opaque location owned by sync (pack name and byte
--   range). A row is dropped when the piece is stored here (fetched, or written
--   by this device: it is then synced already).
CREATE TABLE remote_pieces (
    digest   BLOB PRIMARY KEY,
    location TEXT NOT NULL
) WITHOUT ROWID;

-- page_metadata: small named values owned by the store (merge policy, the head's
--   context: store.page.graph.CONTEXT).
CREATE TABLE page_metadata (
    name  TEXT PRIMARY KEY,
    value BLOB NOT NULL
) WITHOUT ROWID;
"""

USAGE_SCHEMA = """
-- repository: small named values of the repository. 'device_id' = 16 random
--   bytes generated once, naming this device in the cloud; never changes. Names
--   under 'sync/' belong to the sync engine (its sequence number, cursors, and
--   whether this device registered itself in the bucket).
CREATE TABLE repository (
    name  TEXT PRIMARY KEY,
    value BLOB NOT NULL
) WITHOUT ROWID;

-- page_usage: one row per page stored on this device ('opened/{ledger}{page}'
--   in the Ledger storage layout). closed_at is the UNIX time in milliseconds the
--   page was last closed, 0 while it is open. deleted is 1 when the page's head was
--   a deleted page's tree (store/page/deleted.py) when it was last closed or deleted here:
--   listings leave it out; an open page is asked directly instead. Rows are never
--   removed (the page's files stay until garbage collection frees them). evicted
--   (store.repo.eviction): 0 the page is stored here; 1 its storage was deleted because
--   the bucket had all of it (its next use restores it from there); 2 it was deleted
--   empty and never synced (its next use starts it empty again). A page directory is
--   deleted before its row says evicted; a directory renamed '*.evicting' is an
--   eviction cut short, finished at the next open. written (evicted pages): the
--   time of this device's last write to the page when it was evicted (-1: none); a
--   restore that does not bring every one of them back fails, since the page's
--   next write would claim to have seen them (store.repo.eviction).
CREATE TABLE page_usage (
    ledger    BLOB NOT NULL,
    page      BLOB NOT NULL,
    closed_at INTEGER NOT NULL,
    deleted   INTEGER NOT NULL DEFAULT 0 CHECK (deleted IN (0, 1)),
    evicted   INTEGER NOT NULL DEFAULT 0,
    written   INTEGER NOT NULL DEFAULT -1,
    PRIMARY KEY (ledger, page)
) WITHOUT ROWID;
"""

USAGE_SCHEMA_VERSION = 4

_USAGE_MIGRATIONS: dict[int, str] = {
    # 1 -> 2: page_usage gains deleted (no page was deleted before).
    1: """
ALTER TABLE page_usage ADD COLUMN deleted INTEGER NOT NULL DEFAULT 0 CHECK (deleted IN (0, 1));
""",
    # 2 -> 3: page eviction.
    2: "ALTER TABLE page_usage ADD COLUMN evicted INTEGER NOT NULL DEFAULT 0;",
    # 3 -> 4: an evicted page's own writes, which its restore must bring back.
    3: "ALTER TABLE page_usage ADD COLUMN written INTEGER NOT NULL DEFAULT -1;",
}
"""Statements that take the page-usage database from version ``n`` to ``n + 1``."""

_MIGRATIONS: dict[int, str] = {
    # 1 -> 2: the unique index on objects.digest becomes objects_digest, on a prefix. A
    # UNIQUE column's index cannot be dropped: the table is made anew with the same ids
    # (unsynced refers to them). The view names objects, so it goes and comes back.
    1: """
DROP VIEW piece_status;
CREATE TABLE objects_2 (
    id     INTEGER PRIMARY KEY,
    digest BLOB NOT NULL,
    data   BLOB NOT NULL
);
INSERT INTO objects_2 (id, digest, data) SELECT id, digest, data FROM objects ORDER BY id;
DROP TABLE objects;
ALTER TABLE objects_2 RENAME TO objects;
CREATE INDEX objects_digest ON objects (substr(digest, 2, 8));
CREATE VIEW piece_status AS
    SELECT o.id, o.digest, o.data, coalesce(u.status, 2) AS status
    FROM objects o LEFT JOIN unsynced u ON u.id = o.id;
""",
    # 2 -> 3: a piece may be a delta against another (every stored piece is whole), and
    # objects_digest holds four bytes of each digest, not eight.
    2: """
ALTER TABLE objects ADD COLUMN base INTEGER;
ALTER TABLE objects ADD COLUMN depth INTEGER;
DROP INDEX objects_digest;
CREATE INDEX objects_digest ON objects (substr(digest, 2, 4));
""",
}
"""Statements that take a page database from version ``n`` to ``n + 1``."""


def _version(conn: sqlite3.Connection, version: int) -> int:
    current = int(conn.execute("PRAGMA user_version").fetchone()[0])
    if current > version:
        raise SchemaError(
            f"database schema version {current} is newer than this ledgerd supports ({version})"
        )
    if current < 0:
        raise CorruptDatabaseError(
            f"{_name(conn)} is damaged: database schema version {current} is not valid"
        )
    return current


@functools.lru_cache(maxsize=8)
def _names(schema: str) -> frozenset[str]:
    """The tables, indexes and views ``schema`` creates."""
    mem = sqlite3.connect(":memory:")
    try:
        for statement in _statements(schema):
            mem.execute(statement)
        return frozenset(r[0] for r in mem.execute(_NAMES))
    finally:
        mem.close()


_NAMES = "SELECT name FROM sqlite_schema WHERE name NOT LIKE 'sqlite_%'"


def _check_names(conn: sqlite3.Connection, schema: str, version: int) -> None:
    """Refuse a database at the current version that lacks a table, index or view of
    its schema (dropped by hand or by damage): every request of it would fail with
    SQLite's own "no such table", as a bug."""
    missing = _names(schema) - {r[0] for r in conn.execute(_NAMES)}
    if missing:
        raise CorruptDatabaseError(
            f"{_name(conn)} is damaged: its schema version is {version}, but it has no "
            f"{', '.join(sorted(missing))}"
        )


def _apply(conn: sqlite3.Connection, schema: str, version: int, migrations: dict[int, str]) -> None:
    current = _version(conn, version)
    if current == version:
        _check_names(conn, schema, version)
        return
    conn.execute("BEGIN IMMEDIATE")
    try:
        # Read again under the write lock: another connection may have just done it.
        current = _version(conn, version)
        if current == 0:
            for statement in _statements(schema):
                conn.execute(statement)
        elif current < version:
            log.info("migrating %s from schema version %d to %d", _name(conn), current, version)
            for v in range(current, version):
                for statement in _statements(migrations[v]):
                    conn.execute(statement)
        conn.execute(f"PRAGMA user_version = {version}")
        conn.execute("COMMIT")
    except sqlite3.OperationalError as e:
        conn.execute("ROLLBACK")
        if e.sqlite_errorcode & 0xFF != sqlite3.SQLITE_ERROR:
            raise  # busy, I/O, corrupt: the caller translates those
        # The tables are not what the version says (a damaged user_version): a
        # migration or the creation failed, and was rolled back.
        raise CorruptDatabaseError(
            f"{_name(conn)} is damaged: its schema version {current} does not match its "
            f"tables (nothing was changed): {e}"
        ) from e
    except BaseException:
        conn.execute("ROLLBACK")
        raise


def _name(conn: sqlite3.Connection) -> str:
    return str(conn.execute("PRAGMA database_list").fetchone()[2] or "an in-memory database")


def _statements(script: str) -> list[str]:
    lines = [ln for ln in script.splitlines() if not ln.lstrip().startswith("--")]
    return [s.strip() for s in "\n".join(lines).split(";") if s.strip()]


def create_page_schema(conn: sqlite3.Connection) -> None:
    """Create or migrate a page database (runs on the connection's own thread).

    A page file uses ``auto_vacuum = INCREMENTAL``, so that garbage collection
    (:mod:`store.page.gc`) can give freed pages back to the file system with
    ``PRAGMA incremental_vacuum``. SQLite applies that setting to an existing file
    only through a ``VACUUM``: a file made before (or a new, empty one) gets it
    once, here, at its first open by this version. VACUUM is atomic: a crash
    leaves the file as it was, and the next open does it again."""
    _apply(conn, PAGE_SCHEMA, SCHEMA_VERSION, _MIGRATIONS)
    ensure_incremental_vacuum(conn)


def ensure_incremental_vacuum(conn: sqlite3.Connection) -> None:
    """Set ``auto_vacuum = INCREMENTAL`` on the connection's file (a VACUUM, once)."""
    if int(conn.execute("PRAGMA auto_vacuum").fetchone()[0]) == INCREMENTAL_VACUUM:
        return
    log.info("%s: switching to incremental vacuum (a one-time VACUUM)", _name(conn))
    conn.execute(f"PRAGMA auto_vacuum = {INCREMENTAL_VACUUM}")
    conn.execute("VACUUM")


def create_usage_schema(conn: sqlite3.Connection) -> None:
    _apply(conn, USAGE_SCHEMA, USAGE_SCHEMA_VERSION, _USAGE_MIGRATIONS)


DOC_INDEX_SCHEMA = """
-- doc_state: what the document layer's local views reflect.
--   'reflected': the id of the commit every ready index (and max_rev) reflects,
--                no row: nothing yet (the empty page).
--   'max_rev':   the highest _rev (16 bytes) in that commit's documents: the
--                floor of the revision clock after a restart.
--   'key_format': how the index keys are packed (KEY_FORMAT), no row: the first
--                format, whose indexes are built again.
CREATE TABLE IF NOT EXISTS doc_state (
    name  TEXT PRIMARY KEY,
    value BLOB NOT NULL
);

-- doc_indexes: the indexes this device keeps, one per definition in the tree.
--   definition: the definition's bytes in the tree (doclayout.encode_definition),
--               a row whose definition differs from the tree's is rebuilt.
--   ready:      1 when its rows reflect doc_state.reflected, 0 while it is
--               being built (its rows are partial and never read, rebuilt from
--               scratch after a restart).
CREATE TABLE IF NOT EXISTS doc_indexes (
    id         INTEGER PRIMARY KEY,
    collection TEXT NOT NULL,
    name       TEXT NOT NULL,
    definition BLOB NOT NULL,
    ready      INTEGER NOT NULL DEFAULT 0,
    UNIQUE (collection, name)
);

-- doc_index_rows: one row per indexed document and index. key is the tuple-packed
--   (partition value[, sort value]), doc the document id (16 bytes), deleted 1
--   for a soft-deleted document (hidden from queries unless asked for). A
--   document without the indexed fields has no row (sparse).
CREATE TABLE IF NOT EXISTS doc_index_rows (
    ix      INTEGER NOT NULL,
    doc     BLOB NOT NULL,
    key     BLOB NOT NULL,
    deleted INTEGER NOT NULL,
    PRIMARY KEY (ix, doc)
) WITHOUT ROWID;
CREATE INDEX IF NOT EXISTS doc_index_order ON doc_index_rows (ix, key, doc);"""
"""The document layer's local views in a page's database (:mod:`store.documents.docindex`): never
uploaded, made when a page is first opened as documents."""


def create_doc_index_schema(conn: sqlite3.Connection) -> None:
    """Create the document views' tables in a page's database, if they are not there."""
    for statement in DOC_INDEX_SCHEMA.split(";"):
        if statement.strip():
            conn.execute(statement)
