"""Where the Unix socket is, and whether its directory is safe: nobody but its owner can
replace the socket.

This module owns the socket's default path (the daemon's and the clients'), and the
strict-modes rule (OpenSSH's, for the same reason) that the daemon applies before it
listens and the clients apply before they connect. It does not create directories or
sockets (``daemon/server.py`` does).

Whoever can write to the directory that holds the socket can unlink it and bind
their own, and so read every request sent to it next. So:

* the socket's own directory must not be writable by group or others (a sticky
  bit does not make it safe: another user could bind the path while the daemon is
  down and wait for a client);
* each directory above it must not be writable by group or others either, unless
  it has the sticky bit (``/tmp``): there others cannot rename what they do not own;
* for the daemon, the socket's directory and those above it must belong to the
  daemon's user or to root. Clients do not check ownership: a daemon of another
  user (a system service with ``socket_group``) is legitimate.
"""

from __future__ import annotations

import os
import stat

# Paths here are strings (os.path), not pathlib's: ``ledgerctl``'s quick path
# (daemon/cli_quick.py) uses this module, and pathlib is slow to import.
StrPath = str | os.PathLike[str]


def default_socket_file() -> str:
    """``$RUNTIME_DIRECTORY/ledgerd.sock``, ``$XDG_RUNTIME_DIR/ledgerd/ledgerd.sock``,
    or ``/tmp/ledgerd-$UID/ledgerd.sock``. ``ledgerctl`` uses the same rule."""
    if d := os.environ.get("RUNTIME_DIRECTORY"):
        return os.path.join(d.split(":")[0], "ledgerd.sock")
    if d := os.environ.get("XDG_RUNTIME_DIR"):
        return os.path.join(d, "ledgerd", "ledgerd.sock")
    return f"/tmp/ledgerd-{os.getuid()}/ledgerd.sock"


def socket_file(path: StrPath | None = None) -> str:
    """The socket a client uses: the argument, ``$LEDGERD_SOCKET``, or the default."""
    if path:
        return os.fspath(path)
    if env := os.environ.get("LEDGERD_SOCKET"):
        return env
    return default_socket_file()


def _mode(st: os.stat_result) -> str:
    return f"{stat.S_IMODE(st.st_mode):04o}"


def socket_dir_problem(socket: StrPath, *, owner: int | None = None) -> str | None:
    """What makes ``socket``'s directory unsafe, as one sentence; None if it is safe.

    ``owner``: the uid that (besides root) must own the directories (the daemon's
    effective uid); None skips the ownership check (clients). A directory that does
    not exist is not a problem for a client (nothing can be connected to in it); for
    the daemon, which will create it, the directories it is created in must be safe.
    """
    directory = os.path.realpath(os.path.dirname(os.fspath(socket)) or ".")
    try:
        st = os.stat(directory)
    except FileNotFoundError:
        return None if owner is None else _parents_problem(directory, owner)
    except OSError as e:
        return f"cannot inspect the socket's directory {directory}: {e.strerror}"
    if not stat.S_ISDIR(st.st_mode):
        return f"{directory} is not a directory"
    if st.st_mode & 0o022:
        # A shared directory such as /tmp (sticky) is meant to be writable by all:
        # the socket goes into a directory of its own, never a chmod of the shared one.
        fix = (
            "put the socket in a directory of its own: under $XDG_RUNTIME_DIR, or one "
            f"made with mkdir -m 700 {directory}/ledgerd-{os.getuid()}"
            if st.st_mode & stat.S_ISVTX
            else f"use a directory only its owner can write (chmod go-w {directory})"
        )
        return (
            f"the socket's directory {directory} is writable by others (mode {_mode(st)}): "
            f"they could replace the socket; {fix}"
        )
    if owner is not None and st.st_uid not in (owner, 0):
        return (
            f"the socket's directory {directory} belongs to uid {st.st_uid}, "
            f"not to this user (uid {owner}) or root"
        )
    return _parents_problem(directory, owner)


def _parents_problem(directory: str, owner: int | None) -> str | None:
    """What makes a directory above the socket's unsafe (see the module docstring)."""
    parent = directory
    while (up := os.path.dirname(parent)) != parent:  # up to / included
        parent = up
        try:
            pst = os.stat(parent)
        except OSError as e:
            return f"cannot inspect {parent}: {e.strerror}"
        if pst.st_mode & 0o022 and not pst.st_mode & stat.S_ISVTX:
            return (
                f"{parent}, above the socket's directory, is writable by others "
                f"(mode {_mode(pst)}, no sticky bit): they could replace the socket's directory"
            )
        if owner is not None and pst.st_uid not in (owner, 0):
            return (
                f"{parent}, above the socket's directory, belongs to uid {pst.st_uid}, "
                f"not to this user (uid {owner}) or root"
            )
    return None
