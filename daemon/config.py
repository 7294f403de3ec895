"""Daemon configuration: defaults, the TOML file, ``LEDGERD_*`` variables and flags.

This module owns every configuration key, its default, its validation and the
order in which sources override each other (later wins): built-in defaults, the
TOML file (``--config``, or ``LEDGERD_CONFIG``), ``LEDGERD_<KEY>`` environment
variables, command-line flags. ``config/ledgerd.toml`` documents each key.

Invalid configuration raises :class:`ConfigError` whose message is one line
naming the key; the daemon prints it and exits with status 2.
"""

from __future__ import annotations

import difflib
import grp
import logging
import math
import os
import pwd
import tomllib
from collections.abc import Callable
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any
from urllib.parse import urlparse

from ledgerd.daemon.socketdir import default_socket_file
from ledgerd.sync.crypto import KeyFileError, KeyRing, find_key_file, load_key_file
from ledgerd.sync.url import url_problem

LOG_LEVELS = ("debug", "info", "warning", "error")
MIN_HEARTBEAT = 0.01
"""The shortest heartbeat (``session_heartbeat``, a followed feed's ``?heartbeat=``):
a shorter one would spin the event loop sending pings or empty lines."""
DURABILITY = ("normal", "full")


class ConfigError(Exception):
    """Invalid configuration."""

    exit_code = 2


def default_data_dir() -> Path:
    if d := os.environ.get("STATE_DIRECTORY"):
        return Path(d.split(":")[0])
    base = os.environ.get("XDG_DATA_HOME") or os.path.expanduser("~/.local/share")
    return Path(base) / "ledgerd"


def default_socket() -> Path:
    """The daemon's socket by default (:func:`socketdir.default_socket_file`)."""
    return Path(default_socket_file())


@dataclass
class Config:
    data_dir: Path = field(default_factory=default_data_dir)
    socket: Path = field(default_factory=default_socket)
    socket_group: str = ""
    allowed_users: list[str] = field(default_factory=list)
    cloud: str = ""
    endpoint_url: str = ""
    encryption_key_file: str = ""
    sync_interval: float = 0.5
    sync_interval_max: float = 60.0
    sync_debounce: float = 0.5
    fetch_timeout: float = 60.0
    checkpoint_interval: float = 60.0
    max_checkpoint_bytes: int = 64 * 1024 * 1024
    compaction_grace: float = 30 * 24 * 3600.0
    compaction_interval: float = 24 * 3600.0
    log_level: str = "info"
    durability: str = "normal"
    max_batch_bytes: int = 64 * 1024 * 1024
    shutdown_timeout: float = 30.0
    page_idle_seconds: float = 300.0
    history_retention: float = 7 * 24 * 3600.0
    gc_interval: float = 3600.0
    disk_budget: float = 0.0
    evict_after: float = 0.0
    max_open_pages: int = 1024
    sqlite_threads: int = 8
    txn_memory: int = 64 * 1024 * 1024
    max_watch_queue: int = 1024
    max_watch_queue_bytes: int = 64 * 1024 * 1024
    cache_bytes: int = 64 * 1024 * 1024
    request_timeout: float = 60.0
    keepalive_timeout: float = 75.0
    listen_backlog: int = 1024
    max_connections: int = 2048
    max_concurrent_requests: int = 256
    max_followers: int = 256
    max_listing_bytes: int = 16 * 1024 * 1024
    max_session_queue: int = 1000
    max_session_queue_bytes: int = 64 * 1024 * 1024
    max_session_transactions: int = 100
    max_session_watchers: int = 256
    max_event_bytes: int = 4 * 1024 * 1024
    session_heartbeat: float = 30.0
    session_txn_idle_timeout: float = 600.0
    max_document_bytes: int = 1024 * 1024
    max_held_index_bytes: int = 16 * 1024 * 1024
    metrics_listen: str = ""

    # -- derived ---------------------------------------------------------------

    def allowed_uids(self) -> set[int]:
        """The uids that may connect: the listed users, or else this process's user and root.

        Members of ``socket_group`` may connect as well (see :meth:`socket_gid`).
        """
        if not self.allowed_users:
            return {os.getuid(), 0}
        return {_uid(u) for u in self.allowed_users}

    def socket_gid(self) -> int | None:
        if not self.socket_group:
            return None
        try:
            return grp.getgrnam(self.socket_group).gr_gid
        except KeyError:
            if self.socket_group.isdigit():
                return int(self.socket_group)
            raise ConfigError(f"socket_group: no such group {self.socket_group!r}") from None


def _uid(user: str) -> int:
    if user.isdigit():
        return int(user)
    try:
        return pwd.getpwnam(user).pw_uid
    except KeyError:
        raise ConfigError(f"allowed_users: no such user {user!r}") from None


