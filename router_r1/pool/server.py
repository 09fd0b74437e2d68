"""OpenAI-compatible pool server (aiohttp) over a Backend, with injectable faults.

    python -m router_r1.pool.server --backend sim --pool configs/pool/sim.yaml --port 8000

    python -m router_r1.pool.server --backend hf --hf-model SmolLM2=SmolLM2-135M-Instruct.Q4_1.gguf --port 8000

Serves `GET /v1/models` and `POST /v1/chat/completions`. Faults (HTTP 500, 429 with
Retry-After, hangs, slow replies) are drawn from a seeded RNG per request, so a client's
retry logic can be tested against a known mix. ServerThread runs the app in a
background thread for tests and benchmarks.

Hostile requests get a 4xx, never a 500: a body that is not JSON or nests too deeply
(400), numbers past their bounds (400), a body larger than `max_body_bytes` (413, at once
when its Content-Length says so), a body that does not arrive within `read_timeout_s`
(408). A back end that is full (the hf back end's bounded queue) gives 429 with
Retry-After. Each answered request is logged with its latency, also sent back in the
`X-Latency-S` response header.
"""
from __future__ import annotations

import argparse
import asyncio
import hmac
import json
import logging
import math
import os
import random
import signal
import sys
import threading
import time
import uuid
from dataclasses import dataclass
from typing import Protocol

from aiohttp import web

from router_r1.pool.sim_backend import SimBackend
from router_r1.pool.sim_world import DEFAULT_ENTITIES, SimWorld

__all__ = ["Backend", "FaultConfig", "Overloaded", "ServerSettings", "ServerThread", "SimBackend", "make_app",
           "main"]

log = logging.getLogger(__name__)

DEFAULT_MAX_TOKENS = 4096  # when a request gives none
MAX_TOKENS_LIMIT = 1 << 20  # larger asks are refused (400): no model here writes a million tokens
SEED_LIMIT = 1 << 63  # |seed| below this (torch.manual_seed takes 64 bits)
ROLES = ("system", "user", "assistant", "developer", "tool")


class Backend(Protocol):
    async def complete(self, api_id: str, messages: list[dict], temperature: float, max_tokens: int,
                       seed: int | None) -> tuple[str, int, int]:
        """(text, prompt_tokens, completion_tokens) for one chat request."""
        ...

    def model_ids(self) -> list[str]:
        ...


@dataclass
class FaultConfig:
    """Per-request fault probabilities (their sum at most 1), drawn from Random(seed)."""

    error_rate: float = 0.0  # HTTP 500
    rate_limit_rate: float = 0.0  # HTTP 429 with a Retry-After header
    timeout_rate: float = 0.0  # the request hangs for hang_s, then gets a 504
    slow_rate: float = 0.0  # slow_s extra delay, then a normal reply
    hang_s: float = 60.0
    slow_s: float = 2.0
    retry_after_s: float = 1.0
    seed: int = 0

    def __post_init__(self):
        rates = {k: getattr(self, k) for k in ("error_rate", "rate_limit_rate", "timeout_rate", "slow_rate")}
        for k, v in rates.items():
            if not 0.0 <= v <= 1.0:
                raise ValueError(f"FaultConfig.{k} must be in [0, 1], got {v}")
        if sum(rates.values()) > 1.0 + 1e-9:
            raise ValueError(f"FaultConfig: fault rates sum to {sum(rates.values()):.3f} > 1")
        for k in ("hang_s", "slow_s", "retry_after_s"):
            if getattr(self, k) < 0:
                raise ValueError(f"FaultConfig.{k} must be >= 0, got {getattr(self, k)}")

    def drawer(self):
        """A function returning the next request's fault: None, 'error', 'rate_limit', 'hang' or 'slow'."""
        rng = random.Random(self.seed)
        bands = (("error", self.error_rate), ("rate_limit", self.rate_limit_rate),
                 ("hang", self.timeout_rate), ("slow", self.slow_rate))

        def draw() -> str | None:
            u, edge = rng.random(), 0.0
            for kind, rate in bands:
                edge += rate
                if u < edge:
                    return kind
            return None
        return draw


