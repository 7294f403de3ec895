"""The repository: ledgers and their pages, opened and closed and evicted."""
