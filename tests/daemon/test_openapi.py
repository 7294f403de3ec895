"""The OpenAPI document: it lists exactly the daemon's routes, and schemathesis driving
the real daemon with what it describes finds no 5xx and no crash."""

from __future__ import annotations

import asyncio
import contextlib
import os
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import hypothesis
import pytest
import schemathesis
from hypothesis import HealthCheck, Phase
from schemathesis.core.result import Ok

from ledgerd.daemon.client import Client, Subspace, Versionstamp
from ledgerd.daemon.codec import STAMPED_OPS, b64
from ledgerd.daemon.openapi import document
from ledgerd.daemon.routes import ROUTES
from tests.daemon.conftest import Daemon

EXAMPLES = int(os.environ.get("LEDGERD_SCHEMATHESIS_EXAMPLES", "25"))
"""Examples schemathesis makes per operation (more with the environment variable)."""


def _served() -> set[tuple[str, str]]:
    out: set[tuple[str, str]] = set()
    for route in ROUTES:
        path = "/v1/" + "/".join(s.replace("*}", "}") for s in route.path)
        out.update((m.lower(), path) for m in route.methods)
    return out


def _documented() -> set[tuple[str, str]]:
    return {(m, path) for path, ops in document()["paths"].items() for m in ops}


def test_every_route_is_documented_and_every_documented_route_exists() -> None:
    assert _served() - _documented() == set(), "routes missing from daemon/openapi.py"
    assert _documented() - _served() == set(), "documented routes the daemon does not serve"


def test_the_document_is_valid_openapi_and_is_served(daemon: Daemon) -> None:
    schema = schemathesis.openapi.from_dict(document())
    assert all(isinstance(r, Ok) for r in schema.get_all_operations())
    with Client(daemon.socket) as c:
        resp = c._call(_get_json(c, "/v1/openapi.json"))
    assert resp == document()


async def _get_json(c: Client, path: str) -> object:
    async with c.aio.session.get(c.url(path)) as resp:
        assert resp.status == 200
        return await resp.json()


@contextlib.contextmanager
def tcp_bridge(socket: Path) -> Iterator[str]:
    """A loopback TCP address whose connections are piped to the daemon's Unix socket."""
    loop = asyncio.new_event_loop()
    ready = threading.Event()
    port: list[int] = []

    async def pipe(r: asyncio.StreamReader, w: asyncio.StreamWriter) -> None:
        try:
            while data := await r.read(65536):
                w.write(data)
                await w.drain()
        except (ConnectionError, OSError):
            pass
        finally:
            with contextlib.suppress(Exception):
                w.close()

    async def serve(cr: asyncio.StreamReader, cw: asyncio.StreamWriter) -> None:
        try:
            ur, uw = await asyncio.open_unix_connection(str(socket))
        except OSError:
            cw.close()
            return
        await asyncio.gather(pipe(cr, uw), pipe(ur, cw))

    async def main() -> asyncio.Server:
        server = await asyncio.start_server(serve, "127.0.0.1", 0)
        port.append(server.sockets[0].getsockname()[1])
        return server

    def run() -> None:
        asyncio.set_event_loop(loop)
        server = loop.run_until_complete(main())
        ready.set()
        loop.run_forever()
        server.close()
        loop.run_until_complete(server.wait_closed())
        for task in asyncio.all_tasks(loop):
            task.cancel()
        loop.run_until_complete(asyncio.sleep(0))
        loop.close()

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    assert ready.wait(10)
    try:
        yield f"http://127.0.0.1:{port[0]}"
    finally:
        loop.call_soon_threadsafe(loop.stop)
        thread.join(10)


@pytest.mark.filterwarnings("ignore::ResourceWarning")
def test_schemathesis_finds_no_server_error(daemon: Daemon) -> None:
    with Client(daemon.socket) as c:  # something to find: a page with entries and commits
        c.put("notes", "inbox", b"k", b"v")
        c.batch("notes", "inbox", puts=[(b"n%d" % i, b"x" * i) for i in range(10)])
    schema = schemathesis.openapi.from_dict(document())
    failures: list[str] = []
    statuses: dict[int, int] = {}
    with tcp_bridge(daemon.socket) as base:
        for result in schema.get_all_operations():
            assert isinstance(result, Ok), result
            op = result.ok()

            @hypothesis.settings(
                max_examples=EXAMPLES,
                deadline=None,
                database=None,
                derandomize=True,
                phases=[Phase.explicit, Phase.generate],
                suppress_health_check=list(HealthCheck),
            )
            @hypothesis.given(case=op.as_strategy())
            def drive(case: Any) -> None:
                resp = case.call(base_url=base, timeout=60)
                statuses[resp.status_code] = statuses.get(resp.status_code, 0) + 1
                if resp.status_code >= 500:
                    failures.append(
                        f"{case.method} {resp.request.url}: {resp.status_code} {resp.text[:300]}"
                    )

            drive()
            assert daemon.proc.poll() is None, f"ledgerd died on {op.label}:\n{daemon.log_text()}"
    assert failures == [], "\n".join(failures[:20])
    assert sum(statuses.values()) >= 5 * len(_documented()), statuses
    assert sum(n for s, n in statuses.items() if s < 300) >= len(_documented()), statuses


