"""Pieces: content-addressed values (digests, content-defined splitting), stored in SQLite with
a read cache."""
