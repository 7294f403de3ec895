"""``ledgerd key ...``: encryption key files and key rotation.

This module owns the key commands: ``init`` (a new key file), ``add`` (a new
write key on top of a key file: rotation's first step) and ``rotate`` (this
device's packs sealed again with the write key). Key files, the codec and the
bucket's key objects are :mod:`ledgerd.sync.crypto`; re-encryption is
:meth:`ledgerd.sync.engine.SyncEngine.reencrypt`. Nothing here prints a key.
"""

from __future__ import annotations

import argparse
import asyncio
import getpass
import sys
from pathlib import Path

from ledgerd.daemon.config import ConfigError, key_ring, load
from ledgerd.sync import crypto
from ledgerd.sync.errors import SyncError


def parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(
        prog="ledgerd key", description="encryption keys of the bucket (see docs/bucket-format.md)"
    )
    sub = ap.add_subparsers(dest="action", required=True)
    p = sub.add_parser("init", help="write a new key file (mode 0600); never overwrites")
    p.add_argument("path", type=Path)
    p.add_argument(
        "--passphrase",
        action="store_true",
        help="hold a passphrase (read from the terminal or standard input) instead of a random key",
    )
    p = sub.add_parser("add", help="put a new random key first in a key file (it writes)")
    p.add_argument("path", type=Path)
    p = sub.add_parser(
        "rotate",
        help="upload this device's packs again, sealed with the key file's first key "
        "(stop the daemon first)",
    )
    p.add_argument("--config", type=Path, help="TOML configuration file")
    p.add_argument("--data-dir")
    p.add_argument("--cloud")
    return ap


def _passphrase() -> str:
    if sys.stdin.isatty():
        first = getpass.getpass("passphrase: ")
        if getpass.getpass("again: ") != first:
            raise ConfigError("the passphrases differ")
        return first
    return sys.stdin.readline().rstrip("\n")


def _init(path: Path, passphrase: bool) -> None:
    if not passphrase:
        crypto.write_key_file(path)
        return
    text = _passphrase()
    crypto.parse_key_file(f"passphrase {text}\n", "the passphrase")  # long enough
    crypto.write_key_file(path, text=f"passphrase {text}\n")


async def _rotate(args: argparse.Namespace) -> int:
    # Imported here for start-up speed: only rotation needs the store and sync's engine.
    from ledgerd.store import Repository, RepositoryLockedError
    from ledgerd.store.errors import counted
    from ledgerd.sync.engine import SyncEngine
    from ledgerd.sync.url import open_store

    cfg = load(args.config, flags={"data_dir": args.data_dir, "cloud": args.cloud})
    keys = key_ring(cfg)
    if not cfg.cloud or keys is None:
        raise ConfigError("rotate needs cloud and encryption_key_file (or the credential)")
    engine = SyncEngine(open_store(cfg.cloud, endpoint_url=cfg.endpoint_url or None), keys=keys)
    engine.location = cfg.cloud
    try:
        repo = await Repository.open(cfg.data_dir, hooks=engine.hooks())
    except RepositoryLockedError:
        raise ConfigError(f"data_dir: {cfg.data_dir} is in use: stop ledgerd first") from None
    try:
        await engine.start(repo, background=False)
        n = await engine.reencrypt()
        await engine.stop()
    finally:
        await repo.close()
    write = engine.codec.write_kid.hex() if engine.codec else "?"
    print(
        f"re-encrypted {counted(n, 'pack')} with key {write}; compaction deletes the old ones",
        file=sys.stderr,
    )
    return 0


def main(argv: list[str]) -> int:
    args = parser().parse_args(argv)
    try:
        if args.action == "init":
            _init(args.path, args.passphrase)
            print(f"wrote a new key file {args.path} (mode 0600)", file=sys.stderr)
            return 0
        if args.action == "add":
            crypto.add_key(args.path)
            print(f"{args.path}: a new key writes from now on", file=sys.stderr)
            return 0
        return asyncio.run(_rotate(args))
    except FileExistsError:
        print(f"ledgerd key: {args.path} exists; it is not overwritten", file=sys.stderr)
        return 2
    except crypto.KeyFileError as e:
        print(f"ledgerd key: {e}", file=sys.stderr)
        return 2
    except ConfigError as e:
        print(f"ledgerd key: {e}", file=sys.stderr)
        return e.exit_code
    except (OSError, SyncError) as e:
        print(f"ledgerd key: {e}", file=sys.stderr)
        return 1