@dataclass
class ServerSettings:
    """Limits on what one request may hold."""

    read_timeout_s: float = 30.0  # a body not received within this gets 408 and the connection is freed
    max_body_bytes: int = 4 << 20  # 413 above this (a routed sub-question is a few kB)

    def __post_init__(self):
        if not self.read_timeout_s > 0 or self.max_body_bytes < 1:
            raise ValueError(f"ServerSettings: read_timeout_s must be > 0 and max_body_bytes >= 1, got "
                             f"{self.read_timeout_s}, {self.max_body_bytes}")


class Overloaded(Exception):
    """A back end's queue is full: the server answers 429 with Retry-After `retry_after_s`."""

    def __init__(self, message: str, retry_after_s: float):
        super().__init__(message)
        self.retry_after_s = retry_after_s


class BadRequest(Exception):
    def __init__(self, message: str, param: str | None = None):
        super().__init__(message)
        self.param = param


def error_response(status: int, message: str, etype: str, param: str | None = None,
                   code: str | None = None, headers: dict | None = None) -> web.Response:
    """An OpenAI-shaped error body: {"error": {message, type, param, code}}."""
    body = {"error": {"message": message, "type": etype, "param": param, "code": code}}
    return web.json_response(body, status=status, headers=headers)


def bearer_auth(token: str | None):
    """aiohttp middleware: with a token, a request without `Authorization: Bearer <token>` gets an OpenAI 401."""

    @web.middleware
    async def auth(request: web.Request, handler):
        if token is not None:
            given = request.headers.get("Authorization", "")
            if not hmac.compare_digest(given.encode(), f"Bearer {token}".encode()):
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


@dataclass
class ChatRequest:
    model: str
    messages: list[dict]
    temperature: float
    max_tokens: int
    seed: int | None


def parse_chat_request(body: object) -> ChatRequest:
    """Validate a chat-completions body; BadRequest names the offending field."""
    if not isinstance(body, dict):
        raise BadRequest("request body must be a JSON object")
    model = body.get("model")
    if not isinstance(model, str) or not model:
        raise BadRequest("'model' must be a non-empty string", "model")
    messages = body.get("messages")
    if not isinstance(messages, list) or not messages:
        raise BadRequest("'messages' must be a non-empty list", "messages")
    clean = []
    for i, m in enumerate(messages):
        if not isinstance(m, dict) or m.get("role") not in ROLES:
            raise BadRequest(f"messages[{i}] must be an object with 'role' one of {list(ROLES)}", f"messages[{i}].role")
        clean.append({"role": m["role"], "content": content_text(m.get("content"), i)})
    if body.get("stream"):
        raise BadRequest("streaming is not supported by this server", "stream")
    if body.get("n", 1) != 1:
        raise BadRequest("only n=1 is supported", "n")
    temperature = body.get("temperature", 1.0)
    if isinstance(temperature, bool) or not isinstance(temperature, (int, float)) or not 0 <= temperature <= 2:
        raise BadRequest("'temperature' must be a number in [0, 2]", "temperature")
    key = "max_completion_tokens" if body.get("max_completion_tokens") is not None else "max_tokens"
    max_tokens = body.get(key)
    if max_tokens is None:
        max_tokens = DEFAULT_MAX_TOKENS
    if isinstance(max_tokens, bool) or not isinstance(max_tokens, int) or not 1 <= max_tokens <= MAX_TOKENS_LIMIT:
        raise BadRequest(f"'{key}' must be an integer in [1, {MAX_TOKENS_LIMIT}]", key)
    seed = body.get("seed")
    if seed is not None and (isinstance(seed, bool) or not isinstance(seed, int)
                             or not -SEED_LIMIT < seed < SEED_LIMIT):
        raise BadRequest("'seed' must be an integer with |seed| < 2**63", "seed")
    return ChatRequest(model, clean, float(temperature), max_tokens, seed)


