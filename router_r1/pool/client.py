"""Async client for the model pool: batched, bounded per endpoint, retried, deadline-aware.

A pool failure is a result (`ok=False`, `text=None`, cost 0, an error kind), never an
exception: one rate-limited endpoint must not kill a rollout. The reference waited a
fixed 5 s up to 500 times per call; here retries use exponential backoff with full
jitter, a Retry-After header is honoured up to `backoff_max_s`, and no call or sleep
runs past the deadline.

A reply without `usage` counts as ok with 0 tokens and cost 0 (the text is still
useful to the policy); a warning is logged once per model so the free calls are seen.

A hostile or broken endpoint cannot crash or flood a run (docs/bad_input.md): the body is
read by this module, at most `ReplyLimits.max_bytes` of it (beyond: `too_large`), and a
body that is not UTF-8 JSON of the chat.completion shape is `bad_response`; reply text
longer than `ReplyLimits.max_chars` is cut there (`cut=True`); a usage block claiming
more than the call could have used is counted at that bound (`usage_capped=True`).
`timeout_s` bounds each attempt, headers and body together.

With `cache_dir`, successful replies are stored (text and token counts). A hit returns
`cached=True`, `attempts=0` and the cost of the stored tokens at the registry price,
i.e. the original cost while the pool yaml's prices are unchanged, so re-run
evaluations report identical numbers.

Event-loop note: SDK clients and semaphores are made per event loop. The sync `route()`
uses one private loop thread (keep-alive connections survive between calls); call
`close()` when done. Async callers should `await aclose()` (or `async with`).
"""
from __future__ import annotations

import asyncio
import concurrent.futures
import email.utils
import json
import logging
import math
import random
import threading
import time
import weakref
from dataclasses import dataclass
from typing import Callable, Iterable

import httpx2  # the HTTP library under openai's SDK: a body read by us raises its errors
import openai

from router_r1.pool.cache import CachedReply, ResponseCache, cache_key
from router_r1.pool.redact import redact
from router_r1.pool.messages import clean_text, submodel_messages
from router_r1.pool.registry import ModelRegistry, ModelSpec

log = logging.getLogger(__name__)

ERROR_KINDS = ("unknown_model", "timeout", "rate_limit", "server_error", "connection",
               "bad_response", "too_large", "deadline", "auth")
RETRYABLE = frozenset({"timeout", "rate_limit", "server_error", "connection"})


# Chat templates add tokens the request's text does not show (role markers, a default system
# prompt): the most a prompt may count beyond one token per byte of its messages.
PROMPT_TEMPLATE_TOKENS = 1024


@dataclass(frozen=True)
class ReplyLimits:
    """What one pool reply may take; env.max_reply_chars / env.max_reply_bytes of a routing run."""

    max_chars: int = 32_000  # reply text kept; longer text is cut here and the call marked `cut` (a 512-token reply is ~3,000)
    max_bytes: int = 4 * 2**20  # reply body read; a longer body is a failed call (`too_large`), read no further

    def __post_init__(self):
        if self.max_chars < 1 or self.max_bytes < 1:
            raise ValueError(f"ReplyLimits: max_chars and max_bytes must be >= 1, got {self.max_chars}, "
                             f"{self.max_bytes}")


class ReplyTooLarge(Exception):
    """A reply body longer than ReplyLimits.max_bytes (raised while reading it)."""


@dataclass
class RouteRequest:
    model: str  # as the policy wrote it; resolved through the registry
    query: str


@dataclass
class PoolResult:
    ok: bool
    text: str | None
    prompt_tokens: int
    completion_tokens: int
    cost_usd: float  # the reference's: completion tokens at the output price (ModelSpec.output_cost)
    latency_s: float
    error: str | None  # one of ERROR_KINDS when not ok
    attempts: int  # HTTP calls made (0 for a cache hit or an unknown model)
    cached: bool
    model: str | None  # canonical pool name, None if the name resolved to nothing
    cut: bool = False  # the text was cut at ReplyLimits.max_chars
    usage_capped: bool = False  # the reported usage was more than the call could use; counted at that bound
    # the server's own time for the answered attempt, when it says (our pool server's X-Latency-S, OpenAI's
    # openai-processing-ms); latency_s is the client's: waiting for a slot, every attempt and the backoff between
    server_s: float | None = None
    billed_usd: float = 0.0  # as the API bills it: prompt tokens (all the call sends) at the input price too

    @classmethod
    def failure(cls, error: str, *, model: str | None, attempts: int, latency_s: float) -> "PoolResult":
        return cls(ok=False, text=None, prompt_tokens=0, completion_tokens=0, cost_usd=0.0,
                   latency_s=latency_s, error=error, attempts=attempts, cached=False, model=model)


