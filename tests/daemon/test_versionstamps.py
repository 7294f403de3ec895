"""Versionstamped keys and values through the daemon: the HTTP batch ops, the session
ops, the Python clients, and a log appended on two devices offline, then synced."""

from __future__ import annotations

import base64
import contextlib
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from yarl import URL

from ledgerd.daemon.client import quote
from ledgerd.store import Subspace, Versionstamp, stamp_time
from ledgerd.store.keys import tuple as fdbtuple
from tests.daemon.conftest import Daemon, start_daemon

LOG = Subspace(("log",))
PAGE = "/v1/ledgers/app/pages/events"


def u(path: str) -> URL:
    return URL("http://ledgerd" + path, encoded=True)


def b64(data: bytes) -> str:
    return base64.b64encode(data).decode()


def unb64(text: str) -> bytes:
    return base64.b64decode(text)


def template(user_version: int = 0) -> bytes:
    return LOG.pack_with_versionstamp((Versionstamp.incomplete(user_version),))


async def batch(http: aiohttp.ClientSession, ops: list[dict[str, Any]]) -> aiohttp.ClientResponse:
    return await http.post(u(PAGE + "/batch"), json={"ops": ops})


async def entries(http: aiohttp.ClientSession) -> list[tuple[bytes, bytes]]:
    r = await http.get(u(PAGE + "/entries"))
    assert r.status == 200, await r.text()
    return [(unb64(e["key"]), unb64(e["value"])) for e in (await r.json())["entries"]]


async def test_a_batch_stamps_its_keys_and_values_with_one_stamp(
    http: aiohttp.ClientSession,
) -> None:
    value_template = fdbtuple.pack_with_versionstamp(("seen", Versionstamp.incomplete()))
    ops = [
        {"op": "put", "key": b64(b"plain"), "value": b64(b"p")},
        {"op": "set_versionstamped_key", "key": b64(template(0)), "value": b64(b"first")},
        {"op": "set_versionstamped_value", "key": b64(b"latest"), "value": b64(value_template)},
        {
            "op": "set_versionstamped_key",
            "key": b64(template(1)),
            "value": b64(b"second"),
            "priority": "lazy",
        },
    ]
    r = await batch(http, ops)
    assert r.status == 200, await r.text()
    doc = await r.json()
    stamp = bytes.fromhex(doc["versionstamp"])
    assert len(stamp) == 10 and stamp_time(stamp) > 0
    first, value, second = (unb64(x) for x in doc["versionstamped"])  # in op order
    assert doc["applied"] == 4
    assert first == LOG.pack((Versionstamp(stamp, 0),))
    assert second == LOG.pack((Versionstamp(stamp, 1),))
    assert value == fdbtuple.pack(("seen", Versionstamp(stamp, 0)))
    assert await entries(http) == [
        (first, b"first"),
        (second, b"second"),
        (b"latest", value),
        (b"plain", b"p"),
    ]
    r = await http.get(u(PAGE + "/keys/" + quote(second)))
    assert r.headers["Ledger-Priority"] == "lazy"
    # A later batch stamps later; a batch without stamped ops answers null and [].
    r = await batch(http, [{"op": "set_versionstamped_key", "key": b64(template()), "value": ""}])
    later = bytes.fromhex((await r.json())["versionstamp"])
    assert later > stamp
    r = await batch(http, [{"op": "delete", "key": b64(b"plain")}])
    assert await r.json() == {"applied": 1, "versionstamp": None, "versionstamped": []}


def _raw_key(n: int) -> bytes:
    return b"k" * n + b"\xff" * 10 + n.to_bytes(4, "little")


