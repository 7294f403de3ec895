"""HTTP to ledgerd over its Unix socket: :class:`HttpClient`, what the clients' calls
go through.

This module owns the connection (an aiohttp session opened at first use, refused when
the socket's directory is unsafe), URLs with their percent-encoded names, and the
daemon's error answers as :class:`~ledgerd.daemon.client_types.LedgerError`. The calls
themselves are :class:`~ledgerd.daemon.client_async.AsyncClient`'s and
:class:`~ledgerd.daemon.client_docs.AsyncDocuments`'.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import aiohttp
from yarl import URL

from ledgerd.daemon.client_types import (
    LedgerError,
    Name,
    NotFoundError,
    UnsafeSocketError,
    quote,
    reaching,
    socket_path,
)
from ledgerd.daemon.socketdir import socket_dir_problem


def _error(status: int, body: bytes) -> LedgerError:
    try:
        err = json.loads(body)["error"]
        code, message = str(err["code"]), str(err["message"])
    except (ValueError, KeyError, TypeError):
        code, message = f"http_{status}", body.decode(errors="replace")[:500]
    cls = NotFoundError if status == 404 else LedgerError
    return cls(code, message, status)


class HttpClient:
    """A connection to one daemon: an aiohttp session over its Unix socket, opened at
    first use, and requests on it."""

    def __init__(self, socket: str | Path | None = None, timeout: float | None = None) -> None:
        self.socket = socket_path(socket)
        self._timeout = aiohttp.ClientTimeout(total=timeout, sock_connect=10)
        self._session: aiohttp.ClientSession | None = None

    @property
    def session(self) -> aiohttp.ClientSession:
        if self._session is None:
            if problem := socket_dir_problem(self.socket):
                raise UnsafeSocketError("unsafe_socket", f"refusing to connect: {problem}")
            self._session = aiohttp.ClientSession(
                connector=aiohttp.UnixConnector(path=str(self.socket)), timeout=self._timeout
            )
        return self._session

    async def close(self) -> None:
        if self._session is not None:
            await self._session.close()
            self._session = None

    @staticmethod
    def url(path: str, query: dict[str, str | bytes | int | None] | None = None) -> URL:
        q = ""
        if query:
            parts = []
            for k, v in query.items():
                if v is None:
                    continue
                parts.append(f"{k}={quote(v if isinstance(v, bytes) else str(v))}")
            q = "?" + "&".join(parts) if parts else ""
        return URL("http://ledgerd" + path + q, encoded=True)

    @staticmethod
    def page_path(ledger: Name, page: Name) -> str:
        return f"/v1/ledgers/{quote(ledger)}/pages/{quote(page)}"

    async def request(
        self,
        method: str,
        url: URL,
        *,
        data: Any = None,
        json_body: Any = None,
        headers: dict[str, str] | None = None,
    ) -> aiohttp.ClientResponse:
        session = self.session
        with reaching(self.socket):
            resp = await session.request(method, url, data=data, json=json_body, headers=headers)
            if resp.status >= 400:
                body = await resp.read()
                resp.release()
                raise _error(resp.status, body)
        return resp

    async def _json(self, method: str, url: URL, body: Any = None) -> Any:
        resp = await self.request(method, url, json_body=body)
        with reaching(self.socket):
            async with resp:
                return await resp.json()
