"""PoolClient against a real scripted OpenAI-compatible aiohttp server on 127.0.0.1."""
from __future__ import annotations

import asyncio
import json
import logging
import random
import socket
import threading
import time
from collections import Counter
from dataclasses import asdict

import httpx2
import openai
import pytest
from aiohttp import web

from router_r1.pool.cache import cache_key
from router_r1.pool.client import (PoolClient, PoolResult, ReplyLimits, RouteRequest, backoff_delay,
                                    retry_after_s)
from router_r1.pool.registry import ModelRegistry
from router_r1.pool.messages import submodel_messages

KEY = "sk-test-7f3a9c-do-not-leak"


class ScriptedServer:
    """/v1/chat/completions whose behaviour depends on the requested api id; counts calls and in-flight."""

    def __init__(self, every: str | None = None):
        self.calls: Counter[str] = Counter()
        self.inflight = 0
        self.max_inflight = 0
        self.every = every  # a HOSTILE reply for every model, whatever its api id

    async def handle(self, request: web.Request) -> web.Response:
        body = await request.json()
        model, query = body["model"], body["messages"][-1]["content"]
        self.calls[model] += 1
        n = self.calls[model]
        self.inflight += 1
        self.max_inflight = max(self.max_inflight, self.inflight)
        try:
            if self.every is None and request.headers.get("Authorization") != f"Bearer {KEY}":
                return _error(401, "bad key")
            if model == "slow":
                await asyncio.sleep(0.05)
            if model == "flaky" and n <= 2:
                return _error(429, "slow down", {"Retry-After": "0.1"})
            if model == "limited":
                return _error(429, "slow down", {"Retry-After": "5"})  # the client caps this
            if model == "down":
                return _error(500, "boom")
            if model == "missing":
                return _error(404, "no such model")
            if model == "hang":
                await asyncio.sleep(30)  # cancelled when the client gives up (handler_cancellation)
            if model == "garbage":
                return web.Response(text="<html>not json", content_type="application/json")
            hostile = HOSTILE.get(self.every or model)
            if hostile is not None:
                return await hostile(request, query)
            if model == "surrogate":  # valid JSON holding lone UTF-16 surrogates (and a good pair)
                body = ('{"id": "x", "object": "chat.completion", "created": 0, "model": "surrogate", "choices": '
                        '[{"index": 0, "finish_reason": "stop", "message": {"role": "assistant", "content": '
                        '"Paris \\ud800 is \\udfff\\ud83d\\ude00 <answer>x</answer>"}}], '
                        '"usage": {"prompt_tokens": 3, "completion_tokens": 4, "total_tokens": 7}}')
                return web.Response(text=body, content_type="application/json")
            reply = {"id": "x", "object": "chat.completion", "created": 0, "model": model,
                     "choices": [{"index": 0, "finish_reason": "stop",
                                  "message": {"role": "assistant", "content": f"echo:{query}"}}]}
            if model != "nousage":
                reply["usage"] = {"prompt_tokens": 10 + len(query), "completion_tokens": 2 * len(query),
                                  "total_tokens": 10 + 3 * len(query)}
            return web.json_response(reply)
        finally:
            self.inflight -= 1

    def __enter__(self) -> "ScriptedServer":
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self.thread.start()
        asyncio.run_coroutine_threadsafe(self._start(), self.loop).result()
        return self

    async def _start(self):
        app = web.Application()
        app.router.add_post("/v1/chat/completions", self.handle)
        app.router.add_get("/v1/models", _no_models)
        self.runner = web.AppRunner(app, handler_cancellation=True, shutdown_timeout=0.1, access_log=None)
        await self.runner.setup()
        await web.TCPSite(self.runner, "127.0.0.1", 0).start()
        self.url = f"http://127.0.0.1:{self.runner.addresses[0][1]}/v1"

    def __exit__(self, *exc):
        asyncio.run_coroutine_threadsafe(self.runner.cleanup(), self.loop).result()
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join()
        self.loop.close()