_TYPES: dict[str, type] = {f.name: f.type for f in fields(Config)}  # type: ignore[misc]


def _as_path(value: Any) -> Path:
    if not isinstance(value, str | Path) or not str(value):
        raise ValueError("expected a path")
    return Path(os.path.abspath(os.path.expanduser(str(value))))


def _as_int(value: Any) -> int:
    if isinstance(value, bool) or (isinstance(value, float) and not value.is_integer()):
        raise ValueError("expected an integer")
    try:
        v = int(value)
    except ValueError:  # (int()'s message repeats the value)
        raise ValueError("expected an integer") from None
    if v <= 0:
        raise ValueError("must be positive")
    return v


def _as_float(value: Any) -> float:
    if isinstance(value, bool):
        raise ValueError("expected a number")
    try:
        f = float(value)
    except ValueError:
        raise ValueError("expected a number") from None
    if not math.isfinite(f) or f < 0:
        raise ValueError("must be a finite number, not negative")
    return f


def _as_names(value: Any) -> list[str]:
    if isinstance(value, str):
        return [x.strip() for x in value.split(",") if x.strip()]
    if not isinstance(value, list) or not all(isinstance(x, str | int) for x in value):
        raise ValueError("expected a list of names")
    return [str(x) for x in value]


def _as_str(value: Any) -> str:
    if not isinstance(value, str):
        raise ValueError("expected a string")
    return value


_COERCE: dict[str, Callable[[Any], Any]] = {
    "Path": _as_path,
    "int": _as_int,
    "float": _as_float,
    "list[str]": _as_names,
}
"""How a value from a file, the environment or a flag becomes a key's type (by the
annotation's text; every other key is a string)."""


def _coerce(key: str, value: Any, source: str) -> Any:
    kind = str(Config.__dataclass_fields__[key].type)
    coerce: Callable[[Any], Any] = _COERCE.get(kind, _as_str)
    where = f"{key} (from {source})"
    try:
        return coerce(value)
    except (ValueError, TypeError) as e:
        raise ConfigError(f"{where}: {e}: {value!r}") from None


def load(
    path: Path | None = None,
    env: dict[str, str] | None = None,
    flags: dict[str, Any] | None = None,
) -> Config:
    """Build and validate the configuration from its sources."""
    env = dict(os.environ) if env is None else env
    values: dict[str, Any] = {}
    cfg_path = path or (Path(env["LEDGERD_CONFIG"]) if env.get("LEDGERD_CONFIG") else None)
    if cfg_path is not None:
        try:
            with open(cfg_path, "rb") as f:
                doc = tomllib.load(f)
        except FileNotFoundError:
            raise ConfigError(f"config: file {cfg_path} does not exist") from None
        except tomllib.TOMLDecodeError as e:
            raise ConfigError(f"config: {cfg_path} is not valid TOML: {e}") from None
        for key, value in _flatten(doc, cfg_path).items():
            if key not in _TYPES:
                near = difflib.get_close_matches(key, list(_TYPES), n=1)
                hint = f" (did you mean {near[0]}?)" if near else ""
                raise ConfigError(f"{key}: unknown key in {cfg_path}{hint}")
            values[key] = _coerce(key, value, str(cfg_path))
    for key in _TYPES:
        name = "LEDGERD_" + key.upper()
        if name in env and env[name] != "":
            values[key] = _coerce(key, env[name], name)
    for key, value in (flags or {}).items():
        if value is not None:
            values[key] = _coerce(key, value, "--" + key.replace("_", "-"))
    cfg = Config(**values)
    validate(cfg)
    return cfg


NOT_SETTINGS = frozenset({"LEDGERD_CONFIG"})
"""``LEDGERD_*`` variables the daemon reads that name no setting."""


def unknown_variables(env: dict[str, str] | None = None) -> list[str]:
    """A warning for each ``LEDGERD_*`` variable that names no setting, with the nearest
    setting's variable: a misspelt one would otherwise be ignored without a word. Not
    an error, unlike an unknown key in the file: the environment is shared with
    ``ledgerctl`` and other tools."""
    env = dict(os.environ) if env is None else env
    keys = [key.upper() for key in _TYPES]
    out = []
    for name in sorted(env):
        key = name.removeprefix("LEDGERD_")
        if key != name and name not in NOT_SETTINGS and key not in keys:
            near = difflib.get_close_matches(key, keys, n=1)  # (without the common prefix)
            hint = f" (did you mean LEDGERD_{near[0]}?)" if near else ""
            out.append(f"{name} names no setting, ignored{hint}")
    return out


