"""The shipped configuration file and systemd units.

``config/ledgerd.toml`` must load as it is and change nothing, and document
every key; the unit files must carry the settings the daemon relies on. When
``systemd-analyze`` is installed the units are also checked by systemd itself.
(The notify protocol is exercised end to end by the daemon fixtures.)
"""

from __future__ import annotations

import dataclasses
import os
import re
import shutil
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

from ledgerd.daemon.config import Config, load
from ledgerd.daemon.main import parser

ROOT = Path(__file__).resolve().parents[2]
CONFIG = ROOT / "config" / "ledgerd.toml"
SYSTEMD = ROOT / "systemd"
SERVICE = SYSTEMD / "ledgerd.service"
USER_SERVICE = SYSTEMD / "ledgerd-user.service"
SOCKET = SYSTEMD / "ledgerd.socket"

FIELDS = [f.name for f in dataclasses.fields(Config)]
# Keys whose default depends on the environment: documented, but commented out.
ENVIRONMENT_DEFAULTS = {"data_dir", "socket"}

Unit = dict[str, dict[str, list[str]]]


# -- config/ledgerd.toml ---------------------------------------------------------


def test_config_file_loads_as_the_defaults() -> None:
    cfg = load(CONFIG, env={})
    assert cfg == Config()
    with open(CONFIG, "rb") as f:
        doc = tomllib.load(f)
    assert set(doc) == set(FIELDS) - ENVIRONMENT_DEFAULTS
    defaults = Config()
    for key in doc:
        assert getattr(cfg, key) == getattr(defaults, key), key


def test_config_file_documents_every_key() -> None:
    text = CONFIG.read_text()
    for name in FIELDS:
        set_or_commented = re.compile(rf"^(#\s*)?{name}\s*=", re.MULTILINE)
        assert set_or_commented.search(text), f"{name} is not in {CONFIG.name}"
        assert f"LEDGERD_{name.upper()}" in text, f"LEDGERD_{name.upper()} is not mentioned"
    for name in ENVIRONMENT_DEFAULTS:
        assert re.search(rf"^#\s*{name}\s*=", text, re.MULTILINE), f"{name} is not commented out"
    for key in ("STATE_DIRECTORY", "XDG_DATA_HOME", "RUNTIME_DIRECTORY", "XDG_RUNTIME_DIR"):
        assert key in text
    assert "LEDGERD_CONFIG" in text


def test_config_file_mentions_every_flag() -> None:
    flags = [
        option
        for action in parser()._actions
        for option in action.option_strings
        if option.startswith("--") and option not in ("--help", "--version", "--check-config")
    ]
    assert "--config" in flags and "--data-dir" in flags
    text = CONFIG.read_text()
    for flag in flags:
        assert flag in text, f"{flag} is not mentioned in {CONFIG.name}"


# -- ledgerd --check-config -----------------------------------------------------


def check_config(tmp_path: Path, *args: str, **env: str) -> subprocess.CompletedProcess[str]:
    clean = {k: v for k, v in os.environ.items() if not k.startswith("LEDGERD_")}
    return subprocess.run(
        [sys.executable, "-m", "ledgerd.daemon", "--check-config", *args],
        capture_output=True,
        text=True,
        env={**clean, "XDG_RUNTIME_DIR": str(tmp_path / "run"), **env},
        timeout=60,
    )