def backoff_delay(retry: int, base_s: float, max_s: float, rng: random.Random) -> float:
    """Full jitter: uniform in [0, min(max_s, base_s * 2**retry)] for the retry-th retry (0-based)."""
    return rng.uniform(0.0, min(max_s, base_s * (2.0 ** retry)))


def server_time_s(headers) -> float | None:
    """The server's own time for a reply, from X-Latency-S (s) or openai-processing-ms; None when it says neither."""
    for name, scale in (("x-latency-s", 1.0), ("openai-processing-ms", 1e-3)):
        try:
            value = float(headers.get(name)) * scale
        except (TypeError, ValueError):
            continue
        if math.isfinite(value) and value >= 0:
            return value
    return None


def retry_after_s(exc: BaseException) -> float | None:
    """Seconds asked for by a Retry-After (or retry-after-ms) header, if the error carries one."""
    response = getattr(exc, "response", None)
    if response is None:
        return None
    headers = response.headers
    ms = headers.get("retry-after-ms")
    if ms is not None:
        try:
            return max(0.0, float(ms) / 1000.0)
        except ValueError:
            pass
    value = headers.get("retry-after")
    if value is None:
        return None
    try:
        return max(0.0, float(value))
    except ValueError:
        pass
    try:  # the HTTP-date form
        when = email.utils.parsedate_to_datetime(value)
    except (TypeError, ValueError):
        return None
    return max(0.0, when.timestamp() - time.time())


def classify(exc: BaseException) -> str:
    """Error kind of an SDK exception (or of our own per-call TimeoutError)."""
    if isinstance(exc, openai.RateLimitError):
        return "rate_limit"
    if isinstance(exc, openai.APIStatusError):
        if exc.status_code >= 500:
            return "server_error"
        if exc.status_code in (401, 403):
            return "auth"
        if exc.status_code == 408:
            return "timeout"
        return "bad_response"  # 400, 404, 422, ...: resending the same request will not help
    if isinstance(exc, (openai.APITimeoutError, TimeoutError)):
        return "timeout"
    if isinstance(exc, openai.APIConnectionError):
        return "connection"
    if isinstance(exc, ReplyTooLarge):
        return "too_large"
    if isinstance(exc, httpx2.TimeoutException):  # raised while reading the body
        return "timeout"
    if isinstance(exc, httpx2.TransportError):  # e.g. the connection closed inside the body
        return "connection"
    return "bad_response"  # APIResponseValidationError, an undecodable body and other malformed replies


def _is_count(x: object) -> bool:
    return isinstance(x, int) and not isinstance(x, bool) and x >= 0


def parse_completion(body: bytes) -> tuple[str, int, int, bool] | None:
    """(text, prompt_tokens, completion_tokens, had_usage) from a chat.completion body, None if it is not
    UTF-8 JSON of that shape (RFC 8259 asks for UTF-8; nesting too deep or a number too long counts as malformed)."""
    try:
        doc = json.loads(body.decode("utf-8"))
    except (ValueError, RecursionError):  # UnicodeDecodeError and JSONDecodeError are ValueErrors
        return None
    choices = doc.get("choices") if isinstance(doc, dict) else None
    if not isinstance(choices, list) or not choices or not isinstance(choices[0], dict):
        return None
    message = choices[0].get("message")
    text = message.get("content") if isinstance(message, dict) else None
    if not isinstance(text, str):
        return None
    text = clean_text(text)
    usage = doc.get("usage")
    if usage is None:
        return text, 0, 0, False
    pt, ct = (usage.get("prompt_tokens"), usage.get("completion_tokens")) if isinstance(usage, dict) else (None, None)
    if not (_is_count(pt) and _is_count(ct)):
        return None
    return text, pt, ct, True