def content_text(content: object, i: int) -> str:
    """messages[i].content as text: OpenAI allows a string or a list of parts; only text parts mean anything here."""
    if isinstance(content, str):
        return content
    if isinstance(content, list) and all(isinstance(p, dict) and p.get("type") == "text"
                                         and isinstance(p.get("text"), str) for p in content):
        return "".join(p["text"] for p in content)
    raise BadRequest(f"messages[{i}].content must be a string or a list of text parts", f"messages[{i}].content")


def make_app(backend: Backend, token: str | None = None, faults: FaultConfig | None = None,
             settings: ServerSettings | None = None) -> web.Application:
    """The aiohttp application serving `backend` under /v1."""
    faults = faults or FaultConfig()
    settings = settings or ServerSettings()
    draw = faults.drawer()
    model_ids = set(backend.model_ids())
    closing = asyncio.Event()  # set on shutdown so hanging requests end at once

    auth = bearer_auth(token)
    list_models = models_handler(backend.model_ids)

    async def read_body(request: web.Request) -> bytes | web.Response:
        if request.content_length is not None and request.content_length > settings.max_body_bytes:
            return error_response(413, f"request body of {request.content_length} bytes is over the server's "
                                       f"limit of {settings.max_body_bytes}", "invalid_request_error")
        try:
            return await asyncio.wait_for(request.read(), settings.read_timeout_s)
        except asyncio.TimeoutError:
            return error_response(408, f"request body not received within {settings.read_timeout_s:g} s",
                                  "invalid_request_error", headers={"Connection": "close"})
        except web.HTTPRequestEntityTooLarge:
            return error_response(413, f"request body is over the server's limit of {settings.max_body_bytes} "
                                       "bytes", "invalid_request_error")

    async def chat(request: web.Request) -> web.Response:
        t0 = time.monotonic()
        raw = await read_body(request)
        if isinstance(raw, web.Response):
            return raw
        try:
            body = json.loads(raw)
        except (json.JSONDecodeError, UnicodeDecodeError):
            return error_response(400, "request body is not valid JSON", "invalid_request_error")
        except RecursionError:
            return error_response(400, "request body nests too deeply", "invalid_request_error")
        try:
            req = parse_chat_request(body)
        except BadRequest as e:
            return error_response(400, str(e), "invalid_request_error", param=e.param)
        if req.model not in model_ids:
            return error_response(404, f"model {req.model!r} does not exist (known: {sorted(model_ids)})",
                                  "invalid_request_error", param="model", code="model_not_found")
        fault = draw()
        if fault == "error":
            return error_response(500, "injected server error", "server_error")
        if fault == "rate_limit":
            return error_response(429, "injected rate limit", "rate_limit_error", code="rate_limit_exceeded",
                                  headers={"Retry-After": f"{faults.retry_after_s:g}"})
        if fault == "hang":
            try:
                await asyncio.wait_for(closing.wait(), faults.hang_s)
            except asyncio.TimeoutError:
                pass
            return error_response(504, "injected upstream timeout", "server_error")
        if fault == "slow":
            await asyncio.sleep(faults.slow_s)
        try:
            text, prompt_tokens, completion_tokens = await backend.complete(
                req.model, req.messages, req.temperature, req.max_tokens, req.seed)
        except Overloaded as e:
            log.info("%s: 429 (%s)", req.model, e)
            return error_response(429, str(e), "rate_limit_error", code="rate_limit_exceeded",
                                  headers={"Retry-After": f"{math.ceil(e.retry_after_s):d}"})
        except Exception as e:  # a backend bug is the server's error, not the client's
            log.exception("backend failed on model %s", req.model)
            return error_response(500, f"backend error: {type(e).__name__}", "server_error")
        latency = time.monotonic() - t0
        log.info("%s: 200 in %.3f s, %d prompt + %d completion tokens", req.model, latency, prompt_tokens,
                 completion_tokens)
        return web.json_response(headers={"X-Latency-S": f"{latency:.4f}"}, data={
            "id": f"chatcmpl-{uuid.uuid4().hex[:24]}",
            "object": "chat.completion",
            "created": int(time.time()),
            "model": req.model,
            "choices": [{
                "index": 0,
                "message": {"role": "assistant", "content": text},
                # the backend reports tokens, not whether it stopped early: hitting the cap counts as cut
                "finish_reason": "length" if completion_tokens >= req.max_tokens else "stop",
                "logprobs": None,
            }],
            "usage": {"prompt_tokens": prompt_tokens, "completion_tokens": completion_tokens,
                      "total_tokens": prompt_tokens + completion_tokens},
        })

    async def on_shutdown(app: web.Application) -> None:
        closing.set()
        aclose = getattr(backend, "aclose", None)
        if aclose is not None:
            await aclose()

    # the size limit is ours (read_body); aiohttp's own would answer a bigger body with its own page
    app = web.Application(middlewares=[auth], client_max_size=settings.max_body_bytes)
    app.router.add_get("/v1/models", list_models)
    app.router.add_post("/v1/chat/completions", chat)
    app.on_shutdown.append(on_shutdown)
    return app