def test_check_config_prints_the_effective_configuration(tmp_path: Path) -> None:
    """File, environment and flags combine as at start-up; the output is every key as
    TOML that loads back as the same configuration; nothing is created."""
    conf = tmp_path / "ledgerd.toml"
    conf.write_text('log_level = "debug"\nmax_open_pages = 7\nallowed_users = ["0"]\n')
    data = tmp_path / "data"
    proc = check_config(
        tmp_path,
        "--config",
        str(conf),
        "--data-dir",
        str(data),
        LEDGERD_SYNC_INTERVAL="2.5",
        LEDGERD_LOG_LEVEL="warning",
    )
    assert proc.returncode == 0, proc.stderr
    assert proc.stderr == ""
    doc = tomllib.loads(proc.stdout)
    assert list(doc) == FIELDS
    assert doc["data_dir"] == str(data)
    assert doc["log_level"] == "warning"  # the environment overrides the file
    assert doc["max_open_pages"] == 7
    assert doc["sync_interval"] == 2.5
    assert doc["allowed_users"] == ["0"]
    assert doc["socket"] == str(tmp_path / "run" / "ledgerd" / "ledgerd.sock")
    printed = tmp_path / "printed.toml"
    printed.write_text(proc.stdout)
    assert load(printed, env={}) == load(
        conf,
        env={"LEDGERD_SYNC_INTERVAL": "2.5", "LEDGERD_LOG_LEVEL": "warning"},
        flags={"data_dir": str(data), "socket": doc["socket"]},
    )
    assert not data.exists() and not (tmp_path / "run").exists()


def test_check_config_refuses_invalid_configuration(tmp_path: Path) -> None:
    proc = check_config(tmp_path, LEDGERD_SYNC_INTERVAL="abc")
    assert proc.returncode == 2
    assert proc.stdout == ""
    lines = proc.stderr.splitlines()
    assert len(lines) == 1 and "sync_interval" in lines[0] and "LEDGERD_SYNC_INTERVAL" in lines[0]
    assert lines[0].endswith("expected a number: 'abc'"), lines  # the value once, not twice
    proc = check_config(tmp_path, LEDGERD_MAX_OPEN_PAGES="x")
    assert proc.stderr.endswith("expected an integer: 'x'\n"), proc.stderr
    proc = check_config(tmp_path, "--config", str(tmp_path / "missing.toml"))
    assert proc.returncode == 2 and proc.stdout == ""
    assert "missing.toml" in proc.stderr and len(proc.stderr.splitlines()) == 1
    # A misspelt key in the file names the nearest setting, as a misspelt variable does.
    (tmp_path / "typo.toml").write_text("sync_intervl = 3\n")
    proc = check_config(tmp_path, "--config", str(tmp_path / "typo.toml"))
    assert (proc.returncode, proc.stdout) == (2, "")
    assert proc.stderr.endswith(
        "sync_intervl: unknown key in "
        + str(tmp_path / "typo.toml")
        + " (did you mean sync_interval?)\n"
    ), proc.stderr
    (tmp_path / "far.toml").write_text("xyzzy = 3\n")
    proc = check_config(tmp_path, "--config", str(tmp_path / "far.toml"))
    assert proc.returncode == 2 and proc.stderr.endswith(
        "unknown key in " + str(tmp_path / "far.toml") + "\n"
    )


def test_a_misspelt_variable_is_named_not_ignored_silently(tmp_path: Path) -> None:
    """A ``LEDGERD_*`` variable that names no setting is a warning on stderr, with the
    nearest setting's variable; the configuration is still valid (the environment is
    shared with ledgerctl and other tools), and without one nothing is printed."""
    proc = check_config(tmp_path, LEDGERD_SYNC_INTERVL="2.5", LEDGERD_SOCKET_GROUP="")
    assert proc.returncode == 0, proc.stderr
    assert proc.stderr.splitlines() == [
        "ledgerd: warning: LEDGERD_SYNC_INTERVL names no setting, ignored"
        " (did you mean LEDGERD_SYNC_INTERVAL?)"
    ]
    assert tomllib.loads(proc.stdout)["sync_interval"] == load(None, env={}).sync_interval
    proc = check_config(tmp_path, LEDGERD_NOTHING_LIKE_IT="1", LEDGERD_CONFIG="")
    assert proc.stderr.splitlines() == [
        "ledgerd: warning: LEDGERD_NOTHING_LIKE_IT names no setting, ignored"
    ]


# -- unit files ------------------------------------------------------------------

SECTIONS = {"Unit", "Service", "Install", "Socket"}
KEY = re.compile(r"[A-Za-z][A-Za-z0-9]*")


