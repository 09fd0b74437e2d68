"""The OpenAI-compatible HTTP layer both servers share (the pool server and the router server).

Every error goes back as OpenAI's JSON error body, never one of aiohttp's text pages: an unknown
path (404) or method (405), a malformed request line or header (400), a body that is not JSON, nests
too deeply or holds a number too long to read (400), a body over `max_body_bytes` (413), one that
does not arrive within `read_timeout_s` (408), more open connections than `max_connections` (503 at
once), a bug in a handler (500, its traceback logged). A connection whose request head has not
arrived within `header_timeout_s` (a slow client, or an idle keep-alive) is closed.

Client-caused trouble is logged without a traceback and at most once per kind per `log_interval_s`,
with a count of the lines left out; a request whose client left before the reply is logged once.
"""
from __future__ import annotations

import argparse
import asyncio
import hmac
import json
import logging
import math
import resource
import signal
import time
from dataclasses import dataclass
from http import HTTPStatus

from aiohttp import web

from router_r1.pool.errors import BadRequest

log = logging.getLogger("router_r1.http")

# a handler stores the request's model here, for the log line of a request whose client left
MODEL_KEY = web.RequestKey("model", str) if hasattr(web, "RequestKey") else "model"  # RequestKey: aiohttp >= 3.13
BACKLOG = 128  # connections the kernel queues for accept()
# file handles kept free under the open-file limit: asyncio accepts up to BACKLOG connections in one go before the
# cap sees them, and the server's own files, logs and outgoing pool calls need some
FD_RESERVE = BACKLOG + 64


@dataclass
class ServerSettings:
    """Limits on what one client may hold: time, bytes and connections."""

    read_timeout_s: float = 30.0  # a body not received within this gets 408 and the connection is freed
    header_timeout_s: float = 15.0  # a connection without a complete request head for this long is closed
    max_body_bytes: int = 4 << 20  # 413 above this (a routed sub-question is a few kB)
    max_connections: int = 1024  # more get 503 at once (and never more than the open-file limit allows)
    log_interval_s: float = 60.0  # one log line per kind of client error per interval

    def __post_init__(self):
        for k in ("read_timeout_s", "header_timeout_s", "log_interval_s"):
            if not getattr(self, k) > 0:
                raise ValueError(f"ServerSettings.{k} must be > 0, got {getattr(self, k)}")
        for k in ("max_body_bytes", "max_connections"):
            if getattr(self, k) < 1:
                raise ValueError(f"ServerSettings.{k} must be >= 1, got {getattr(self, k)}")

    @staticmethod
    def add_args(p: argparse.ArgumentParser) -> None:
        """The settings as command-line flags (both servers' CLIs)."""
        d = ServerSettings()
        p.add_argument("--read-timeout-s", type=float, default=d.read_timeout_s,
                       help="a request body must arrive within this (else 408)")
        p.add_argument("--header-timeout-s", type=float, default=d.header_timeout_s,
                       help="a connection without a complete request head for this long is closed (slow or idle)")
        p.add_argument("--max-body-bytes", type=int, default=d.max_body_bytes, help="larger bodies get 413")
        p.add_argument("--max-connections", type=int, default=d.max_connections,
                       help="open connections beyond this get 503 at once (also kept under the open-file limit)")

    @classmethod
    def from_args(cls, a: argparse.Namespace) -> "ServerSettings":
        """The settings the flags of add_args give; ValueError names a bad one."""
        return cls(read_timeout_s=a.read_timeout_s, header_timeout_s=a.header_timeout_s,
                   max_body_bytes=a.max_body_bytes, max_connections=a.max_connections)

    def connection_cap(self) -> int:
        """max_connections, lowered to fit the process's open-file limit (a full table stops accept())."""
        soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
        if soft == resource.RLIM_INFINITY:
            return self.max_connections
        return max(1, min(self.max_connections, soft - FD_RESERVE))


