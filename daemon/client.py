"""Python clients of the daemon: :class:`AsyncClient` (asyncio) and :class:`Client` (blocking).

This module is the clients' one import: it owns no code, only the map. Client programs
and ``ledgerctl`` import from here; the parts live in

* :mod:`ledgerd.daemon.client_types`: errors, result types (:class:`Item`,
  :class:`Change`, :class:`ResolveRequest`, ...), names quoted into URLs, the socket;
* :mod:`ledgerd.daemon.client_body`: what a value may be (:data:`Content`), the same
  for both clients;
* :mod:`ledgerd.daemon.client_http`: the connection over the Unix socket, URLs, the
  daemon's errors mapped;
* :mod:`ledgerd.daemon.client_async`: :class:`AsyncClient`, the calls of the HTTP API
  (values streamed, ranges paged through);
* :mod:`ledgerd.daemon.client_session`: WebSocket sessions (:class:`Session`),
  watchers as iterators (:class:`Watch`) and :class:`AsyncTransaction`;
* :mod:`ledgerd.daemon.client_bridge`: the one way from blocking code to the async
  classes, a private event loop on a thread and methods made blocking through it;
* :mod:`ledgerd.daemon.client_blocking`: :class:`Client` and its blocking sessions,
  watches, transactions and documents, the async classes through that bridge;
* :mod:`ledgerd.daemon.client_docs`: documents (``client.documents(ledger, page)``);
* :mod:`ledgerd.daemon.client_conflicts`: conflicts listed and resolved by hand
  (``client.conflicts()``, ``client.resolve(...)``).

::

    async with AsyncClient() as c:
        await c.put("notes", "inbox", b"k", b"v")
        async with c.transaction("notes", "inbox") as txn:
            await txn.put(b"a", b"1")

    with Client() as c:
        c.put("notes", "inbox", b"k", b"v")

Structured keys need nothing else: this module re-exports ``tuple`` (FoundationDB's
tuple layer), :class:`Subspace`, :class:`Versionstamp` and ``stamp_time`` from
:mod:`ledgerd.store`, for ``set_versionstamped_key`` and friends.
"""

from __future__ import annotations

from ledgerd.daemon.client_async import AsyncClient
from ledgerd.daemon.client_blocking import (
    BlockingResolver,
    BlockingSession,
    BlockingTransaction,
    BlockingWatch,
    Client,
)
from ledgerd.daemon.client_body import Content
from ledgerd.daemon.client_conflicts import PageConflicts, PendingConflict, Resolved, Sibling
from ledgerd.daemon.client_session import AsyncTransaction, Session, Transaction, Watch
from ledgerd.daemon.client_types import (
    CHUNK,
    Answer,
    Change,
    ConflictItem,
    DaemonUnavailableError,
    Item,
    LedgerError,
    Name,
    NotFoundError,
    Progress,
    ResolverCallback,
    ResolveRequest,
    Side,
    UnsafeSocketError,
    quote,
    socket_path,
    unb64,
)
from ledgerd.store import SingleFloat, Subspace, TupleError, Versionstamp, stamp_time

# Re-exported for client programs. ``tuple`` is the tuple layer in this module: write
# ``builtins.tuple`` for the type.
from ledgerd.store.keys import tuple

__all__ = [
    "CHUNK",
    "Answer",
    "AsyncClient",
    "AsyncTransaction",
    "BlockingResolver",
    "BlockingSession",
    "BlockingTransaction",
    "BlockingWatch",
    "Change",
    "Client",
    "ConflictItem",
    "Content",
    "DaemonUnavailableError",
    "Item",
    "LedgerError",
    "Name",
    "NotFoundError",
    "PageConflicts",
    "PendingConflict",
    "Progress",
    "ResolveRequest",
    "ResolverCallback",
    "Resolved",
    "Session",
    "Side",
    "Sibling",
    "SingleFloat",
    "Subspace",
    "Transaction",
    "TupleError",
    "UnsafeSocketError",
    "Versionstamp",
    "Watch",
    "quote",
    "socket_path",
    "stamp_time",
    "tuple",
    "unb64",
]