BAD_TEMPLATES = [
    (b"short", "bad_request", "holds 10 placeholder bytes and ends in a 4-byte offset"),
    (b"\xff" * 10 + (1).to_bytes(4, "little"), "bad_request", "offset 1 is outside"),
    (b"x" * 12 + (0).to_bytes(4, "little"), "bad_request", "no incomplete versionstamp at byte 0"),
    (
        fdbtuple.pack(("a plain tuple",)) + bytes(4),
        "bad_request",
        "no incomplete versionstamp at byte 0",
    ),
    (
        fdbtuple.pack_with_versionstamp((Versionstamp.incomplete(), b"\x33" + b"\xff" * 10)),
        "bad_request",
        "a second incomplete versionstamp",
    ),
    (_raw_key(5000), "key_too_large", "4096"),
]


@pytest.mark.parametrize(
    ("bad", "code", "message"),
    BAD_TEMPLATES,
    ids=["short", "offset-outside", "no-placeholder", "plain-tuple", "two-stamps", "too-long"],
)
async def test_a_bad_key_template_is_400_and_writes_nothing(
    http: aiohttp.ClientSession, bad: bytes, code: str, message: str
) -> None:
    ops = [
        {"op": "put", "key": b64(b"a"), "value": b64(b"1")},
        {"op": "set_versionstamped_key", "key": b64(bad), "value": b64(b"v")},
    ]
    r = await batch(http, ops)
    assert r.status == 400
    err = (await r.json())["error"]
    assert err["code"] == code and err["message"].startswith("ops[1].key: "), err
    assert message in err["message"], err
    r = await http.get(u(PAGE + "/entries"))
    assert (await r.json())["error"]["code"] == "ledger_not_found"  # not even the put


async def test_a_bad_value_template_is_400(http: aiohttp.ClientSession) -> None:
    for bad, message in [
        (b"no offset", "ops[0].value: a versionstamped value holds 10 placeholder bytes"),
        (b"\xff" * 10 + bytes(300_000) + bytes(4), "ops[0].value: a versionstamped value is at"),
    ]:
        r = await batch(
            http, [{"op": "set_versionstamped_value", "key": b64(b"k"), "value": b64(bad)}]
        )
        assert r.status == 400
        assert (await r.json())["error"]["message"].startswith(message)
    r = await batch(http, [{"op": "set_versionstamped_key", "key": b64(template())}])
    assert (await r.json())["error"]["message"] == "ops[0].value must be a base64 string"


class Ws:
    """A raw session: requests answered in order."""

    def __init__(self, ws: aiohttp.ClientWebSocketResponse) -> None:
        self.ws, self.n = ws, 0

    async def call(self, op: str, **args: Any) -> dict[str, Any]:
        self.n += 1
        await self.ws.send_str(json.dumps({"id": self.n, "op": op, **args}))
        doc: dict[str, Any] = json.loads((await self.ws.receive(timeout=30)).data)
        assert doc["id"] == self.n
        return doc


