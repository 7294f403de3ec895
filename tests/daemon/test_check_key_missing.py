"""``ledgerctl check --cloud`` on a device that lacks a key another device seals its
packs with: such a pack is not damage (it is ``key_missing`` in sync's status), so it
is a note of the check, not a ``cloud`` problem of every page checked."""

from __future__ import annotations

import json
from pathlib import Path

from tests.daemon.test_encryption_e2e import _new_key_uploads, _shared_key


def test_a_pack_sealed_with_a_key_this_device_lacks_damages_no_page_in_a_check(
    short_tmp: Path,
) -> None:
    # Every page checked with --cloud was 'DAMAGED', code 'cloud' ('pack ...:
    # PackKeyMissingError: ...', the header of a pack this device cannot open counted
    # against every page), exit 1, though sync holds such a pack as key_missing: not
    # damaged, it opens once the key file is copied here.
    key_a, key_b, start = _shared_key(short_tmp)
    a = start("a", key_a)
    b = start("b", key_b)
    try:
        b.ledgerctl("put", "mine", "p", "k", "v", check=True)
        b.ledgerctl("sync", check=True)
        a = _new_key_uploads(a, key_a, start)
        b.ledgerctl("sync", "--timeout", "30")  # holds a's new pack as key_missing
        out = b.ledgerctl("check", "--cloud", "--json")
        report = json.loads(out.stdout)
        assert out.returncode == 0, report
        assert report["healthy"] and report["problems"] == 0, report
        (page,) = [p for p in report["pages"] if p["ledger_text"] == "mine"]
        assert page["healthy"] and page["problems"] == [], page
        notes = " ".join(page["notes"])
        assert "key_missing" in notes and "PackKeyMissingError" in notes, page
        text = b.ledgerctl("check", "--cloud").stdout.decode()
        assert "DAMAGED" not in text and "key_missing" in text, text
    finally:
        for x in (a, b):
            x.stop()