def parse_unit(text: str) -> Unit:
    """Sections of ``key=value`` lines; ``#`` and ``;`` start comments. Repeated keys
    accumulate, as they do for systemd's list settings."""
    sections: Unit = {}
    current: dict[str, list[str]] | None = None
    for number, raw in enumerate(text.splitlines(), 1):
        line = raw.strip()
        if not line or line[0] in "#;":
            continue
        if line.startswith("[") and line.endswith("]"):
            name = line[1:-1]
            if name not in SECTIONS:
                raise ValueError(f"line {number}: unknown section [{name}]")
            if name in sections:
                raise ValueError(f"line {number}: section [{name}] repeated")
            current = sections[name] = {}
            continue
        key, sep, value = line.partition("=")
        key = key.strip()
        if not sep or not KEY.fullmatch(key):
            raise ValueError(f"line {number}: not a key=value line: {raw!r}")
        if current is None:
            raise ValueError(f"line {number}: {key}= outside a section")
        if raw.rstrip().endswith("\\"):
            raise ValueError(f"line {number}: continuation lines are not supported")
        current.setdefault(key, []).append(value.strip())
    return sections


def setting(unit: Unit, section: str, key: str) -> str:
    """The effective value of a single-valued setting (the last assignment wins)."""
    values = unit.get(section, {}).get(key)
    assert values, f"[{section}] {key}= is missing"
    return values[-1]


def seconds(value: str) -> float:
    """A systemd time span in the forms the units use: ``90``, ``90s``, ``2min``."""
    m = re.fullmatch(r"(\d+(?:\.\d+)?)\s*(s|sec|min|m)?", value)
    assert m, f"unexpected time span {value!r}"
    return float(m[1]) * (60 if m[2] in ("min", "m") else 1)


def test_parse_unit() -> None:
    unit = parse_unit("# c\n[Unit]\n; c\nDescription=a = b\n\n[Service]\nX=1\nX=2\n")
    assert unit == {"Unit": {"Description": ["a = b"]}, "Service": {"X": ["1", "2"]}}
    for bad in ("X=1\n", "[Unit]\nnot a setting\n", "[Nope]\n", "[Unit]\n[Unit]\n"):
        with pytest.raises(ValueError):
            parse_unit(bad)


@pytest.mark.parametrize("path", [SERVICE, USER_SERVICE, SOCKET], ids=lambda p: p.name)
def test_unit_file_parses(path: Path) -> None:
    unit = parse_unit(path.read_text())
    expected = {"Unit", "Socket" if path.suffix == ".socket" else "Service", "Install"}
    assert set(unit) == expected
    assert setting(unit, "Unit", "Description")
    assert setting(unit, "Install", "WantedBy")


def test_system_service() -> None:
    unit = parse_unit(SERVICE.read_text())
    expected = {
        "Type": "notify",
        "NotifyAccess": "main",
        "StateDirectory": "ledgerd",
        "RuntimeDirectory": "ledgerd",
        "ProtectSystem": "strict",
        "ProtectHome": "true",
        "NoNewPrivileges": "true",
        "PrivateTmp": "true",
        "KillSignal": "SIGTERM",
        "Restart": "on-failure",
        "UMask": "0077",
        "RemoveIPC": "true",
        "ProtectProc": "invisible",
        "ProcSubset": "pid",
        "SystemCallArchitectures": "native",
        "LockPersonality": "true",
        "RestrictNamespaces": "true",
        "RestrictRealtime": "true",
        "MemoryDenyWriteExecute": "true",
        "SystemCallErrorNumber": "EPERM",
        # setrlimit is filtered out (@resources): the limit is set here instead, at
        # least what the default max_open_pages needs (about seven files a page).
        "LimitNOFILE": "65536",
    }
    for key, value in expected.items():
        assert setting(unit, "Service", key) == value, key
    assert int(setting(unit, "Service", "LimitNOFILE")) >= 7 * Config().max_open_pages
    # The allow list first, then what it takes away, then chown put back (socket_group).
    filters = unit["Service"]["SystemCallFilter"]
    assert filters == ["@system-service", "~@privileged @resources", "@chown"]
    # Where the install instructions (file header, docs/operations.md) put the command.
    assert setting(unit, "Service", "ExecStart") == "/opt/ledgerd/bin/ledgerd run"
    assert seconds(setting(unit, "Service", "WatchdogSec")) > 0
    assert seconds(setting(unit, "Service", "TimeoutStopSec")) > Config().shutdown_timeout
    assert setting(unit, "Service", "ExecStart").split()[-1] == "run"
    assert setting(unit, "Service", "CapabilityBoundingSet") == ""
    assert setting(unit, "Install", "WantedBy") == "multi-user.target"


