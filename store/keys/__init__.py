"""Structured keys: FoundationDB's tuple encoding and subspaces."""
