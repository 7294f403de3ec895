"""The ``ledgerd`` command: ``ledgerd [run] [options]`` starts the daemon."""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import gc
import json
import sys
from pathlib import Path
from typing import Any

from ledgerd.daemon.api import VERSION
from ledgerd.daemon.config import Config, ConfigError, load, unknown_variables


def parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(
        prog="ledgerd",
        description="ledgerd: a local-first synchronized key-value store daemon.",
        epilog="Every option can also be set in the TOML file or as LEDGERD_<OPTION> "
        "(for example LEDGERD_DATA_DIR). Encryption keys: ledgerd key {init,add,rotate} "
        "--help.",
    )
    ap.add_argument("command", nargs="?", default="run", choices=["run"], help="(default: run)")
    ap.add_argument("--config", type=Path, help="TOML configuration file")
    ap.add_argument("--data-dir", help="where pages are stored")
    ap.add_argument("--socket", help="Unix socket path to listen on")
    ap.add_argument("--cloud", help="s3://bucket/prefix or file:///path (cloud sync)")
    ap.add_argument("--log-level", help="debug, info, warning or error")
    ap.add_argument(
        "--check-config",
        action="store_true",
        help="validate the configuration (file, LEDGERD_* variables, flags), print the "
        "effective value of every key and exit without starting: 0 if valid, 2 if not",
    )
    ap.add_argument("--version", action="version", version=f"ledgerd {VERSION}")
    return ap


def _toml_value(value: Any) -> str:
    """A value as TOML: JSON's string escapes and numbers are TOML's too."""
    if isinstance(value, Path):
        value = str(value)
    if isinstance(value, list):
        return "[" + ", ".join(_toml_value(v) for v in value) + "]"
    return json.dumps(value, ensure_ascii=False)


def render_config(cfg: Config) -> str:
    """Every key of the effective configuration as ``key = value`` lines, in the
    order of :class:`Config`: a valid TOML file that loads back as ``cfg``."""
    return "".join(
        f"{f.name} = {_toml_value(getattr(cfg, f.name))}\n" for f in dataclasses.fields(cfg)
    )


GC_YOUNG_THRESHOLD = 50_000


def tune_gc() -> None:
    """Collect young objects every 50,000 allocations instead of CPython's 700, and
    leave the objects alive at start-up out of collections altogether.

    A 10,000-entry batch allocates a few objects per entry that live until it is
    committed. At 700 they went through a hundred young collections per batch and,
    surviving them, were promoted into the older generations, whose collections
    walk the whole heap (page caches included): batches ran a fifth slower, and
    slower still as the heap grew. Cycles are still collected, a little later.
    """
    gc.collect()  # nothing left over from start-up is frozen with the rest
    gc.freeze()
    gc.set_threshold(GC_YOUNG_THRESHOLD, 10, 10)


SWITCH_INTERVAL_S = 0.001
"""How long a thread holding the GIL runs before another that waits for it may take it
(CPython's default: 5 ms)."""


def tune_threads() -> None:
    """Hand the GIL over every millisecond instead of every five.

    A big batch parses its body and prepares its SQLite rows on worker threads, in Python
    that holds the GIL; the event loop, waiting for it behind them, answered a health
    check 300-380 ms late during a 55 MB batch of small values. At 1 ms the slowest
    answer was 106-148 ms and the batch took as long.
    """
    sys.setswitchinterval(SWITCH_INTERVAL_S)


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["key"]:  # ledgerd key init|add|rotate (daemon/keys.py)
        from ledgerd.daemon import keys  # (here: start-up speed; the server is not needed)

        return keys.main(argv[1:])
    args = parser().parse_args(argv)
    flags = {
        "data_dir": args.data_dir,
        "socket": args.socket,
        "cloud": args.cloud,
        "log_level": args.log_level,
    }
    try:
        cfg = load(args.config, flags=flags)
    except ConfigError as e:
        print(f"ledgerd: invalid configuration: {e}", file=sys.stderr)
        return e.exit_code
    for warning in unknown_variables():
        print(f"ledgerd: warning: {warning}", file=sys.stderr)
    if args.check_config:
        sys.stdout.write(render_config(cfg))
        return 0
    # Imported here for start-up speed: --check-config and errors need none of the server.
    from ledgerd.daemon.server import serve, setup_logging

    setup_logging(cfg)
    tune_gc()
    tune_threads()
    try:
        return asyncio.run(serve(cfg))
    except ConfigError as e:
        print(f"ledgerd: {e}", file=sys.stderr)
        return e.exit_code
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())
