"""The HTTP connections under the API: aiohttp's per-connection protocol, our way.

This module owns what happens before a request reaches :mod:`daemon.api`: errors
of aiohttp's HTTP parser answered in the API's JSON error shape, the request-line
and header size limits, and the timeouts that close connections which send no
request. It does not own routes or error codes (:mod:`daemon.api`,
:mod:`daemon.errors`).

Why subclasses: aiohttp answers a request its parser refused (bad method, a
request line over ``max_line_size``, Content-Length with Transfer-Encoding, a bad
chunk size...) from ``RequestHandler.handle_error``, inside the connection's
protocol, without going through the application: no middleware,
``on_response_prepare`` or request factory sees that response, and
``handler_args`` only passes constructor arguments. The protocol class is chosen
in ``web.Server.__call__`` (the site's protocol factory), and ``web.AppRunner``
builds its Server in ``_make_server``. So :class:`ApiRunner` wraps the Server
the AppRunner built (same handler and request factory) in a :class:`_Server`
that makes :class:`_Connection` protocols, whose ``handle_error`` answers JSON.
"""

from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass
from typing import Any

from aiohttp import web
from aiohttp.http_exceptions import HttpProcessingError, LineTooLong

from ledgerd.daemon import errors as ae
from ledgerd.daemon.config import Config
from ledgerd.store import KEY_LIMIT, NAME_LIMIT

log = logging.getLogger(__name__)

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

    @classmethod
    def of(cls, cfg: Config) -> Limits:
        return cls(MAX_REQUEST_LINE, MAX_FIELD_SIZE, cfg.request_timeout, cfg.keepalive_timeout)


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
        self._first_request: asyncio.TimerHandle | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        super().connection_made(transport)
        # aiohttp's keep-alive timer closes a connection idle between requests (and one
        # whose next request is half sent); this one bounds the wait for the first.
        self._first_request = asyncio.get_running_loop().call_later(
            self.limits.request_timeout, self._no_request
        )

    def request_arrived(self) -> None:
        if self._first_request is not None:
            self._first_request.cancel()
            self._first_request = None

    def _no_request(self) -> None:
        self._first_request = None
        log.debug("closing a connection with no request in %gs", self.limits.request_timeout)
        self.force_close()

    def connection_lost(self, exc: BaseException | None) -> None:
        self.request_arrived()
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


class _Server(web.Server):
    """The Server ``web.AppRunner`` built, making :class:`_Connection` protocols."""

    def __init__(self, base: web.Server, limits: Limits, **kwargs: Any) -> None:
        factory = base.request_factory

        def make_request(
            message: Any, payload: Any, protocol: web.RequestHandler, *rest: Any
        ) -> web.BaseRequest:
            """The app's request factory, which aiohttp calls once per parsed request."""
            if isinstance(protocol, _Connection):
                protocol.request_arrived()
            return factory(message, payload, protocol, *rest)

        super().__init__(
            base.request_handler,
            request_factory=make_request,
            handler_cancellation=base.handler_cancellation,
            **kwargs,
        )
        self.limits = limits

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
        }


class ApiRunner(web.AppRunner):
    """``web.AppRunner`` whose connections are :class:`_Connection`."""

    def __init__(self, app: web.Application, limits: Limits, **kwargs: Any) -> None:
        super().__init__(app, access_log=None, **kwargs)
        self.limits = limits

    async def _make_server(self) -> web.Server:
        return _Server(await super()._make_server(), self.limits)