def _flatten(doc: dict[str, Any], path: Path) -> dict[str, Any]:
    """Top-level keys, plus ``[section] key`` read as ``section_key`` (e.g. ``[socket] group``);
    a setting named both ways is refused, not taken from whichever comes last."""
    out: dict[str, Any] = {}
    for k, v in doc.items():
        for name, value, spelt in (
            [(f"{k}_{k2}", v2, f"[{k}] {k2}") for k2, v2 in v.items()]
            if isinstance(v, dict)
            else [(k, v, k)]
        ):
            if name in out:
                raise ConfigError(f"{name}: given twice in {path} (the second time as {spelt})")
            out[name] = value
    return out


LARGEST: dict[str, tuple[int, str]] = {
    "listen_backlog": (2**31 - 1, "listen(2) takes a C int"),
    "max_batch_bytes": (
        2**32 - 2,
        "it is also the largest session message, and aiohttp's WebSocket reader "
        "holds that size in a C unsigned int",
    ),
}
"""Integer settings that the daemon hands to C code, with the most that code takes
(past it start-up, or every session, failed with an OverflowError)."""

GRACE_POLLS = 10
"""``compaction_grace`` is at least this many of the longest idle poll intervals: a
device that lists the bucket that seldom still reads every pack before compaction
may delete it, and never takes itself for one that was away."""


def validate(cfg: Config) -> None:
    if cfg.log_level.lower() not in LOG_LEVELS:
        raise ConfigError(
            f"log_level: must be one of {', '.join(LOG_LEVELS)}, not {cfg.log_level!r}"
        )
    cfg.log_level = cfg.log_level.lower()
    cfg.durability = cfg.durability.lower()
    if cfg.durability not in DURABILITY:
        raise ConfigError(f"durability: must be 'normal' or 'full', not {cfg.durability!r}")
    if len(os.fsencode(str(cfg.socket))) > 107:
        raise ConfigError(f"socket: path {cfg.socket} is longer than the 107 bytes a socket allows")
    if cfg.cloud and (problem := url_problem(cfg.cloud)):
        raise ConfigError(f"cloud: {problem}")
    if cfg.encryption_key_file:
        cfg.encryption_key_file = os.path.abspath(os.path.expanduser(cfg.encryption_key_file))
        key_ring(cfg)
    if cfg.endpoint_url and urlparse(cfg.endpoint_url).scheme not in ("http", "https"):
        raise ConfigError(f"endpoint_url: expected http(s)://host[:port], not {cfg.endpoint_url!r}")
    for key, (largest, why) in LARGEST.items():
        if getattr(cfg, key) > largest:
            raise ConfigError(f"{key}: must be at most {largest} ({why})")
    for key in (
        "sync_interval",
        "sync_interval_max",
        "request_timeout",
        "keepalive_timeout",
        "compaction_grace",
        "compaction_interval",
    ):
        if getattr(cfg, key) <= 0:
            raise ConfigError(f"{key}: must be positive")
    if not cfg.session_txn_idle_timeout >= 0:  # NaN too
        raise ConfigError("session_txn_idle_timeout: must be 0 (no bound) or positive")
    if cfg.session_heartbeat < MIN_HEARTBEAT:
        raise ConfigError(f"session_heartbeat: must be at least {MIN_HEARTBEAT} seconds")
    if cfg.sync_interval_max < cfg.sync_interval:
        raise ConfigError("sync_interval_max: must be at least sync_interval")
    if cfg.compaction_grace < GRACE_POLLS * cfg.sync_interval_max:
        raise ConfigError(
            f"compaction_grace: must be at least {GRACE_POLLS} times sync_interval_max "
            f"({GRACE_POLLS * cfg.sync_interval_max:g} s): a device that polls that "
            "seldom would count as away and miss packs compacted meanwhile"
        )
    if cfg.metrics_listen:
        metrics_address(cfg)
    cfg.allowed_uids()
    cfg.socket_gid()


def key_ring(cfg: Config, env: dict[str, str] | None = None) -> KeyRing | None:
    """The encryption keys: ``encryption_key_file``, or the systemd credential
    ``ledgerd-key``; None without either. ConfigError if the file cannot be used
    (its message names the file, never a key)."""
    path = find_key_file(
        Path(cfg.encryption_key_file) if cfg.encryption_key_file else None,
        dict(os.environ) if env is None else env,
    )
    if path is None:
        return None
    try:
        return load_key_file(path)
    except KeyFileError as e:
        raise ConfigError(f"encryption_key_file: {e}") from None


def metrics_address(cfg: Config) -> tuple[str, int]:
    """``metrics_listen`` as (host, port): ``HOST:PORT`` or ``[IPv6]:PORT``."""
    host, sep, port = cfg.metrics_listen.rpartition(":")
    host = host.strip("[]")
    if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise ConfigError(
            f"metrics_listen: expected HOST:PORT (e.g. 127.0.0.1:9464), not {cfg.metrics_listen!r}"
        )
    return host, int(port)


def log_level(cfg: Config) -> int:
    return int(getattr(logging, cfg.log_level.upper()))
