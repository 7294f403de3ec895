"""The ledgerd process: config, Unix-socket API, sessions, clients and ``ledgerctl``."""

from importlib.metadata import PackageNotFoundError, version

try:
    __version__ = version("ledgerd")
    """The installed distribution's version (pyproject.toml is its one source)."""
except PackageNotFoundError:  # imported from a source tree that was never installed
    __version__ = "0+unknown"
