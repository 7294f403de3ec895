"""The ``ledgerd`` command: ``ledgerd [run] [options]`` starts the daemon."""

from __future__ import annotations

import argparse
import asyncio
import sys
from pathlib import Path

from daemon.api import VERSION
from daemon.config import ConfigError, load


def parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(
        prog="ledgerd",
        description="ledgerd: a local-first synchronized key-value store daemon.",
        epilog="Every option can also be set in the TOML file or as LEDGERD_<OPTION> "
        "(for example LEDGERD_DATA_DIR).",
    )
    ap.add_argument("command", nargs="?", default="run", choices=["run"], help="(default: run)")
    ap.add_argument("--config", type=Path, help="TOML configuration file")
    ap.add_argument("--data-dir", help="where pages are stored")
    ap.add_argument("--socket", help="Unix socket path to listen on")
    ap.add_argument("--cloud", help="s3://bucket/prefix or file:///path (cloud sync)")
    ap.add_argument("--log-level", help="debug, info, warning or error")
    ap.add_argument("--version", action="version", version=f"ledgerd {VERSION}")
    return ap


def main(argv: list[str] | None = None) -> int:
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
    from daemon.server import serve, setup_logging

    setup_logging(cfg)
    try:
        return asyncio.run(serve(cfg))
    except ConfigError as e:
        print(f"ledgerd: {e}", file=sys.stderr)
        return e.exit_code
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())
