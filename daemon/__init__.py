"""The ledgerd process: config, Unix-socket API, sessions, clients and ``ledgerctl``."""
