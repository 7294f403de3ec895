"""How names and keys go into the daemon's URLs, for every client.

This module owns percent-encoding a ledger name, page id or key into a path segment or
query value (every byte but the unreserved ones). It imports nothing but the standard
library's basics, so that ``ledgerctl``'s quick path (:mod:`ledgerd.daemon.cli_quick`)
can use it without loading aiohttp; the clients import it through
:mod:`ledgerd.daemon.client_types`.
"""

from __future__ import annotations

Name = bytes | str

_UNRESERVED = frozenset(b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_~")


def raw(name: Name) -> bytes:
    """A name's bytes (a ``str`` as UTF-8)."""
    return name.encode() if isinstance(name, str) else bytes(name)


def quote(data: Name) -> str:
    """Percent-encode every byte but the unreserved ones (dots included)."""
    return "".join(chr(b) if b in _UNRESERVED else f"%{b:02X}" for b in raw(data))