class ThrottledLog:
    """At most one line per kind per interval; the next line of that kind says how many were left out."""

    def __init__(self, interval_s: float, logger: logging.Logger = log):
        self.interval_s, self.logger = interval_s, logger
        self._last: dict[str, tuple[float, int]] = {}  # kind -> (time of the last line, lines left out since)

    def __call__(self, kind: str, message: str, level: int = logging.WARNING) -> None:
        now = time.monotonic()
        last, left_out = self._last.get(kind, (-math.inf, 0))
        if now - last < self.interval_s:
            self._last[kind] = (last, left_out + 1)
            return
        if left_out:
            message += f" ({left_out} more like it in the last {now - last:.0f} s)"
        self.logger.log(level, "%s", message)
        self._last[kind] = (now, 0)


def error_response(status: int, message: str, etype: str, param: str | None = None,
                   code: str | None = None, headers: dict | None = None) -> web.Response:
    """An OpenAI-shaped error body: {"error": {message, type, param, code}}."""
    body = {"error": {"message": message, "type": etype, "param": param, "code": code}}
    return web.json_response(body, status=status, headers=headers)


def bad_request_response(e: BadRequest) -> web.Response:
    """The client error a BadRequest names, as OpenAI's JSON error."""
    headers = {"Connection": "close"} if e.status == 408 else None
    return error_response(e.status, str(e), "invalid_request_error", param=e.param, code=e.code, headers=headers)


def _raw_error(status: int, message: str, etype: str) -> bytes:
    """A whole HTTP/1.1 error response as bytes, for a connection refused before aiohttp reads it."""
    body = json.dumps({"error": {"message": message, "type": etype, "param": None, "code": None}}).encode()
    head = (f"HTTP/1.1 {status} {HTTPStatus(status).phrase}\r\nContent-Type: application/json\r\n"
            f"Content-Length: {len(body)}\r\nRetry-After: 1\r\nConnection: close\r\n\r\n")
    return head.encode() + body


@web.middleware
async def json_errors(request: web.Request, handler):
    """aiohttp's own errors (404, 405, 413) as OpenAI JSON; a handler's bug as a JSON 500 with its traceback logged."""
    t0 = time.monotonic()
    try:
        return await handler(request)
    except web.HTTPException as e:
        if e.status < 400:
            raise
        message = {404: f"no such endpoint: {request.method} {request.path}",
                   405: f"{request.method} is not allowed on {request.path}"}.get(e.status, e.text or e.reason)
        headers = {"Allow": e.headers["Allow"]} if "Allow" in e.headers else None
        return error_response(e.status, message, "invalid_request_error", headers=headers)
    except asyncio.CancelledError:  # the client closed the connection (gave up, or shut its sending side)
        _log_gone(request, t0)
        raise
    except ConnectionError:  # the same, seen while reading the body
        _log_gone(request, t0)
        return web.Response(status=400)  # nobody reads it; aiohttp drops it quietly
    except Exception as e:  # a bug here: the server's error, said without internals
        log.exception("%s %s failed", request.method, request.path)
        return error_response(500, f"server error: {type(e).__name__}", "server_error")


def _log_gone(request: web.Request, t0: float) -> None:
    model = f" ({request[MODEL_KEY]})" if MODEL_KEY in request else ""
    log.info("%s %s%s: no reply sent, the connection closed after %.2f s (the client left, or the server is "
             "stopping)", request.method, request.path, model, time.monotonic() - t0)


def bearer_auth(token: str | None):
    """aiohttp middleware: with a token, a request without `Authorization: Bearer <token>` gets an OpenAI 401."""
    expected = f"Bearer {token}".encode() if token is not None else b""

    @web.middleware
    async def auth(request: web.Request, handler):
        if token is not None:
            # header bytes that are not UTF-8 reach us as surrogate escapes: compare them as the bytes sent
            given = request.headers.get("Authorization", "").encode("utf-8", "surrogateescape")
            if not hmac.compare_digest(given, expected):
                return error_response(401, "invalid or missing bearer token", "invalid_request_error",
                                      code="invalid_api_key")
        return await handler(request)

    return auth