def test_user_service() -> None:
    unit = parse_unit(USER_SERVICE.read_text())
    assert setting(unit, "Service", "Type") == "notify"
    assert seconds(setting(unit, "Service", "WatchdogSec")) > 0
    assert seconds(setting(unit, "Service", "TimeoutStopSec")) > Config().shutdown_timeout
    assert setting(unit, "Service", "ExecStart") == "%h/.local/bin/ledgerd run"
    assert setting(unit, "Install", "WantedBy") == "default.target"
    # The daemon raises its own open files limit here: @resources stays allowed.
    filters = unit["Service"]["SystemCallFilter"]
    assert filters == ["@system-service", "~@privileged", "@chown"]
    assert "LimitNOFILE" not in unit["Service"]
    # Options that need mount namespaces fail in user units without user namespaces.
    for key in ("ProtectSystem", "ProtectHome", "PrivateTmp", "PrivateDevices"):
        assert key not in unit["Service"], key


def test_socket() -> None:
    unit = parse_unit(SOCKET.read_text())
    # The same path the daemon picks from $RUNTIME_DIRECTORY when not activated.
    assert setting(unit, "Socket", "ListenStream") == "%t/ledgerd/ledgerd.sock"
    assert setting(unit, "Socket", "SocketMode") == "0600"
    assert setting(unit, "Socket", "Service") == "ledgerd.service"
    assert setting(unit, "Install", "WantedBy") == "sockets.target"


def test_units_pass_systemd_analyze(tmp_path: Path) -> None:
    """``systemd-analyze verify`` on copies whose ExecStart= names an executable that
    exists here (verify rejects a missing one); the rest of each unit is unchanged."""
    analyze = shutil.which("systemd-analyze")
    if analyze is None:
        return  # only this check needs systemd; the tests above cover the files
    exec_start = f"ExecStart={sys.executable} -m ledgerd.daemon.main run"

    def install(src: Path, directory: Path, name: str) -> Path:
        directory.mkdir(exist_ok=True)
        text = re.sub(r"^ExecStart=.*$", exec_start, src.read_text(), flags=re.MULTILINE)
        dst = directory / name
        dst.write_text(text)
        return dst

    system = tmp_path / "system"
    user = tmp_path / "user"
    runtime = tmp_path / "runtime"
    runtime.mkdir(mode=0o700)
    runs = [
        [
            analyze,
            "verify",
            install(SERVICE, system, "ledgerd.service"),
            install(SOCKET, system, "ledgerd.socket"),
        ],
        [
            analyze,
            "--user",
            "verify",
            install(USER_SERVICE, user, "ledgerd.service"),
            install(SOCKET, user, "ledgerd.socket"),
        ],
    ]
    env = {**os.environ, "XDG_RUNTIME_DIR": str(runtime)}
    about_ours = re.compile(r"ledgerd(-user)?\.(service|socket)")
    for command in runs:
        proc = subprocess.run(
            [str(c) for c in command], capture_output=True, text=True, env=env, timeout=60
        )
        output = proc.stdout + proc.stderr
        assert proc.returncode == 0, output
        # verify only warns (exit status 0) about unknown keys and invalid values.
        complaints = [line for line in output.splitlines() if about_ours.search(line)]
        assert not complaints, "\n".join(complaints)