def _completion(content: str, usage: str = '{"prompt_tokens": 3, "completion_tokens": 4}') -> str:
    """A chat.completion body as text, so a test can put anything in it."""
    return ('{"id": "x", "object": "chat.completion", "created": 0, "model": "m", "choices": [{"index": 0, '
            '"finish_reason": "stop", "message": {"role": "assistant", "content": ' + json.dumps(content) + '}}], '
            '"usage": ' + usage + '}')


async def _raw(body: bytes) -> web.Response:
    return web.Response(body=body, content_type="application/json")


async def _drip(request: web.Request, query: str) -> web.StreamResponse:
    """Headers at once, then a body that never finishes (one byte every 50 ms)."""
    resp = web.StreamResponse(headers={"Content-Type": "application/json"})
    await resp.prepare(request)
    for _ in range(2000):
        await resp.write(b" ")
        await asyncio.sleep(0.05)
    return resp


# Replies of a hostile or broken endpoint, by api id (hostile-client, issue 29).
HOSTILE = {
    "latin1": lambda r, q: _raw(_completion("caf\u00e9").replace("\\u00e9", "\u00e9").encode("latin-1")),
    "deep": lambda r, q: _raw(b'{"choices": ' + b"[" * 100_000 + b"]" * 100_000 + b"}"),
    "bignum": lambda r, q: _raw(_completion("ok", '{"prompt_tokens": ' + "9" * 5000 + ', "completion_tokens": 1}')
                                .encode()),
    "huge": lambda r, q: _raw(_completion("A" * 10_000_000).encode()),
    "long": lambda r, q: _raw(_completion("B" * 50_000).encode()),
    "bigusage": lambda r, q: _raw(_completion("four", '{"prompt_tokens": ' + str(10**30) + ', "completion_tokens": '
                                                      + str(10**30) + '}').encode()),
    "leaky": lambda r, q: _error_async(500, "x" * 251 + r.headers["Authorization"].split()[-1] + " echoed"),
    "mangler": lambda r, q: _error_async(500, _mangled(r.headers["Authorization"])),
    "drip": _drip,
}


def _mangled(header: str) -> str:
    """The Authorization header's key echoed in the forms a careless server might use."""
    import base64
    key = header.split()[-1]
    return " | ".join([key.upper(), key.lower(), key[::-1], key.title(), base64.b64encode(header.encode()).decode(),
                       base64.b64encode(("user:" + key).encode()).decode(), base64.urlsafe_b64encode(key.encode()).decode(),
                       key.encode().hex()])


async def _no_models(request: web.Request) -> web.Response:
    return web.json_response({"object": "list", "data": []})


async def _error_async(status: int, message: str) -> web.Response:
    return _error(status, message)


def _error(status: int, message: str, headers: dict | None = None) -> web.Response:
    return web.json_response({"error": {"message": message, "type": "test", "code": str(status)}},
                             status=status, headers=headers)


MODELS = ["echo", "slow", "flaky", "limited", "down", "missing", "hang", "garbage", "nousage", "surrogate",
          *HOSTILE]


def make_registry(url: str) -> ModelRegistry:
    models = [{"name": f"{m.capitalize()}-Model", "api_id": m} for m in MODELS]
    models.append({"name": "Denied-Model", "api_id": "echo", "api_key_env": "ROUTER_TEST_WRONG_KEY"})
    return ModelRegistry.from_dict({
        "defaults": {"base_url": url, "api_key_env": "ROUTER_TEST_KEY", "price_out_per_m": 2.0,
                     "price_in_per_m": 1.0, "max_tokens": 256},
        "models": models,
    })


@pytest.fixture
def server(monkeypatch):
    monkeypatch.setenv("ROUTER_TEST_KEY", KEY)
    monkeypatch.setenv("ROUTER_TEST_WRONG_KEY", "sk-wrong")
    with ScriptedServer() as srv:
        yield srv


