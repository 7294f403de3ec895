"""Shared fixtures: real SQLite files under pytest's tmp_path."""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from ledgerd.store.page.page import Page
from ledgerd.store.pieces.objects import ObjectStore
from ledgerd.store.repo.repository import Repository
from ledgerd.store.sqlite.db import Database
from ledgerd.store.sqlite.schema import create_page_schema
from tests.store import resolvers


def pytest_configure(config: pytest.Config) -> None:
    """Subprocesses share one bytecode cache for the session.

    The tests start hundreds of Python processes (the daemon, ledgerctl, crash
    children), each importing ledgerd afresh. Under PYTHONDONTWRITEBYTECODE (set where
    the CI runs) none of them kept what it compiled, so every start compiled every
    ledgerd module again: about 0.1-0.2 s of each daemon or ledgerctl start. They now
    write and read their bytecode under a temporary PYTHONPYCACHEPREFIX, removed when
    the session ends, so nothing is written beside the sources, as the variable asks.
    What the processes run is the same code either way."""
    if not os.environ.get("PYTHONDONTWRITEBYTECODE") or os.environ.get("PYTHONPYCACHEPREFIX"):
        return
    saved = os.environ.pop("PYTHONDONTWRITEBYTECODE")
    prefix = tempfile.mkdtemp(prefix="ledgerd-tests-pyc-")
    os.environ["PYTHONPYCACHEPREFIX"] = prefix

    def restore() -> None:
        os.environ.pop("PYTHONPYCACHEPREFIX", None)
        os.environ["PYTHONDONTWRITEBYTECODE"] = saved
        shutil.rmtree(prefix, ignore_errors=True)

    config.add_cleanup(restore)


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
