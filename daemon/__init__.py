"""The ledgerd process: config, Unix-socket API, sessions, clients and ``ledgerctl``."""

from __future__ import annotations

__all__ = ["__version__"]


def __getattr__(name: str) -> str:
    """``__version__``: the installed distribution's version (pyproject.toml is its one
    source), read when first asked for: importlib.metadata takes longer to import than
    ``ledgerctl get`` may take to run (see ``bench/cli.py``)."""
    if name != "__version__":
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    from importlib.metadata import PackageNotFoundError, version

    try:
        found = version("ledgerd")
    except PackageNotFoundError:  # imported from a source tree that was never installed
        found = "0+unknown"
    globals()["__version__"] = found
    return found