def fast_client(srv, **kw) -> PoolClient:
    opts = dict(timeout_s=5.0, max_retries=3, backoff_base_s=0.01, backoff_max_s=0.05, deadline_s=10.0, seed=0)
    opts.update(kw)
    return PoolClient(make_registry(srv.url), **opts)


def test_ok_results_in_order_with_cost(server):
    queries = [f"question {i}: what is {i}+{i}? at 10:30" for i in range(6)]
    with fast_client(server) as client:
        res = client.route([RouteRequest("echo model", q) for q in queries])  # name normalised
    for q, r in zip(queries, res):
        assert r.ok and r.error is None and not r.cached and r.attempts == 1
        assert r.text == f"echo:{q}" and r.model == "Echo-Model"
        assert (r.prompt_tokens, r.completion_tokens) == (10 + len(q), 2 * len(q))
        assert r.cost_usd == pytest.approx(2 * len(q) * 2.0 / 1e6)  # the reference's: output tokens only
        assert r.billed_usd == pytest.approx((2 * len(q) * 2.0 + (10 + len(q)) * 1.0) / 1e6)  # the prompt too


def test_rate_limit_retried_honouring_retry_after(server):
    with fast_client(server, backoff_base_s=0.0, backoff_max_s=1.0) as client:  # only Retry-After (0.1 s) waits
        t0 = time.monotonic()
        [r] = client.route([RouteRequest("Flaky-Model", "q")])
        elapsed = time.monotonic() - t0
    assert r.ok and r.attempts == 3 and server.calls["flaky"] == 3
    assert elapsed >= 0.2


def test_persistent_500_is_server_error_after_max_retries(server):
    with fast_client(server, max_retries=2) as client:
        [r] = client.route([RouteRequest("Down-Model", "q")])
    assert (r.ok, r.error, r.text, r.cost_usd, r.attempts) == (False, "server_error", None, 0.0, 3)
    assert server.calls["down"] == 3


def test_hang_times_out(server):
    with fast_client(server, timeout_s=0.2, max_retries=1) as client:
        [r] = client.route([RouteRequest("Hang-Model", "q")])
    assert (r.ok, r.error, r.attempts) == (False, "timeout", 2)


def test_batch_returns_by_deadline(server):
    deadline = 0.5
    reqs = [RouteRequest("Hang-Model", f"q{i}") for i in range(6)] + [RouteRequest("Echo-Model", "fast")]
    with fast_client(server, timeout_s=10.0, deadline_s=deadline) as client:
        res = client.route(reqs)
    # "deadline", not "timeout": the batch deadline cut the hangs, well before their 10 s request timeout
    assert [r.error for r in res[:6]] == ["deadline"] * 6
    assert res[6].ok and res[6].text == "echo:fast"


def test_total_sleep_bounded_by_deadline_not_reference_5s_x_500(server):
    # The reference slept 5 s up to 500 times; here Retry-After: 5 is capped and the deadline wins.
    with fast_client(server, max_retries=500, backoff_max_s=0.05, deadline_s=0.6) as client:
        [r] = client.route([RouteRequest("Limited-Model", "q")])
    assert r.error == "deadline" and not r.ok
    assert r.attempts >= 3  # an uncapped 5 s Retry-After would have allowed a single attempt


def test_backoff_is_bounded_exponential_full_jitter():
    rng = random.Random(0)
    for retry in range(8):
        cap = min(1.0, 0.1 * 2 ** retry)
        draws = [backoff_delay(retry, 0.1, 1.0, rng) for _ in range(200)]
        assert all(0.0 <= d <= cap for d in draws)
        assert max(draws) > 0.8 * cap and min(draws) < 0.2 * cap  # spread over the whole range


def test_retry_after_header_forms():
    def err(headers):
        resp = httpx2.Response(429, headers=headers, request=httpx2.Request("POST", "http://127.0.0.1/v1"))
        return openai.RateLimitError("slow", response=resp, body=None)
    assert retry_after_s(err({"Retry-After": "2.5"})) == 2.5
    assert retry_after_s(err({"retry-after-ms": "250"})) == 0.25
    assert retry_after_s(err({})) is None
    assert retry_after_s(err({"Retry-After": "Wed, 21 Oct 2015 07:28:00 GMT"})) == 0.0  # in the past
    assert retry_after_s(err({"Retry-After": "soon"})) is None


