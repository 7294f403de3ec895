"""The ``_local`` ledger never leaves the device: nothing of it is in the bucket."""

from __future__ import annotations

import os
from pathlib import Path

from ledgerd.store import LOCAL_LEDGER, DocumentStore, Priority
from ledgerd.sync import pack
from ledgerd.sync.folder import FolderStore
from ledgerd.sync.layout import PackName
from tests.sync.test_engine import _keys, device


def _bucket_bytes(root: Path) -> bytes:
    """Every object in the bucket, names and contents."""
    out = []
    for p in sorted(root.rglob("*")):
        out.append(str(p.relative_to(root)).encode())
        if p.is_file():
            out.append(p.read_bytes())
    return b"\0".join(out)


async def test_nothing_of_the_local_ledger_reaches_the_bucket(
    tmp_path: Path, bucket: FolderStore
) -> None:
    secret = os.urandom(64)  # random: compression cannot hide it
    shared = os.urandom(64)
    async with device(tmp_path / "a", bucket) as a, device(tmp_path / "b", bucket) as b:
        local = await a.repo.ledger(LOCAL_LEDGER).page("settings-page")
        # LAZY values go up as they are (random: not compressed), were they uploaded.
        await local.put(b"local-key-" + secret[:8].hex().encode(), secret, Priority.LAZY)
        docs = await DocumentStore.open(await a.repo.ledger(LOCAL_LEDGER).page("docs"))
        await docs.create("prefs", {"token": secret.hex()})
        page = await a.repo.ledger("shared").page("p")
        await page.put(b"k", shared, Priority.LAZY)
        await local.flush()
        await a.engine.sync()
        await b.engine.sync()
        everything = _bucket_bytes(tmp_path / "bucket")
        assert shared in everything  # what is shared went up, in the clear (no key set)
        for needle in (secret, secret.hex().encode(), secret[:8].hex().encode(), b"_local",
                       b"settings-page"):  # fmt: skip
            assert needle not in everything, needle
        for f in (tmp_path / "bucket" / "packs").iterdir():  # no section of a _local page
            pn = PackName.parse(f"packs/{f.name}")
            assert pn is not None
            header = pack.decode_header(f.read_bytes()[: pn.head_end], pn.head_end, pn.eager_end)
            assert {p.ledger for p in header.pages} == {b"shared"}
        assert (await _keys(b.repo, "shared", "p")) == {b"k": shared}
        assert LOCAL_LEDGER.encode() not in await b.repo.ledgers()
