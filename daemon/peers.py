"""Who may use the API: the credentials of the process at the other end of the socket.

This module owns reading a connection's peer credentials (``SO_PEERCRED``, once per
connection) and the rule over them (``allowed_users``, ``socket_group``); the refusal
itself (403 ``peer_refused``) is :meth:`daemon.api.Api.admit`'s.
"""

from __future__ import annotations

import asyncio
import grp
import pwd
import socket
import struct
import weakref

from aiohttp import web

from ledgerd.daemon.config import Config

_peer_cache: weakref.WeakKeyDictionary[asyncio.BaseTransport, tuple[int, int] | None] = (
    weakref.WeakKeyDictionary()
)
_ASK = (-1, -1)  # what the cache answers for a transport it does not know yet


def peer_credentials(request: web.Request) -> tuple[int, int] | None:
    """(uid, gid) of the process at the other end of the Unix socket.

    The kernel fixes them when the peer connects, so they are asked once per
    connection, not once per request.
    """
    transport = request.transport
    if transport is None:
        return None
    known = _peer_cache.get(transport, _ASK)
    if known is not _ASK:
        return known
    sock = transport.get_extra_info("socket")
    creds: tuple[int, int] | None = None
    if sock is not None and sock.family == socket.AF_UNIX:
        raw = sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i"))
        _pid, uid, gid = struct.unpack("3i", raw)
        creds = int(uid), int(gid)
    _peer_cache[transport] = creds
    return creds


def _in_group(uid: int, gid: int) -> bool:
    try:
        name = pwd.getpwuid(uid).pw_name
        return name in grp.getgrgid(gid).gr_mem or pwd.getpwuid(uid).pw_gid == gid
    except KeyError:
        return False


class Peers:
    """The users the configuration lets in (``allowed_users``, or this user and root)
    and the members of ``socket_group`` (looked up once per user)."""

    def __init__(self, cfg: Config) -> None:
        self.uids = cfg.allowed_uids()
        self.group = cfg.socket_gid()
        self._peers: dict[int, bool] = {}

    def allowed(self, uid: int, gid: int) -> bool:
        """Listed users (or this user and root) and members of ``socket_group``."""
        if uid in self.uids:
            return True
        if self.group is None:
            return False
        if gid == self.group:
            return True
        if uid not in self._peers:
            self._peers[uid] = _in_group(uid, self.group)
        return self._peers[uid]