def test_no_retry_on_auth_or_404(server):
    with fast_client(server) as client:
        denied, missing = client.route([RouteRequest("Denied-Model", "q"), RouteRequest("Missing-Model", "q")])
    assert (denied.error, denied.attempts) == ("auth", 1)
    assert (missing.error, missing.attempts) == ("bad_response", 1)
    assert server.calls["missing"] == 1


def test_unknown_model_makes_no_http_call(server):
    with fast_client(server) as client:
        [r] = client.route([RouteRequest("GPT-9-Ultra", "q")])
    assert (r.ok, r.error, r.model, r.attempts, r.text, r.cost_usd) == (False, "unknown_model", None, 0, None, 0.0)
    assert sum(server.calls.values()) == 0


def test_missing_usage_is_ok_with_zero_cost(server, caplog):
    with fast_client(server) as client, caplog.at_level(logging.WARNING):
        [r] = client.route([RouteRequest("Nousage-Model", "q")])
    assert r.ok and r.text == "echo:q" and (r.prompt_tokens, r.completion_tokens, r.cost_usd) == (0, 0, 0.0)
    assert "without usage" in caplog.text


def test_garbage_reply_is_bad_response(server):
    with fast_client(server) as client:
        [r] = client.route([RouteRequest("Garbage-Model", "q")])
    assert (r.ok, r.error, r.attempts) == (False, "bad_response", 1)


def test_connection_refused_is_connection_error(server):
    with socket.socket() as s:  # a port that nothing listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    reg = ModelRegistry.from_dict({"models": [{"name": "Gone", "api_id": "echo", "price_out_per_m": 1.0,
                                               "base_url": f"http://127.0.0.1:{port}/v1"}]})
    with PoolClient(reg, max_retries=2, backoff_base_s=0.01, backoff_max_s=0.02, deadline_s=5.0) as client:
        [r] = client.route([RouteRequest("Gone", "q")])
    assert (r.ok, r.error, r.attempts) == (False, "connection", 3)


def test_cache_second_run_makes_no_http_calls(server, tmp_path):
    reqs = [RouteRequest("Echo-Model", f"q{i}") for i in range(4)] + [RouteRequest("Down-Model", "q")]
    with fast_client(server, cache_dir=tmp_path, max_retries=0) as client:
        first = client.route(reqs)
    calls_after_first = server.calls.copy()
    with fast_client(server, cache_dir=tmp_path, max_retries=0) as client:
        second = client.route(reqs)
    assert server.calls["echo"] == calls_after_first["echo"] == 4  # all hits
    assert server.calls["down"] == 2  # failures are not cached
    same = ("ok", "text", "prompt_tokens", "completion_tokens", "cost_usd", "error", "model")
    for a, b in zip(first[:4], second[:4]):
        assert [getattr(a, f) for f in same] == [getattr(b, f) for f in same]
        assert not a.cached and b.cached and b.attempts == 0
    assert second[4].error == "server_error" and not second[4].cached


def test_corrupt_cache_file_is_ignored_with_warning(server, tmp_path, caplog):
    spec = make_registry(server.url)["Echo-Model"]
    key = cache_key(spec.api_id, submodel_messages("q"), spec.temperature, spec.max_tokens, 0)
    path = tmp_path / key[:2] / f"{key}.json"
    path.parent.mkdir(parents=True)
    path.write_text("{truncated")
    with fast_client(server, cache_dir=tmp_path) as client, caplog.at_level(logging.WARNING):
        [r] = client.route([RouteRequest("Echo-Model", "q")])
    assert r.ok and not r.cached and server.calls["echo"] == 1
    assert str(path) in caplog.text
    assert json.loads(path.read_text())["text"] == "echo:q"  # rewritten by the successful call