async def start_site(app: web.Application, host: str, port: int) -> tuple[web.AppRunner, int]:
    """Start serving `app`; returns the runner and the bound port (useful with port 0)."""
    # a client that gives up (timeout) cancels its handler, so a hung request does not linger
    runner = web.AppRunner(app, shutdown_timeout=2.0, access_log=None, handler_cancellation=True)
    await runner.setup()
    site = web.TCPSite(runner, host, port)
    await site.start()
    return runner, runner.addresses[0][1]


class ServerThread:
    """Context manager running the pool server in a background thread with its own event loop."""

    def __init__(self, backend: Backend, host: str = "127.0.0.1", port: int = 0, token: str | None = None,
                 faults: FaultConfig | None = None, settings: ServerSettings | None = None):
        self.backend, self.host, self.port = backend, host, port
        self._token, self._faults, self._settings = token, faults, settings
        self._ready = threading.Event()
        self._error: BaseException | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._stop: asyncio.Event | None = None
        self._thread: threading.Thread | None = None

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}/v1"

    def __repr__(self) -> str:  # never shows the token
        return f"ServerThread(url={self.url!r}, auth={'on' if self._token else 'off'})"

    def start(self) -> "ServerThread":
        self._thread = threading.Thread(target=self._run, name="pool-server", daemon=True)
        self._thread.start()
        if not self._ready.wait(timeout=30):
            raise RuntimeError(f"pool server on {self.host}:{self.port} did not start within 30 s")
        if self._error is not None:
            raise RuntimeError(f"pool server on {self.host}:{self.port} failed to start: {self._error}") from self._error
        return self

    def _run(self) -> None:
        self._loop = asyncio.new_event_loop()
        try:
            self._loop.run_until_complete(self._serve())
        except BaseException as e:  # reported to the starting thread
            self._error = e
            self._ready.set()
        finally:
            self._loop.close()

    async def _serve(self) -> None:
        self._stop = asyncio.Event()
        app = make_app(self.backend, self._token, self._faults, self._settings)
        runner, self.port = await start_site(app, self.host, self.port)
        self._ready.set()
        try:
            await self._stop.wait()
        finally:
            await runner.cleanup()

    def stop(self) -> None:
        if self._thread is None:
            return
        if self._loop is not None and self._stop is not None and self._thread.is_alive():
            self._loop.call_soon_threadsafe(self._stop.set)
        self._thread.join(timeout=30)
        self._thread = None

    def __enter__(self) -> "ServerThread":
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()