class _LoopState:
    """SDK clients and semaphores are bound to the event loop that first uses them."""

    def __init__(self):
        self.clients: dict[tuple[str, str], openai.AsyncOpenAI] = {}
        self.slots: dict[str, asyncio.Semaphore] = {}


class PoolClient:
    """Calls pool models for routed sub-questions; see the module docstring for the failure contract."""

    def __init__(self, registry: ModelRegistry, *, max_concurrency_per_endpoint: int = 32,
                 timeout_s: float = 30.0, max_retries: int = 4, backoff_base_s: float = 0.5,
                 backoff_max_s: float = 8.0, deadline_s: float = 120.0, cache_dir: str | None = None,
                 messages_fn: Callable[[str], list[dict[str, str]]] = submodel_messages,
                 seed: int | None = None, limits: ReplyLimits = ReplyLimits()):
        if max_concurrency_per_endpoint < 1:
            raise ValueError(f"max_concurrency_per_endpoint must be >= 1, got {max_concurrency_per_endpoint}")
        if timeout_s <= 0 or deadline_s <= 0:
            raise ValueError(f"timeout_s and deadline_s must be > 0, got {timeout_s}, {deadline_s}")
        if max_retries < 0 or backoff_base_s < 0 or backoff_max_s < 0:
            raise ValueError("max_retries, backoff_base_s and backoff_max_s must be >= 0")
        self.registry = registry
        self.max_concurrency_per_endpoint = max_concurrency_per_endpoint
        self.timeout_s = timeout_s
        self.max_retries = max_retries
        self.backoff_base_s = backoff_base_s
        self.backoff_max_s = backoff_max_s
        self.deadline_s = deadline_s
        self.messages_fn = messages_fn
        self.limits = limits
        self.seed = seed  # sent to the endpoint as the sampling seed; part of the cache key
        self.cache = ResponseCache(cache_dir) if cache_dir else None
        self._rng = random.Random(seed)
        self._lock = threading.Lock()
        self._states: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()  # loop -> _LoopState
        self._warned_no_usage: set[str] = set()
        self._warned_usage: set[str] = set()
        self._loop: asyncio.AbstractEventLoop | None = None  # private loop behind the sync route()
        self._thread: threading.Thread | None = None

    # ---- async API -------------------------------------------------------------------

    async def route_batch(self, reqs: Iterable[RouteRequest]) -> list[PoolResult]:
        """All requests concurrently, results in request order, one deadline for the whole batch."""
        deadline_at = time.monotonic() + self.deadline_s
        tasks = [asyncio.ensure_future(self.route_one(r, deadline_at)) for r in reqs]
        try:
            return list(await asyncio.gather(*tasks))
        except BaseException:  # only a bug in our code (or cancellation) gets here: stop the rest
            for t in tasks:
                t.cancel()
            raise

    async def route_one(self, req: RouteRequest, deadline_at: float | None = None) -> PoolResult:
        """One pool call with retries; `deadline_at` is a time.monotonic() instant (default now + deadline_s)."""
        t0 = time.monotonic()
        if deadline_at is None:
            deadline_at = t0 + self.deadline_s
        spec = self.registry.resolve(req.model)
        if spec is None:
            return PoolResult.failure("unknown_model", model=None, attempts=0, latency_s=0.0)
        messages = self.messages_fn(req.query)

        key = None
        if self.cache is not None:
            key = cache_key(spec.api_id, messages, spec.temperature, spec.max_tokens, self.seed)
            hit = self.cache.get(key)
            if hit is not None:
                # Cost from the stored tokens at the registry price: a re-run reports the same cost. The
                # limits apply again: the file may predate them, or have been written under others.
                return self._result(spec, messages, (hit.text, hit.prompt_tokens, hit.completion_tokens, True),
                                    attempts=0, t0=t0, cached=True, cut=hit.cut)

        api_key = spec.api_key()
        client, slots = self._endpoint(spec, api_key)
        attempts = 0
        while True:
            try:
                async with asyncio.timeout(max(0.0, deadline_at - time.monotonic())) as whole:
                    async with slots:  # waiting for a slot counts against the deadline too
                        attempts += 1
                        async with asyncio.timeout(self.timeout_s):
                            body, server_s = await self._create(client, spec, messages)
            # httpx2's errors come from reading the body ourselves; the SDK wraps those of the request.
            except (openai.APIError, httpx2.HTTPError, ReplyTooLarge, TimeoutError) as e:
                if whole.expired():
                    return self._give_up(spec, "deadline", attempts, t0, e, api_key)
                err, kind = e, classify(e)
            else:
                parsed = parse_completion(body)
                if parsed is None:
                    return self._give_up(spec, "bad_response", attempts, t0, None, api_key)
                result = self._success(spec, messages, parsed, attempts, t0, key)
                result.server_s = server_s
                return result

            if kind not in RETRYABLE or attempts > self.max_retries:
                return self._give_up(spec, kind, attempts, t0, err, api_key)
            delay = backoff_delay(attempts - 1, self.backoff_base_s, self.backoff_max_s, self._rng)
            asked = retry_after_s(err)
            if asked is not None:
                delay = min(asked, self.backoff_max_s)
            if time.monotonic() + delay >= deadline_at:
                return self._give_up(spec, "deadline", attempts, t0, err, api_key)
            log.debug("pool %s: attempt %d failed (%s); retrying in %.2fs", spec.name, attempts, kind, delay)
            await asyncio.sleep(delay)

    async def _create(self, client: openai.AsyncOpenAI, spec: ModelSpec,
                      messages: list[dict[str, str]]) -> tuple[bytes, float | None]:
        """The reply body of one attempt and the server's time for it; ReplyTooLarge as soon as the body passes
        limits.max_bytes."""
        extra = {} if self.seed is None else {"seed": self.seed}
        async with client.chat.completions.with_streaming_response.create(
                model=spec.api_id, messages=messages, temperature=spec.temperature,
                max_tokens=spec.max_tokens, timeout=self.timeout_s, **extra) as resp:
            body = bytearray()
            async for chunk in resp.iter_bytes():
                body += chunk
                if len(body) > self.limits.max_bytes:  # leaving the block drops the rest unread
                    raise ReplyTooLarge(f"reply body over {self.limits.max_bytes} bytes (env.max_reply_bytes)")
        return bytes(body), server_time_s(resp.headers)

    def _success(self, spec: ModelSpec, messages: list[dict[str, str]], parsed: tuple[str, int, int, bool],
                 attempts: int, t0: float, key: str | None) -> PoolResult:
        had_usage = parsed[3]
        if not had_usage and spec.name not in self._warned_no_usage:
            self._warned_no_usage.add(spec.name)
            log.warning("pool %s: reply without usage; counting 0 tokens and cost 0", spec.name)
        result = self._result(spec, messages, parsed, attempts=attempts, t0=t0, cached=False, cut=False)
        if key is not None:
            self.cache.put(key, CachedReply(result.text, result.prompt_tokens, result.completion_tokens, result.cut))
        return result

    def _result(self, spec: ModelSpec, messages: list[dict[str, str]], parsed: tuple[str, int, int, bool], *,
                attempts: int, t0: float, cached: bool, cut: bool) -> PoolResult:
        """An ok result within the limits: text cut at max_chars, usage bounded by what the call could use."""
        text, pt, ct, _ = parsed
        if len(text) > self.limits.max_chars:
            text, cut = text[:self.limits.max_chars], True
        # A server writes at most the max_tokens asked for, and reads about one token per byte sent at most.
        # The reply's length is no bound: reasoning models are billed for tokens they do not return.
        pt_max = sum(len(str(m.get("content", "")).encode("utf-8")) for m in messages) + PROMPT_TEMPLATE_TOKENS
        capped = pt > pt_max or ct > spec.max_tokens
        if capped:
            if spec.name not in self._warned_usage:
                self._warned_usage.add(spec.name)
                log.warning("pool %s: reply claims usage of %d prompt + %d completion tokens, more than the call "
                            "could use; counting at most %d + %d (max_tokens)", spec.name, pt, ct, pt_max,
                            spec.max_tokens)
            pt, ct = min(pt, pt_max), min(ct, spec.max_tokens)
        return PoolResult(ok=True, text=text, prompt_tokens=pt, completion_tokens=ct, cost_usd=spec.output_cost(ct),
                          billed_usd=spec.cost(pt, ct),
                          latency_s=time.monotonic() - t0, error=None, attempts=attempts, cached=cached,
                          model=spec.name, cut=cut, usage_capped=capped)

    def _give_up(self, spec: ModelSpec, kind: str, attempts: int, t0: float, exc: BaseException | None,
                 api_key: str) -> PoolResult:
        detail = "" if exc is None else f"{type(exc).__name__}: {exc}"
        detail = redact(detail, api_key)  # a server might echo the header back, also encoded or re-cased
        detail = detail[:300]  # after redacting: a key across the cut would keep its first characters
        log.warning("pool %s: giving up after %d attempt(s): %s %s", spec.name, attempts, kind, detail)
        return PoolResult.failure(kind, model=spec.name, attempts=attempts, latency_s=time.monotonic() - t0)

    def _endpoint(self, spec: ModelSpec, api_key: str) -> tuple[openai.AsyncOpenAI, asyncio.Semaphore]:
        loop = asyncio.get_running_loop()
        with self._lock:
            state = self._states.get(loop)
            if state is None:
                state = self._states[loop] = _LoopState()
        client = state.clients.get((spec.base_url, api_key))
        if client is None:
            # SDK retries off: the retry policy (and its deadline) is ours alone.
            client = openai.AsyncOpenAI(base_url=spec.base_url, api_key=api_key, max_retries=0,
                                        timeout=self.timeout_s)
            state.clients[(spec.base_url, api_key)] = client
        slots = state.slots.get(spec.base_url)
        if slots is None:
            slots = state.slots[spec.base_url] = asyncio.Semaphore(self.max_concurrency_per_endpoint)
        return client, slots

    async def aclose(self) -> None:
        """Close the HTTP clients this PoolClient opened on the running loop."""
        with self._lock:
            state = self._states.pop(asyncio.get_running_loop(), None)
        if state is not None:
            for client in state.clients.values():
                await client.close()

    async def __aenter__(self) -> "PoolClient":
        return self

    async def __aexit__(self, *exc) -> None:
        await self.aclose()

    # ---- sync API --------------------------------------------------------------------

    def route(self, reqs: Iterable[RouteRequest]) -> list[PoolResult]:
        """Blocking route_batch; runs on a private loop thread, so it works inside a running loop too."""
        return self.run(self.route_batch(list(reqs)))

    def run(self, coro):
        """Run a coroutine that uses this client on its private loop thread and wait for it."""
        loop = self._private_loop()
        try:
            running = asyncio.get_running_loop()
        except RuntimeError:
            running = None
        if running is loop:
            coro.close()
            raise RuntimeError("PoolClient.run()/route() called from its own loop; await the coroutine instead")
        return asyncio.run_coroutine_threadsafe(coro, loop).result()

    def submit(self, coro) -> "concurrent.futures.Future":
        """Start a coroutine that uses this client on its private loop thread; its future, not waited for."""
        return asyncio.run_coroutine_threadsafe(coro, self._private_loop())

    def _private_loop(self) -> asyncio.AbstractEventLoop:
        with self._lock:
            if self._loop is None:
                self._loop = asyncio.new_event_loop()
                self._thread = threading.Thread(target=self._loop.run_forever, name="pool-client", daemon=True)
                self._thread.start()
            return self._loop

    def close(self) -> None:
        """Stop the private loop of route() and close its HTTP clients; the client stays usable."""
        with self._lock:
            loop, thread = self._loop, self._thread
            self._loop = self._thread = None
        if loop is None:
            return
        asyncio.run_coroutine_threadsafe(self.aclose(), loop).result()
        loop.call_soon_threadsafe(loop.stop)
        thread.join()
        loop.close()

    def __enter__(self) -> "PoolClient":
        return self

    def __exit__(self, *exc) -> None:
        self.close()