async def test_session_transaction_stamps_at_commit(http: aiohttp.ClientSession) -> None:
    async with http.ws_connect(u("/v1/session")) as raw:
        ws = Ws(raw)
        app, events = b64(b"app"), b64(b"events")
        txn = (await ws.call("begin", ledger=app, page=events))["txn"]
        value_template = fdbtuple.pack_with_versionstamp((Versionstamp.incomplete(7),))
        for n in range(3):
            ok = await ws.call(
                "set_versionstamped_key", txn=txn, key=b64(template(n)), value=b64(b"e%d" % n)
            )
            assert ok["ok"], ok
        ok = await ws.call(
            "set_versionstamped_value", txn=txn, key=b64(b"latest"), value=b64(value_template)
        )
        assert ok["ok"], ok
        # A bad template is refused and leaves the transaction as it was.
        bad = await ws.call("set_versionstamped_key", txn=txn, key=b64(b"nope"), value="")
        assert not bad["ok"] and bad["error"]["code"] == "bad_request"
        assert bad["error"]["message"].startswith("key: a versionstamped key holds"), bad
        bad = await ws.call("set_versionstamped_value", txn=txn, key=b64(b"x"), value=b64(b"nope"))
        assert not bad["ok"] and bad["error"]["message"].startswith("value: "), bad
        # As in FoundationDB, the transaction does not read what it stamps.
        got = await ws.call("get", txn=txn, key=b64(b"latest"))
        assert not got["ok"] and got["error"]["code"] == "bad_request"
        listed = await ws.call("entries", txn=txn, prefix=b64(LOG.key()))
        assert listed["entries"] == []
        done = await ws.call("commit", txn=txn)
        assert done["ok"], done
        stamp = bytes.fromhex(done["versionstamp"])
        keys = [unb64(k) for k in done["versionstamped_keys"]]
        assert keys == [LOG.pack((Versionstamp(stamp, n),)) for n in range(3)]
        value = fdbtuple.pack((Versionstamp(stamp, 7),))
        assert await entries(http) == [
            *((k, b"e%d" % n) for n, k in enumerate(keys)),
            (b"latest", value),
        ]
        # A transaction that stamps nothing answers null and [].
        txn = (await ws.call("begin", ledger=app, page=events))["txn"]
        await ws.call("put", txn=txn, key=b64(b"plain"), value=b64(b"p"))
        done = await ws.call("commit", txn=txn)
        assert done["versionstamp"] is None and done["versionstamped_keys"] == []


async def test_async_client_stamps_keys_and_values(daemon: Daemon) -> None:
    from ledgerd.daemon import client

    # A client-only program finds the tuple layer and friends in the client module.
    assert client.tuple is fdbtuple and client.Subspace is Subspace
    assert client.Versionstamp is Versionstamp and client.stamp_time is stamp_time
    async with client.AsyncClient(daemon.socket) as c:
        first = await c.set_versionstamped_key("app", "events", template(), b"login")
        (stamp,) = LOG.unpack(first)
        assert stamp.is_complete() and stamp.user_version == 0
        value = await c.set_versionstamped_value(
            "app",
            "events",
            b"latest",
            fdbtuple.pack_with_versionstamp((Versionstamp.incomplete(3),)),
            lazy=True,
        )
        (vs,) = fdbtuple.unpack(value)
        assert vs.user_version == 3 and vs.tr_version > stamp.tr_version
        assert await c.get("app", "events", b"latest") == value
        async with c.transaction("app", "events") as txn:
            for n, event in enumerate([b"view", b"logout"]):
                await txn.set_versionstamped_key(template(n), event)
            await txn.set_versionstamped_value(
                b"last-txn", fdbtuple.pack_with_versionstamp((Versionstamp.incomplete(),))
            )
        assert txn.versionstamp is not None and txn.versionstamp > vs.tr_version
        assert txn.versionstamped_keys == [
            LOG.pack((Versionstamp(txn.versionstamp, n),)) for n in range(2)
        ]
        items = [i async for i in c.entries("app", "events", prefix=LOG.key())]
        assert [i.key for i in items] == [first, *txn.versionstamped_keys]
        assert [i.value for i in items] == [b"login", b"view", b"logout"]
        with pytest.raises(client.LedgerError) as e:
            await c.set_versionstamped_key("app", "events", LOG.pack(("no stamp",)), b"")
        assert e.value.code == "bad_request" and e.value.status == 400
        async with c.transaction("app", "events") as txn:
            with pytest.raises(client.LedgerError) as e:
                await txn.set_versionstamped_value(b"k", b"too short")
            assert e.value.code == "bad_request"
            await txn.put(b"plain", b"p")
        assert txn.versionstamp is None and txn.versionstamped_keys == []