def test_concurrency_per_endpoint_is_bounded(server):
    with fast_client(server, max_concurrency_per_endpoint=3) as client:
        res = client.route([RouteRequest("Slow-Model", f"q{i}") for i in range(12)])
    assert all(r.ok for r in res)
    assert server.max_inflight == 3


def test_api_key_not_leaked(server, tmp_path, caplog):
    with fast_client(server, cache_dir=tmp_path, max_retries=0) as client, caplog.at_level(logging.DEBUG):
        res = client.route([RouteRequest("Echo-Model", "q"), RouteRequest("Down-Model", "q")])
    assert res[0].ok  # the server checked the key, so it was sent
    for r in res:
        assert KEY not in repr(r) and KEY not in json.dumps(asdict(r))
    files = list(tmp_path.rglob("*"))
    assert any(f.suffix == ".json" for f in files)
    for f in files:
        if f.is_file():
            assert KEY not in f.read_text()
    assert KEY not in caplog.text


def test_sync_route_works_inside_running_loop(server):
    client = fast_client(server)

    async def caller():  # e.g. a notebook or an async trainer calling the sync API
        return client.route([RouteRequest("Echo-Model", "inside")])

    try:
        [r] = asyncio.run(caller())
    finally:
        client.close()
    assert r.ok and r.text == "echo:inside"


def test_async_api_on_callers_loop(server):
    async def main():
        async with fast_client(server) as client:
            batch = await client.route_batch([RouteRequest("Echo-Model", "a"), RouteRequest("nope", "b")])
            one = await client.route_one(RouteRequest("Echo-Model", "c"))
        return batch, one

    (a, b), c = asyncio.run(main())
    assert a.text == "echo:a" and b.error == "unknown_model" and c.text == "echo:c"
    assert isinstance(c, PoolResult)


def test_bug_in_our_code_surfaces(server):
    def broken_messages(query):
        return query.no_such_method()

    with fast_client(server, messages_fn=broken_messages) as client:
        with pytest.raises(AttributeError):
            client.route([RouteRequest("Echo-Model", "q")])


def test_lone_surrogates_in_a_reply_are_cleaned_where_they_enter(server, tmp_path):
    from router_r1.eval.report import write_jsonl
    from router_r1.episodes.episode import Episode, TurnRules
    from tiny import tiny_tokenizer

    with fast_client(server, cache_dir=str(tmp_path / "cache")) as client:
        r, = client.route([RouteRequest("Surrogate-Model", "capital of France?")])
        cached, = client.route([RouteRequest("Surrogate-Model", "capital of France?")])
    assert r.ok and r.text == "Paris \ufffd is \ufffd\U0001F600 <answer>x</answer>"  # the good pair kept
    assert cached.cached and cached.text == r.text
    r.text.encode("utf-8")  # strict: raises on a surrogate
    # what crashed before: the rollout's tokenizer (via after_pool) and the evaluation report
    tok = tiny_tokenizer()
    rules = TurnRules(tok, make_registry(server.url), max_turns=2, max_obs_length=64, max_response_length=512)
    ep = Episode(prompt_ids=[1])
    ep.turns.append({})
    rules.after_pool(ep, r)
    assert "Paris" in ep.text and ep.response_ids
    write_jsonl(tmp_path / "t.jsonl", [{"text": ep.text, "turns": ep.turns}])
    assert "\ufffd" in (tmp_path / "t.jsonl").read_text(encoding="utf-8")


# ---- a hostile endpoint: every reply is an observation, never an exception (issue 29) ----

@pytest.mark.parametrize("model", ["Latin1-Model", "Deep-Model", "Bignum-Model"])
def test_an_undecodable_reply_is_a_failed_call(server, model):
    # not UTF-8 / 100,000 levels of JSON / a 5,000-digit number: UnicodeDecodeError, RecursionError and
    # ValueError escaped the client before, crashing a rollout, an evaluation and the router server
    with fast_client(server) as client:
        r, ok = client.route([RouteRequest(model, "q"), RouteRequest("Echo-Model", "q")])
    assert (r.ok, r.error, r.attempts, r.text, r.cost_usd) == (False, "bad_response", 1, None, 0.0)
    assert ok.ok and ok.text == "echo:q"  # the rest of the batch is untouched


