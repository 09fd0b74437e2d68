"""OpenAI-compatible pool server (aiohttp) over a Backend, with injectable faults.

    python -m router_r1.pool.server --backend sim --pool configs/pool/sim.yaml --port 8000

    python -m router_r1.pool.server --backend hf --hf-model SmolLM2=SmolLM2-135M-Instruct.Q4_1.gguf --port 8000

Serves `GET /v1/models` and `POST /v1/chat/completions`. Faults (HTTP 500, 429 with
Retry-After, hangs, slow replies) are drawn from a seeded RNG per request, so a client's
retry logic can be tested against a known mix. ServerThread runs the app in a
background thread for tests and benchmarks.

Hostile requests get a 4xx JSON error, never a 500 or a held connection (the shared HTTP
layer, router_r1/pool/openai_http.py, says which); a field of the wrong type or out of its
range is a 400 naming it (router_r1/pool/chat_fields.py). A back end that is full (the hf
back end's bounded queue) gives 429 with Retry-After. Each answered request is logged with
its latency, also sent back in the `X-Latency-S` response header; one whose client left
first is logged too.
"""
from __future__ import annotations

import argparse
import asyncio
import logging
import math
import os
import random
import sys
import threading
import time
import uuid
from dataclasses import dataclass
from typing import Protocol

from aiohttp import web

from router_r1.pool import chat_fields
from router_r1.pool.errors import BadRequest, Overloaded
from router_r1.pool.openai_http import (MODEL_KEY, ServerSettings, application, bad_request_response,
                                        error_response, models_handler, read_json, serve_until_signal, start_site)
from router_r1.pool.registry import ModelRegistry, RegistryError
from router_r1.pool.world import SIM_POOL, world_of

__all__ = ["Backend", "FaultConfig", "Overloaded", "ServerSettings", "ServerThread", "make_pool_app", "main"]

log = logging.getLogger(__name__)

DEFAULT_MAX_TOKENS = 4096  # when a request gives none


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
    messages = chat_fields.messages(body)
    if body.get("stream"):
        raise BadRequest("streaming is not supported by this server", "stream")
    if body.get("n", 1) != 1:
        raise BadRequest("only n=1 is supported", "n")
    temperature = chat_fields.number(body, "temperature", 0.0, 2.0, 1.0)
    chat_fields.number(body, "top_p", 0.0, 1.0, 1.0, lo_open=True)  # checked; the back ends sample the full vocabulary
    _, max_tokens = chat_fields.max_tokens(body, DEFAULT_MAX_TOKENS)
    return ChatRequest(model, messages, temperature, max_tokens, chat_fields.seed(body))


def make_pool_app(backend: Backend, token: str | None = None, faults: FaultConfig | None = None,
             settings: ServerSettings | None = None) -> web.Application:
    """The aiohttp application serving `backend` under /v1."""
    faults = faults or FaultConfig()
    settings = settings or ServerSettings()
    draw = faults.drawer()
    model_ids = set(backend.model_ids())
    closing = asyncio.Event()  # set on shutdown so hanging requests end at once

    list_models = models_handler(backend.model_ids)

    async def chat(request: web.Request) -> web.Response:
        t0 = time.monotonic()
        try:
            req = parse_chat_request(await read_json(request, settings))
        except BadRequest as e:
            return bad_request_response(e)
        request[MODEL_KEY] = req.model  # named in the log line if the client leaves before the reply
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
        except BadRequest as e:  # what only the back end can check (a prompt longer than its limit)
            log.info("%s: %d (%s)", req.model, e.status, e)
            return bad_request_response(e)
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

    app = application(settings, token)
    app.router.add_get("/v1/models", list_models)
    app.router.add_post("/v1/chat/completions", chat)
    app.on_shutdown.append(on_shutdown)
    return app


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
        app = make_pool_app(self.backend, self._token, self._faults, self._settings)
        runner, self.port = await start_site(app, self.host, self.port, self._settings)
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
    p.add_argument("--backend", choices=("sim", "hf"), default="sim",
                   help="sim (the experts of the world the pool yaml names) or hf (local transformers models)")
    p.add_argument("--pool", default=str(SIM_POOL),
                   help="a simulated pool's yaml (sim backend; default configs/pool/sim.yaml)")
    p.add_argument("--host", default="127.0.0.1", help="address to bind (loopback by default)")
    p.add_argument("--port", type=int, default=8000, help="port to listen on")
    p.add_argument("--seed", type=int, default=0, help="world and latency seed (sim backend)")
    p.add_argument("--world-entities", type=int, default=None,
                   help="entities per type of the simulated world (sim backend; default the world's own; the data "
                        "must use the same)")
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
    p.add_argument("--max-prompt-tokens", type=int, default=8192,
                   help="longer prompts get 400 context_length_exceeded before they reach the model (hf backend)")
    ServerSettings.add_args(p)
    p.add_argument("--error-rate", type=float, default=0.0,
                   help="share of requests answered HTTP 500 (fault injection)")
    p.add_argument("--rate-limit-rate", type=float, default=0.0, help="share answered 429 with Retry-After")
    p.add_argument("--timeout-rate", type=float, default=0.0, help="share that hang for --hang-s before answering")
    p.add_argument("--slow-rate", type=float, default=0.0, help="share answered after --slow-s")
    p.add_argument("--hang-s", type=float, default=60.0, help="seconds a hanging request waits")
    p.add_argument("--slow-s", type=float, default=2.0, help="seconds a slow request waits")
    p.add_argument("--fault-seed", type=int, default=0, help="seed of the fault draws (one per request)")
    p.add_argument("--token-env", metavar="VAR", help="require 'Authorization: Bearer $VAR' on every request")
    return p.parse_args(argv)


def _build_backend(args: argparse.Namespace) -> Backend:
    if args.backend == "sim":
        try:
            world = world_of(ModelRegistry.from_yaml(args.pool), "--backend sim")
            return world.make_backend(args.pool, seed=args.seed, latency_scale=args.latency_scale,
                                      entities=args.world_entities)
        except RegistryError as e:
            raise SystemExit(str(e)) from None
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
                         batch_window_s=args.batch_window_s, max_queue=args.max_queue,
                         max_prompt_tokens=args.max_prompt_tokens)
    except ValueError as e:
        raise SystemExit(str(e)) from None


async def _serve_forever(backend: Backend, args: argparse.Namespace, token: str | None, faults: FaultConfig,
                         settings: ServerSettings) -> None:
    app = make_pool_app(backend, token, faults, settings)
    await serve_until_signal(app, args.host, args.port, "pool server listening on {url}", settings)


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
        settings = ServerSettings.from_args(args)
    except ValueError as e:
        raise SystemExit(str(e)) from None
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    backend = _build_backend(args)
    asyncio.run(_serve_forever(backend, args, token, faults, settings))


if __name__ == "__main__":
    sys.exit(main())