def models_handler(model_ids):
    """The `/v1/models` handler listing `model_ids()`."""

    async def list_models(request: web.Request) -> web.Response:
        data = [{"id": m, "object": "model", "created": 0, "owned_by": "router-r1"} for m in model_ids()]
        return web.json_response({"object": "list", "data": data})

    return list_models


def application(settings: ServerSettings, token: str | None) -> web.Application:
    """An aiohttp application with the JSON-error and auth middlewares and the body limit of `settings`."""
    return web.Application(middlewares=[json_errors, bearer_auth(token)], client_max_size=settings.max_body_bytes)


def payload_reason(e: BaseException) -> str:
    """aiohttp's payload error in one line: its cause's message ("Can not decode content-encoding: gzip")."""
    text = str(e.__cause__ or e)
    text = text.split("message:", 1)[-1]
    return " ".join(text.split())[:200] or type(e).__name__


def _refuse_constant(name: str):
    raise ValueError(f"{name} is not a JSON number")


async def read_json(request: web.Request, settings: ServerSettings) -> object:
    """The request body parsed as JSON; BadRequest (400, 408 or 413) says why it cannot be."""
    if request.content_length is not None and request.content_length > settings.max_body_bytes:
        raise BadRequest(f"request body of {request.content_length} bytes is over the server's limit of "
                         f"{settings.max_body_bytes}", status=413)
    try:
        raw = await asyncio.wait_for(request.read(), settings.read_timeout_s)
    except asyncio.TimeoutError:
        raise BadRequest(f"request body not received within {settings.read_timeout_s:g} s", status=408) from None
    except web.HTTPRequestEntityTooLarge:
        raise BadRequest(f"request body is over the server's limit of {settings.max_body_bytes} bytes",
                         status=413) from None
    except web.RequestPayloadError as e:  # gzip/deflate that does not decode, a broken chunked encoding
        encoding = request.headers.get("Content-Encoding")
        if encoding:
            raise BadRequest(f"request body does not decode as its Content-Encoding ({encoding}) says") from None
        raise BadRequest(f"request body could not be read: {payload_reason(e)}") from None
    try:
        return json.loads(raw, parse_constant=_refuse_constant)
    except UnicodeDecodeError:
        raise BadRequest("request body is not UTF-8 text") from None
    except json.JSONDecodeError as e:
        raise BadRequest(f"request body is not valid JSON ({e.msg} at character {e.pos})") from None
    except ValueError as e:  # a number past Python's digit limit, or NaN / Infinity
        why = "an integer too long to read" if "digits" in str(e) else str(e)
        raise BadRequest(f"request body is not valid JSON: it holds {why}") from None
    except RecursionError:
        raise BadRequest("request body nests too deeply") from None