def test_a_huge_reply_is_not_read_past_the_byte_cap(server):
    with fast_client(server, limits=ReplyLimits(max_chars=1000, max_bytes=100_000)) as client:
        [r] = client.route([RouteRequest("Huge-Model", "q")])
    assert (r.ok, r.error, r.attempts, r.text) == (False, "too_large", 1, None)


def test_a_long_reply_is_cut_and_says_so(server, tmp_path):
    with fast_client(server, limits=ReplyLimits(max_chars=1000), cache_dir=tmp_path) as client:
        r, = client.route([RouteRequest("Long-Model", "q")])
        hit, = client.route([RouteRequest("Long-Model", "q")])
        short, = client.route([RouteRequest("Echo-Model", "q")])
    assert r.ok and r.cut and r.text == "B" * 1000
    assert hit.cached and hit.cut and hit.text == r.text  # the cache keeps the mark
    assert short.ok and not short.cut


def test_a_reply_that_never_finishes_ends_at_the_call_timeout(server):
    with fast_client(server, timeout_s=0.3, max_retries=0) as client:
        [r] = client.route([RouteRequest("Drip-Model", "q")])
    assert (r.ok, r.error, r.attempts) == (False, "timeout", 1)  # the body would drip for 100 s


def test_absurd_usage_is_bounded_by_the_request_and_flagged(server, caplog):
    with fast_client(server) as client, caplog.at_level(logging.WARNING):
        [r] = client.route([RouteRequest("Bigusage-Model", "q")])
        [fair] = client.route([RouteRequest("Echo-Model", "q")])
    spec = make_registry(server.url)["Bigusage-Model"]
    asked = sum(len(m["content"].encode()) for m in submodel_messages("q"))
    assert r.ok and r.text == "four" and r.usage_capped
    assert r.completion_tokens == spec.max_tokens  # the server cannot write more than was asked
    assert asked < r.prompt_tokens <= asked + 1024  # nor read much more than was sent
    assert r.billed_usd == pytest.approx(spec.cost(r.prompt_tokens, r.completion_tokens)) and r.billed_usd < 0.01
    assert not fair.usage_capped and fair.completion_tokens == 2
    assert "usage" in caplog.text and "Bigusage-Model" in caplog.text


def test_a_key_echoed_across_the_cut_of_the_error_text_does_not_leak(server, caplog):
    # the detail is cut to 300 characters; the key starts at character 290, so cutting before
    # redacting left its first ten characters in the log
    with fast_client(server, max_retries=0) as client, caplog.at_level(logging.DEBUG):
        [r] = client.route([RouteRequest("Leaky-Model", "q")])
    assert r.error == "server_error"
    assert "giving up" in caplog.text and "xxxxx" in caplog.text
    assert KEY[:6] not in caplog.text


