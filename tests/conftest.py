"""Shared fixtures: real SQLite files under pytest's tmp_path."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from ledgerd.store.db import Database
from ledgerd.store.objects import ObjectStore
from ledgerd.store.page import Page
from ledgerd.store.repository import Repository
from ledgerd.store.schema import create_page_schema
from tests.store import resolvers


@pytest.fixture
async def objects(tmp_path: Path) -> AsyncIterator[ObjectStore]:
    db = await Database.open(tmp_path / "page.sqlite", create_page_schema)
    try:
        yield ObjectStore(db)
    finally:
        await db.close()


@pytest.fixture
async def repo(tmp_path: Path) -> AsyncIterator[Repository]:
    # With a resolver source, so tests can connect a conflict resolver.
    r = await Repository.open(tmp_path / "data", hooks=resolvers.hooks())
    try:
        yield r
    finally:
        await r.close()


@pytest.fixture
async def page(repo: Repository) -> Page:
    return await repo.ledger("test").page("page")