def _parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m router_r1.pool.server", description=__doc__.splitlines()[0])
    p.add_argument("--backend", choices=("sim", "hf"), default="sim")
    p.add_argument("--pool", default="configs/pool/sim.yaml", help="pool yaml with sim: profiles (sim backend)")
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=8000)
    p.add_argument("--seed", type=int, default=0, help="world and latency seed (sim backend)")
    p.add_argument("--world-entities", type=int, default=DEFAULT_ENTITIES,
                   help="entities per type of the simulated world (sim backend; the data must use the same)")
    p.add_argument("--latency-scale", type=float, default=1.0, help="0 = answer at once (sim backend)")
    p.add_argument("--hf-model", action="append", default=[], metavar="API_ID=PATH",
                   help="a model directory or a .gguf file, served as API_ID; repeatable (hf backend)")
    p.add_argument("--device", default="cpu", help="torch device (hf backend)")
    p.add_argument("--threads", type=int, default=None,
                   help="torch CPU threads (hf backend); 1 on a shared machine: OpenMP threads spinning for a "
                        "busy core make decoding many times slower")
    p.add_argument("--max-batch-size", type=int, default=8, help="requests decoded together per model (hf backend)")
    p.add_argument("--batch-window-s", type=float, default=0.02,
                   help="how long a first request waits for others to join its batch (hf backend)")
    p.add_argument("--max-queue", type=int, default=256,
                   help="requests waiting per model before the server answers 429 + Retry-After (hf backend)")
    p.add_argument("--read-timeout-s", type=float, default=30.0, help="a request body must arrive within this")
    p.add_argument("--error-rate", type=float, default=0.0)
    p.add_argument("--rate-limit-rate", type=float, default=0.0)
    p.add_argument("--timeout-rate", type=float, default=0.0)
    p.add_argument("--slow-rate", type=float, default=0.0)
    p.add_argument("--hang-s", type=float, default=60.0)
    p.add_argument("--slow-s", type=float, default=2.0)
    p.add_argument("--fault-seed", type=int, default=0)
    p.add_argument("--token-env", metavar="VAR", help="require 'Authorization: Bearer $VAR' on every request")
    return p.parse_args(argv)


def _build_backend(args: argparse.Namespace) -> Backend:
    if args.backend == "sim":
        world = SimWorld(seed=args.seed, n_entities_per_type=args.world_entities)
        return SimBackend.from_pool_yaml(args.pool, seed=args.seed, latency_scale=args.latency_scale, world=world)
    if not args.hf_model:
        raise SystemExit("--backend hf needs at least one --hf-model API_ID=DIR")
    models = {}
    for item in args.hf_model:
        api_id, sep, path = item.partition("=")
        if not sep or not api_id or not path:
            raise SystemExit(f"--hf-model {item!r}: expected API_ID=PATH (a directory or a .gguf file)")
        models[api_id] = path
    from router_r1.pool.hf_backend import HFBackend  # torch/transformers only when asked for
    if args.threads is not None:
        import torch

        torch.set_num_threads(args.threads)
    try:
        return HFBackend(models, device=args.device, max_batch_size=args.max_batch_size,
                         batch_window_s=args.batch_window_s, max_queue=args.max_queue)
    except ValueError as e:
        raise SystemExit(str(e)) from None


async def serve_until_signal(app: web.Application, host: str, port: int, banner: str) -> None:
    """Serve `app` until SIGINT or SIGTERM; prints `banner` with {url} filled in once it listens."""
    runner, port = await start_site(app, host, port)
    print(banner.format(url=f"http://{host}:{port}/v1"), flush=True)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    try:
        await stop.wait()
    finally:
        await runner.cleanup()


async def _serve_forever(backend: Backend, args: argparse.Namespace, token: str | None, faults: FaultConfig) -> None:
    app = make_app(backend, token, faults, ServerSettings(read_timeout_s=args.read_timeout_s))
    await serve_until_signal(app, args.host, args.port, "pool server listening on {url}")


def main(argv: list[str] | None = None) -> None:
    args = _parse_args(argv)
    token = None
    if args.token_env:
        token = os.environ.get(args.token_env)
        if not token:
            raise SystemExit(f"--token-env {args.token_env}: that environment variable is not set or empty")
    try:
        faults = FaultConfig(args.error_rate, args.rate_limit_rate, args.timeout_rate, args.slow_rate,
                             hang_s=args.hang_s, slow_s=args.slow_s, seed=args.fault_seed)
    except ValueError as e:
        raise SystemExit(str(e)) from None
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    backend = _build_backend(args)
    asyncio.run(_serve_forever(backend, args, token, faults))


if __name__ == "__main__":
    sys.exit(main())
