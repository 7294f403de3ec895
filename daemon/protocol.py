"""The HTTP connections under the API: aiohttp's per-connection protocol, our way.

This module owns what happens before a request reaches :mod:`daemon.api`: errors
of aiohttp's HTTP parser answered in the API's JSON error shape, the request-line
and header size limits, and the timeouts that close connections which send no
request. It does not own routes or error codes (:mod:`daemon.api`,
:mod:`daemon.errors`).

Why subclasses: aiohttp answers a request its parser refused (bad method, a
request line over ``max_line_size``, Content-Length with Transfer-Encoding, a bad
chunk size...) from ``RequestHandler.handle_error``, inside the connection's
protocol: neither the request handler nor the request factory sees that request
or its answer. The protocol class is chosen in ``web.Server.__call__`` (the
site's protocol factory). So :class:`ApiRunner` runs a :class:`_Server` that
makes :class:`_Connection` protocols, whose ``handle_error`` answers JSON.

Why no ``web.Application``: the API matches its own table of routes on the raw
path (:data:`daemon.routes.ROUTES`) and does its plumbing in one function
(:meth:`daemon.api.Api.serve`), so an
application's router (one catch-all route, resolved on every request) and
middleware chain only cost time: :class:`ApiRunner` is a ``web.ServerRunner`` of
aiohttp's low-level server (``web.Server``) serving the API's handler, and its
``shutdown`` step is the application's ``on_shutdown``.

Only aiohttp's public classes and methods are used or overridden (``web.Server`` and
its ``__call__``, ``web.RequestHandler.handle_error`` and ``connection_lost``,
``web.ServerRunner.shutdown``); ``pyproject.toml`` pins the minor version the
code is tested with.
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from http import HTTPStatus
from typing import Any

from aiohttp import web
from aiohttp.http_exceptions import HttpProcessingError, LineTooLong

from ledgerd.daemon import errors as ae
from ledgerd.daemon.config import Config
from ledgerd.store import KEY_LIMIT, NAME_LIMIT

log = logging.getLogger(__name__)

Handler = Callable[[web.BaseRequest], Awaitable[web.StreamResponse]]

MAX_REQUEST_LINE = (
    3 * (2 * NAME_LIMIT + KEY_LIMIT)  # the path: ledger, page and key, each byte as %XX
    + 3 * 3 * KEY_LIMIT  # the query's start, end and prefix of an entries listing
    + 3 * 4 * -(-KEY_LIMIT // 3)  # and its continuation token: a key in base64, as %XX
    + 1024  # the method, the fixed parts of the path and the other parameters
)
"""The longest request line (aiohttp's ``max_line_size``) accepted: any request with
keys and names up to their limits fits, whatever their bytes. Past it the answer is
414 ``key_too_large``."""
MAX_FIELD_SIZE = 8190
"""The longest header line (aiohttp's default); the API's headers are short."""


@dataclass(frozen=True)
class Limits:
    """What a connection may send and how long it may stay silent."""

    max_line_size: int
    max_field_size: int
    request_timeout: float
    keepalive_timeout: float
    max_connections: int

    @classmethod
    def of(cls, cfg: Config) -> Limits:
        return cls(
            MAX_REQUEST_LINE,
            MAX_FIELD_SIZE,
            cfg.request_timeout,
            cfg.keepalive_timeout,
            cfg.max_connections,
        )


REFUSAL_GRACE = 1.0
"""Seconds a connection refused past ``max_connections`` stays open after its 503 was
written (at most ``request_timeout``): long enough for the client to send its request
and read the answer, rather than fail writing to a closed socket."""


def refusal(err: ae.ApiError) -> bytes:
    """A whole HTTP response for ``err``, written on a connection before any request is
    read from it (``Connection: close``)."""
    body = json.dumps(err.body()).encode()
    head = [
        f"HTTP/1.1 {err.status} {HTTPStatus(err.status).phrase}",
        "Content-Type: application/json; charset=utf-8",
        f"Content-Length: {len(body)}",
        "Connection: close",
        *(f"{k}: {v}" for k, v in err.headers.items()),
    ]
    return ("\r\n".join(head) + "\r\n\r\n").encode() + body


def parser_error(
    status: int, exc: BaseException | None, message: str | None, limits: Limits
) -> ae.ApiError:
    """The API error for a request aiohttp refused before it reached the API."""
    if isinstance(exc, LineTooLong) and exc.args[1:2] == (limits.max_line_size,):
        return ae.UriTooLong(
            f"the request line is over {limits.max_line_size} bytes"
            f" (a key is at most {KEY_LIMIT} bytes)"
        )
    text = message or (exc.message if isinstance(exc, HttpProcessingError) else "") or ""
    if 400 <= status < 500:
        err: ae.ApiError = ae.BadRequest(f"malformed HTTP request: {text}".rstrip(": "))
        err.status = status
        return err
    return ae.ApiError(f"internal error: {type(exc).__name__}" if exc else None)


class _Connection(web.RequestHandler):
    """One client connection (aiohttp's protocol), answering parser errors in JSON
    and closing itself when no request arrives in time."""

    def __init__(self, manager: _Server, **kwargs: Any) -> None:
        super().__init__(manager, **kwargs)
        self.limits = manager.limits
        self.server = manager
        self._first_request: asyncio.TimerHandle | None = None
        self.refused = False
        """Past ``max_connections``: answered 503 at once and closed (:meth:`_refuse`)."""
        self.lost: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        """Done when the connection is gone (see :func:`connection_lost`)."""
        self._stalled: asyncio.TimerHandle | None = None
        """While the client reads too little of what is sent (:meth:`pause_writing`)."""

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        super().connection_made(transport)
        self.server.open_connections += 1
        self.server.live.add(self)
        if self.server.open_connections > self.limits.max_connections:
            self._refuse(transport)
            return
        # aiohttp's keep-alive timer closes a connection idle between requests (and one
        # whose next request is half sent); this one bounds the wait for the first.
        self._first_request = asyncio.get_running_loop().call_later(
            self.limits.request_timeout, self._no_request
        )

    def _refuse(self, transport: asyncio.BaseTransport) -> None:
        """Past ``max_connections``: answer 503 ``overloaded`` without reading a request
        (so the refusal costs no parsing, handler or page), then close the connection
        as soon as the client has sent something, or after :data:`REFUSAL_GRACE`."""
        self.refused = True
        if not self.server.saturated:  # once per episode, not once per connection
            self.server.saturated = True
            log.warning(
                "refusing connections: %d are open (max_connections)",
                self.limits.max_connections,
            )
        assert isinstance(transport, asyncio.WriteTransport)
        transport.write(
            refusal(
                ae.Overloaded(
                    f"{self.limits.max_connections} connections are open (max_connections):"
                    " try again shortly"
                )
            )
        )
        grace = min(REFUSAL_GRACE, self.limits.request_timeout)
        self._first_request = asyncio.get_running_loop().call_later(grace, self._close_refused)

    def _close_refused(self) -> None:
        self._first_request = None
        if self.transport is not None:
            self.transport.close()

    def data_received(self, data: bytes) -> None:
        if self.refused:  # its answer is written: what it sends is not read
            self.request_arrived()
            self._close_refused()
            return
        super().data_received(data)

    def request_arrived(self) -> None:
        if self._first_request is not None:
            self._first_request.cancel()
            self._first_request = None

    def _no_request(self) -> None:
        self._first_request = None
        log.debug("closing a connection with no request in %gs", self.limits.request_timeout)
        self.force_close()

    def pause_writing(self) -> None:
        """The transport's buffer is over its high-water mark: the client reads less than
        is sent. If it takes none of it down to the low-water mark for
        ``request_timeout`` seconds, the connection is cut (:meth:`_cut_stalled`), so
        that an answer made whole before it is sent (a listing of up to
        ``max_listing_bytes``) is not held for as long as the client keeps the
        connection without reading: streamed answers bound each write the same way
        (``Api.bounded``), but a whole answer is written by aiohttp after the handler
        returned, with no bound."""
        super().pause_writing()
        if self._stalled is None:
            loop = asyncio.get_running_loop()
            self._stalled = loop.call_later(self.limits.request_timeout, self._cut_stalled)

    def resume_writing(self) -> None:
        if self._stalled is not None:
            self._stalled.cancel()
            self._stalled = None
        super().resume_writing()

    def _cut_stalled(self) -> None:
        self._stalled = None
        log.debug(
            "cutting a connection whose client read none of its answer for %gs",
            self.limits.request_timeout,
        )
        if self.transport is not None:
            self.transport.abort()

    def connection_lost(self, exc: BaseException | None) -> None:
        self.request_arrived()
        if self._stalled is not None:
            self._stalled.cancel()
            self._stalled = None
        if not self.lost.done():
            self.lost.set_result(None)
            self.server.open_connections -= 1
            self.server.live.discard(self)
            if self.server.open_connections < self.limits.max_connections:
                self.server.saturated = False
        super().connection_lost(exc)

    def handle_error(
        self,
        request: web.BaseRequest,
        status: int = 500,
        exc: BaseException | None = None,
        message: str | None = None,
    ) -> web.StreamResponse:
        if request.writer.output_size > 0:  # as aiohttp: nothing can be said in-band
            raise ConnectionError("the response has started: cannot send an error")
        err = parser_error(status, exc, message, self.limits)
        if isinstance(exc, ConnectionError) or (
            exc is not None and isinstance(exc.__cause__, ConnectionError)
        ):
            # The client went away mid-request (an aborted upload, Ctrl-C): normal.
            log.debug("%s: the client went away: %s", request.path, exc)
        elif err.status >= 500:
            log.error("internal error serving %s", request.path, exc_info=exc)
        else:
            log.debug("refused a malformed request: %s", err)
        resp = web.json_response(err.body(), status=err.status)
        resp.force_close()
        return resp


def connection_lost(request: web.BaseRequest) -> asyncio.Future[None]:
    """A future done when the client of ``request`` has gone away: what a handler that
    waits a long time for something else (a followed feed) also waits for, since
    aiohttp lets a handler run on after its connection is lost."""
    protocol = request.protocol
    if isinstance(protocol, _Connection):
        return protocol.lost
    gone: asyncio.Future[None] = asyncio.get_running_loop().create_future()
    if request.transport is None or request.transport.is_closing():
        gone.set_result(None)
    return gone


class _Server(web.Server):
    """aiohttp's low-level server of the API's handler, making :class:`_Connection`
    protocols and ``web.Request`` objects."""

    def __init__(self, handler: Handler, limits: Limits, client_max_size: int) -> None:
        def make_request(
            message: Any,
            payload: Any,
            protocol: web.RequestHandler,
            writer: Any,
            task: asyncio.Task[None],
        ) -> web.BaseRequest:
            """The request factory, which aiohttp calls once per parsed request."""
            if isinstance(protocol, _Connection):
                protocol.request_arrived()
            return web.Request(
                message,
                payload,
                protocol,
                writer,
                task,
                asyncio.get_running_loop(),
                client_max_size=client_max_size,
            )

        super().__init__(handler, request_factory=make_request)
        self.limits = limits
        self.open_connections = 0
        """Connections made and not lost yet (refused ones included)."""
        self.saturated = False
        """Whether connections are being refused (``max_connections``): logged once."""
        self.live: set[_Connection] = set()
        """The connections made and not lost yet (:meth:`ApiRunner.abort_connections`)."""

    def __call__(self) -> web.RequestHandler:
        return _Connection(self, loop=asyncio.get_running_loop(), **self.handler_kwargs())

    def handler_kwargs(self) -> dict[str, Any]:
        return {
            "access_log": None,
            "max_line_size": self.limits.max_line_size,
            "max_field_size": self.limits.max_field_size,
            "keepalive_timeout": self.limits.keepalive_timeout,
            # After an error that left a body unread, aiohttp reads (and drops) the
            # rest for up to this long before closing; a silent client gets no more.
            "lingering_time": min(10.0, self.limits.request_timeout),
            # Bodies are taken as sent (the API refuses a Content-Encoding with 415): never
            # inflated, so a small body cannot become a large one in memory.
            "auto_decompress": False,
        }


class ApiRunner(web.ServerRunner):
    """Serves the API's ``handler`` on :class:`_Connection` protocols (``web.ServerRunner``
    given our server), calling ``on_shutdown`` when it stops, after the sites stop
    listening and before requests in flight are waited for (an application's
    ``on_shutdown``)."""

    def __init__(
        self,
        handler: Handler,
        limits: Limits,
        *,
        client_max_size: int,
        on_shutdown: Callable[[], Awaitable[None]],
        **kwargs: Any,
    ) -> None:
        super().__init__(_Server(handler, limits, client_max_size), **kwargs)
        self.on_shutdown = on_shutdown

    async def shutdown(self) -> None:
        await self.on_shutdown()

    def abort_connections(self) -> int:
        """Abort every connection still open (a stop past ``shutdown_timeout``); how
        many there were. aiohttp's own stop only closes a connection, which waits for
        the client to read what is buffered, and waits for its handler twice
        ``shutdown_timeout``: a client that reads none of its answer held the stop that
        long past its bound."""
        server = self.server
        if not isinstance(server, _Server):
            return 0
        conns = [c for c in server.live if c.transport is not None]
        for c in conns:
            assert c.transport is not None
            c.transport.abort()
        return len(conns)
