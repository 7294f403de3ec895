"""The ledgerd process: config, Unix-socket API, client and CLI (arrives with the daemon issue)."""