def test_blocking_client_stamps_keys_and_values(daemon: Daemon) -> None:
    from ledgerd.daemon.client import Client

    with Client(daemon.socket) as c:
        first = c.set_versionstamped_key("app", "events", template(), b"a")
        value = c.set_versionstamped_value(
            "app", "events", b"v", fdbtuple.pack_with_versionstamp((Versionstamp.incomplete(),))
        )
        with c.transaction("app", "events") as txn:
            txn.set_versionstamped_key(template(), b"b")
            txn.set_versionstamped_value(
                b"w", fdbtuple.pack_with_versionstamp((Versionstamp.incomplete(),))
            )
        assert txn.versionstamp is not None
        assert [i.key for i in c.entries("app", "events", prefix=LOG.key())] == [
            first,
            *txn.versionstamped_keys,
        ]
        assert c.get("app", "events", b"v") == value
        assert c.get("app", "events", b"w") == fdbtuple.pack((Versionstamp(txn.versionstamp),))


# -- two devices append to one log offline, then sync through the real daemons ---------


@contextlib.contextmanager
def _two(base: Path, *args: str) -> Iterator[tuple[Daemon, Daemon]]:
    a = start_daemon(base / "a", *args)
    try:
        b = start_daemon(base / "b", *args)
    except BaseException:
        a.stop()
        raise
    try:
        yield a, b
    finally:
        codes = [a.stop(), b.stop()]
        assert codes == [0, 0], a.log_text() + b.log_text()


def test_two_devices_append_to_one_log_offline_then_sync(short_tmp: Path) -> None:
    """Both devices append while offline (daemons without a bucket), then start with a
    shared bucket and sync."""
    from ledgerd.daemon.client import Client

    written: dict[str, list[bytes]] = {"a": [], "b": []}
    with _two(short_tmp) as (a, b), Client(a.socket) as ca, Client(b.socket) as cb:
        for _ in range(3):  # interleaved in time, neither device syncs yet
            for name, c in (("a", ca), ("b", cb)):
                for _ in range(5):  # plain writes: a stamp each
                    n = len(written[name])
                    value = f"{name}:{n:03d}".encode()
                    written[name].append(c.set_versionstamped_key("app", "log", template(), value))
                with c.transaction("app", "log") as txn:  # one stamp, user versions 0..3
                    first = len(written[name])
                    for i in range(4):
                        value = f"{name}:{first + i:03d}".encode()
                        txn.set_versionstamped_key(template(i), value)
                written[name].extend(txn.versionstamped_keys)
        for name, c in (("a", ca), ("b", cb)):  # offline: each sees only its own
            assert [i.key for i in c.entries("app", "log")] == written[name]
    cloud = f"file://{short_tmp / 'bucket'}"
    with (
        _two(short_tmp, "--cloud", cloud) as (a, b),
        Client(a.socket) as ca,
        Client(b.socket) as cb,
    ):
        for _ in range(2):
            for c in (ca, cb):
                stats = c.sync(timeout=60)  # POST /v1/sync
                assert stats["rounds"] >= 1, stats
        # (Which round imports what varies: a background round may come first. The
        # convergence below shows that each device has the other's entries.)
        got = {
            name: [(i.key, i.value) for i in c.entries("app", "log")]
            for name, c in (("a", ca), ("b", cb))
        }
    assert got["a"] == got["b"]  # converged
    keys = [k for k, _ in got["a"]]
    assert len(keys) == len(set(keys)) == 2 * 27  # every entry, each under its own key
    assert set(keys) == set(written["a"]) | set(written["b"])
    for name in ("a", "b"):  # each device's entries keep the order it wrote them in
        mine = [v for _, v in got["a"] if v is not None and v.startswith(name.encode())]
        assert mine == [f"{name}:{n:03d}".encode() for n in range(27)]
        assert [k for k, v in got["a"] if v in mine] == written[name]
        tags = {LOG.unpack(k)[0].tr_version[8:] for k in written[name]}
        assert len(tags) == 1  # the device's two bytes end each of its stamps
    # Both daemons read one machine's clock here: the log interleaves them in the order
    # the entries were written, 9 of a, 9 of b, three times.
    assert b"".join(v[:1] for _, v in got["a"] if v is not None) == (b"a" * 9 + b"b" * 9) * 3