class _Connection(web.RequestHandler):
    """aiohttp's connection handler with a connection cap, JSON protocol errors and quiet logs."""

    def connection_made(self, transport) -> None:
        guard: _Guard = self._manager.guard
        super().connection_made(transport)
        self._guard, self._head_pending, self._counted = guard, False, True
        guard.open += 1
        if guard.open > guard.cap:
            guard.note("cap", f"over the connection cap of {guard.cap}: answered 503 and closed")
            transport.write(_raw_error(503, f"the server holds its limit of {guard.cap} connections; retry shortly",
                                       "server_error"))
            self.force_close()

    def data_received(self, data: bytes) -> None:
        super().data_received(data)
        # bytes of a request head that is not complete yet (start() still waits for a message)
        waiter = self._waiter
        self._head_pending = bool(data) and waiter is not None and not waiter.done()

    def connection_lost(self, exc: BaseException | None) -> None:
        if getattr(self, "_counted", False):
            self._counted = False
            self._guard.open -= 1
            if self._head_pending:
                self._guard.note("slow head", f"closed a connection whose request head did not arrive within "
                                              f"{self._guard.settings.header_timeout_s:g} s")
        super().connection_lost(exc)

    def log_exception(self, *args, exc_info=None, **kw) -> None:
        # a body that does not decode was answered 400 by read_json; aiohttp then drains the rest of it and meets the
        # same error again: one throttled line, not a traceback per request
        if isinstance(exc_info, web.RequestPayloadError):
            self._guard.note("bad payload", f"closed a connection whose request body could not be read: "
                                            f"{payload_reason(exc_info)}")
            return
        super().log_exception(*args, exc_info=exc_info, **kw)

    def handle_error(self, request, status: int = 500, exc: BaseException | None = None,
                     message: str | None = None) -> web.StreamResponse:
        """A request aiohttp could not parse (400) or a failure outside the handlers, as OpenAI JSON."""
        said = " ".join(line.strip() for line in (message or "").splitlines() if line.strip())[:300]
        said = said or HTTPStatus(status).phrase
        if status >= 500:
            self.logger.error("%s on a request from %s", status, request.remote, exc_info=exc)
        else:
            self._guard.note(f"http {status}", f"refused a malformed request ({status}): {said}")
        if request.writer.output_size > 0:  # a reply has begun: the connection is broken
            raise ConnectionError("response already started, cannot send the error")
        resp = error_response(status, said, "invalid_request_error" if status < 500 else "server_error")
        resp.force_close()
        return resp


class _Guard:
    """A server's open-connection count, its cap and its throttled log."""

    def __init__(self, settings: ServerSettings):
        self.settings, self.cap, self.open = settings, settings.connection_cap(), 0
        self.note = ThrottledLog(settings.log_interval_s)

    def loop_errors(self, loop: asyncio.AbstractEventLoop, context: dict) -> None:
        """The loop's exception handler: accept() failures (a full file table) once per interval, no traceback."""
        exc = context.get("exception")
        if isinstance(exc, OSError):
            self.note(f"loop {type(exc).__name__} {exc.errno}", f"{context.get('message', 'socket error')}: {exc}")
        else:
            loop.default_exception_handler(context)


class _Server(web.Server):
    guard: _Guard

    def __call__(self) -> _Connection:
        return _Connection(self, loop=self._loop, **self._kwargs)


class _Runner(web.AppRunner):
    """AppRunner whose connections are _Connection handlers sharing one _Guard."""

    def __init__(self, app: web.Application, settings: ServerSettings, **kwargs):
        super().__init__(app, **kwargs)
        self.guard = _Guard(settings)

    async def _make_server(self) -> web.Server:
        server = await super()._make_server()
        server.__class__ = _Server  # aiohttp builds its Server in _make_server; this one makes _Connection handlers
        server.guard = self.guard
        return server


async def start_site(app: web.Application, host: str, port: int,
                     settings: ServerSettings | None = None) -> tuple[web.AppRunner, int]:
    """Start serving `app` under `settings`' limits; returns the runner and the bound port (useful with port 0)."""
    settings = settings or ServerSettings()
    # a client that gives up (timeout) cancels its handler, so a hung request does not linger; an idle connection
    # (no complete request head) is closed after header_timeout_s: aiohttp's keep-alive timer runs from the
    # connection's start and from each reply, and incoming bytes that do not complete a head do not reset it
    runner = _Runner(app, settings, shutdown_timeout=2.0, access_log=None, handler_cancellation=True,
                     keepalive_timeout=settings.header_timeout_s)
    await runner.setup()
    asyncio.get_running_loop().set_exception_handler(runner.guard.loop_errors)
    site = web.TCPSite(runner, host, port, backlog=BACKLOG)
    await site.start()
    return runner, runner.addresses[0][1]


async def serve_until_signal(app: web.Application, host: str, port: int, banner: str,
                             settings: ServerSettings | None = None) -> None:
    """Serve `app` until SIGINT or SIGTERM; prints `banner` with {url} filled in once it listens."""
    runner, port = await start_site(app, host, port, settings)
    print(banner.format(url=f"http://{host}:{port}/v1"), flush=True)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    try:
        await stop.wait()
    finally:
        await runner.cleanup()