def test_query_parameters_keep_their_exact_bytes(daemon: Daemon) -> None:
    """Found by schemathesis: query parameters were read after aiohttp had decoded them
    as UTF-8, so a prefix of non-ASCII or '%' bytes matched other keys, and characters
    above U+00FF were a 500."""
    keys = ["é1".encode(), b"\xe91", b"%411", b"A1", "\U0001f600".encode()]
    with Client(daemon.socket) as c:
        for k in keys:
            c.put("q", "p", k, k)
        for k in keys:
            assert [i.key for i in c.entries("q", "p", prefix=k[:-1])] == [k], k


def test_the_batch_schema_describes_every_op_and_the_whole_answer(daemon: Daemon) -> None:
    """The versionstamped ops are batch ops like put and delete (docs/http-api.md), and
    the answer carries the stamp and the completed keys and values."""
    doc = document()
    op_schema = doc["components"]["schemas"]["Batch"]["properties"]["ops"]["items"]
    assert set(op_schema["properties"]["op"]["enum"]) == {"put", "delete", *STAMPED_OPS}
    answer_schema = doc["paths"]["/v1/ledgers/{ledger}/pages/{page}/batch"]["post"]["responses"]
    documented = set(answer_schema["200"]["content"]["application/json"]["schema"]["properties"])
    stamped = Subspace(("log",)).pack_with_versionstamp((Versionstamp.incomplete(),))
    ops = [{"op": "set_versionstamped_key", "key": b64(stamped), "value": b64(b"v")}]
    with Client(daemon.socket) as c:
        answer = c._call(_post_json(c, "/v1/ledgers/app/pages/log/batch", {"ops": ops}))
    assert isinstance(answer, dict) and set(answer) == documented


async def _post_json(c: Client, path: str, body: object) -> object:
    async with c.aio.session.post(c.url(path), json=body) as resp:
        assert resp.status == 200
        return await resp.json()


def test_an_index_listing_with_unreadable_definitions_matches_its_schema(daemon: Daemon) -> None:
    """``GET …/_indexes`` answers, for a definition it cannot read, ``"partition":
    null``, ``code`` and ``message``; the description said only ``{"type": "object"}``
    and the client's docstrings named neither. Its answer, a readable index, a damaged
    definition and a newer ledgerd's among them, now matches the ``IndexList`` schema
    and the schema names every field of it."""
    import msgpack

    from ledgerd.store.documents import doclayout

    with Client(daemon.socket) as c:
        docs = c.documents("app", "idx")
        docs.create("c", {"k": 1})
        docs.declare_index("c", "by_k", "k")
        c.put("app", "idx", doclayout.index_key("c", "damaged"), b"\x93not a definition")
        newer = msgpack.packb([2, ["k"], None, "more"], use_bin_type=True)
        c.put("app", "idx", doclayout.index_key("c", "newer"), newer)
        c.heads("app", "idx")  # (commits the journal)
        listed = docs.indexes("c")
    assert [(i["name"], i.get("code"), i["partition"]) for i in listed] == [
        ("by_k", None, "k"),
        ("damaged", "corrupt", None),
        ("newer", "unsupported_layout", None),
    ]
    assert all(i["message"] for i in listed[1:])

    path = "/v1/ledgers/{ledger}/pages/{page}/docs/{collection}/_indexes"
    params = {"ledger": "app", "page": "idx", "collection": "c"}
    with tcp_bridge(daemon.socket) as base:
        schema = schemathesis.openapi.from_dict(document())
        case = schema[path]["GET"].Case(path_parameters=params)
        resp = case.call(base_url=base, timeout=60)
        assert resp.status_code == 200 and resp.json()["indexes"] == listed
        case.validate_response(resp)  # raises if the answer does not match

    documented = document()["components"]["schemas"]["Index"]["properties"]
    assert all(set(i) <= set(documented) for i in listed), (listed, documented)
    assert documented["code"]["enum"] == ["corrupt", "unsupported_layout"]
