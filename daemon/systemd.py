"""systemd integration without libsystemd: notifications, the watchdog, socket activation.

This module owns talking to the service manager: ``sd_notify`` messages
(READY=1, STOPPING=1, STATUS=..., WATCHDOG=1) over ``$NOTIFY_SOCKET``, the
watchdog keep-alive task (``$WATCHDOG_USEC``), and picking up a listening socket
passed by ``ledgerd.socket`` (``$LISTEN_FDS``). Outside systemd every function
here does nothing.
"""

from __future__ import annotations

import asyncio
import logging
import os
import socket

log = logging.getLogger(__name__)

SD_LISTEN_FDS_START = 3


def notify(message: str) -> bool:
    """Send one notification; returns False when not running under systemd."""
    address = os.environ.get("NOTIFY_SOCKET")
    if not address:
        return False
    if address.startswith("@"):
        address = "\0" + address[1:]
    try:
        with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM | socket.SOCK_CLOEXEC) as s:
            s.connect(address)
            s.sendall(message.encode())
        return True
    except OSError as e:
        log.warning("could not notify systemd (%s): %s", message.split("\n")[0], e)
        return False


def watchdog_interval() -> float | None:
    """Half the watchdog timeout in seconds, if systemd asked for keep-alives."""
    usec = os.environ.get("WATCHDOG_USEC")
    pid = os.environ.get("WATCHDOG_PID")
    if not usec or (pid and pid != str(os.getpid())):
        return None
    try:
        return max(int(usec) / 2_000_000, 0.01)
    except ValueError:
        return None


async def watchdog(interval: float) -> None:
    """Ping the watchdog while the event loop is responsive."""
    while True:
        notify("WATCHDOG=1")
        await asyncio.sleep(interval)


def listen_socket() -> socket.socket | None:
    """The Unix socket passed by socket activation, if any."""
    if os.environ.get("LISTEN_PID") != str(os.getpid()):
        return None
    try:
        n = int(os.environ.get("LISTEN_FDS", "0"))
    except ValueError:
        return None
    if n < 1:
        return None
    if n > 1:
        log.warning("socket activation passed %d sockets; using the first", n)
    for var in ("LISTEN_PID", "LISTEN_FDS", "LISTEN_FDNAMES"):
        os.environ.pop(var, None)
    sock = socket.socket(fileno=SD_LISTEN_FDS_START)
    sock.setblocking(False)
    return sock