def test_a_key_echoed_encoded_re_cased_or_reversed_does_not_leak(server, caplog):
    """Issue 45.16: only the exact key was redacted; base64, upper-cased and reversed echoes reached the log."""
    import base64
    with fast_client(server, max_retries=0) as client, caplog.at_level(logging.DEBUG):
        [r] = client.route([RouteRequest("Mangler-Model", "q")])
    assert r.error == "server_error" and "giving up" in caplog.text and "***" in caplog.text
    text = caplog.text.lower()
    core = KEY[3:-3]  # each form's middle, which every encoding of it carries whatever the alignment
    for form in (core, core[::-1], core.encode().hex(), base64.b64encode(KEY.encode()).decode()[4:-8]):
        assert form.lower() not in text, form
    for prefix in ("", "B", "Be", "Bearer ", "user:"):  # base64 of the key behind any prefix
        enc = base64.b64encode((prefix + KEY).encode()).decode()
        assert enc[len(prefix) * 4 // 3 + 4:-8].lower() not in text, prefix


def test_cut_and_capped_calls_reach_the_turn_record_and_the_step_metrics(server):
    from router_r1.episodes.episode import Episode, TurnRules
    from router_r1.pool.health import PoolHealth
    from router_r1.router_env import make_env
    from tiny import tiny_tokenizer

    tok = tiny_tokenizer()
    shape = {"response_length": 64, "max_response_length": 4096}  # a run config links these to rollout.*
    env = make_env({**shape, "pool": "configs/pool/sim.yaml", "max_reply_chars": 1000, "max_reply_bytes": 70_000},
                   tok)
    env.client.close()
    assert env.client.limits == ReplyLimits(max_chars=1000, max_bytes=70_000)  # the env keys reach the client
    rules = TurnRules(tok, make_registry(server.url), max_turns=3, max_obs_length=64, max_response_length=4096)
    ep = Episode(prompt_ids=[1])
    with fast_client(server, limits=env.client.limits) as client:
        for model in ("Long-Model", "Bigusage-Model", "Echo-Model"):
            ep.turns.append({})
            rules.after_pool(ep, client.route([RouteRequest(model, "q")])[0])
    assert [(t["cut"], t["usage_capped"]) for t in ep.turns] == [(True, False), (False, True), (False, False)]
    metrics = PoolHealth().observe([ep.turns], validate=False)
    assert (metrics["pool/cut"], metrics["pool/usage_capped"]) == ([1.0], [1.0])


def test_an_evaluation_says_how_many_usage_blocks_it_capped(tmp_path, capsys):
    """Issue 45.16: capped usage was flagged per call and per training step, but not in an evaluation's summary."""
    from sim.qa import SimConfig, build_sim
    from router_r1.eval.evaluate import main as evaluate_main

    build_sim(SimConfig(out_dir=tmp_path / "data", train_size=1, val_size=1, test_size=4))
    with ScriptedServer(every="bigusage") as srv:
        code = evaluate_main(["--data", str(tmp_path / "data" / "test.parquet"), "--pool", "configs/pool/sim.yaml",
                              "--pool-url", srv.url, "--skip-router", "--baseline", "single:LLaMA-3.1-8B-Instruct",
                              "--out", str(tmp_path / "out")])
    assert code == 0, capsys.readouterr().err
    overall = json.loads((tmp_path / "out" / "summary.json").read_text())["runs"][0]["overall"]
    assert (overall["pool_calls"], overall["pool_usage_capped"], overall["pool_cut"]) == (4, 4, 0)


@pytest.mark.parametrize("reply", ["deep", "latin1"])
def test_an_evaluation_against_a_hostile_pool_reports_it_and_exits_3(tmp_path, capsys, reply):
    # before: exit 1 with a traceback, no summary and an empty trajectories file
    from sim.qa import SimConfig, build_sim
    from router_r1.eval.evaluate import main as evaluate_main

    build_sim(SimConfig(out_dir=tmp_path / "data", train_size=1, val_size=1, test_size=4))
    with ScriptedServer(every=reply) as srv:
        code = evaluate_main(["--data", str(tmp_path / "data" / "test.parquet"), "--pool", "configs/pool/sim.yaml",
                              "--pool-url", srv.url, "--skip-router", "--baseline", "single:LLaMA-3.1-8B-Instruct",
                              "--out", str(tmp_path / "out")])
    err = capsys.readouterr().err
    assert code == 3, err
    assert "4 of 4 pool calls failed (100%: bad_response 4)" in err and "Traceback" not in err
    overall = json.loads((tmp_path / "out" / "summary.json").read_text())["runs"][0]["overall"]
    assert overall["pool_errors"] == {"bad_response": 4}
    trajectories = list((tmp_path / "out").rglob("*.jsonl"))
    assert trajectories and all(len(f.read_text().splitlines()) == 4 for f in trajectories)
