"""The OpenAI-compatible pool server, exercised over real HTTP on 127.0.0.1."""
from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import aiohttp
import pytest

from router_r1.pool.server import FaultConfig, ServerThread, main
from sim.backend import SimBackend
from sim.world import count_tokens
from router_r1.pool.messages import submodel_messages

ROOT = Path(__file__).resolve().parents[1]
SIM_YAML = ROOT / "configs" / "pool" / "sim.yaml"
MODEL = "sim/llama-3.1-8b-instruct"


@pytest.fixture(scope="module")
def backend() -> SimBackend:
    return SimBackend.from_pool_yaml(SIM_YAML, seed=0, latency_scale=0.0)


def _body(query: str, model: str = MODEL, **extra) -> dict:
    return {"model": model, "messages": submodel_messages(query), "temperature": 0.0, "max_tokens": 512, **extra}


async def _post(session, url, json_body=None, data=None, headers=None, timeout=10.0):
    kw = {"json": json_body} if data is None else {"data": data}
    async with session.post(f"{url}/chat/completions", headers=headers or {},
                            timeout=aiohttp.ClientTimeout(total=timeout), **kw) as r:
        return r.status, await r.json(content_type=None), dict(r.headers)


def _run(coro):
    return asyncio.run(coro)


def test_models_endpoint_lists_the_pool_api_ids(backend):
    async def go(url):
        async with aiohttp.ClientSession() as s, s.get(f"{url}/models") as r:
            return r.status, await r.json()
    with ServerThread(backend) as srv:
        assert srv.url.startswith("http://127.0.0.1:") and srv.port > 0
        status, body = _run(go(srv.url))
    assert status == 200 and body["object"] == "list"
    assert [m["id"] for m in body["data"]] == backend.model_ids() and len(body["data"]) == 8


def test_chat_completion_shape_usage_and_content(backend):
    q = backend.world.questions(1, seed=11)[0]

    async def go(url):
        async with aiohttp.ClientSession() as s:
            return await _post(s, url, _body(q.question))
    with ServerThread(backend) as srv:
        status, body, _ = _run(go(srv.url))
    assert status == 200
    assert body["object"] == "chat.completion" and body["id"].startswith("chatcmpl-")
    assert body["model"] == MODEL and isinstance(body["created"], int)
    choice = body["choices"][0]
    assert choice["message"]["role"] == "assistant" and choice["finish_reason"] == "stop"
    want_text, want_prompt, want_completion = backend.respond(MODEL, submodel_messages(q.question), 512)
    assert choice["message"]["content"] == want_text
    usage = body["usage"]
    assert usage["prompt_tokens"] == want_prompt == sum(count_tokens(m["content"]) for m in submodel_messages(q.question))
    assert usage["completion_tokens"] == want_completion == count_tokens(want_text) > 0
    assert usage["total_tokens"] == usage["prompt_tokens"] + usage["completion_tokens"]


def test_max_tokens_cut_reports_length(backend):
    q = backend.world.questions(1, seed=12)[0]

    async def go(url):
        async with aiohttp.ClientSession() as s:
            return await _post(s, url, _body(q.question, model="sim/palmyra-creative-122b", max_tokens=4))
    with ServerThread(backend) as srv:
        status, body, _ = _run(go(srv.url))
    assert status == 200 and body["choices"][0]["finish_reason"] == "length"
    assert body["usage"]["completion_tokens"] == 4 == count_tokens(body["choices"][0]["message"]["content"])


def test_bearer_token_is_required_when_set(backend):
    async def go(url):
        async with aiohttp.ClientSession() as s:
            wrong = await _post(s, url, _body("hi"), headers={"Authorization": "Bearer nope"})
            missing = await _post(s, url, _body("hi"))
            right = await _post(s, url, _body("hi"), headers={"Authorization": "Bearer s3cret-token"})
            async with s.get(f"{url}/models") as r:
                models_status = r.status
            return wrong, missing, right, models_status
    with ServerThread(backend, token="s3cret-token") as srv:
        assert "s3cret" not in repr(srv)
        wrong, missing, right, models_status = _run(go(srv.url))
    for status, body, _ in (wrong, missing):
        assert status == 401 and body["error"]["code"] == "invalid_api_key"
        assert "s3cret" not in str(body)
    assert right[0] == 200 and models_status == 401


def test_unknown_model_is_an_openai_shaped_404(backend):
    async def go(url):
        async with aiohttp.ClientSession() as s:
            return await _post(s, url, _body("hi", model="gpt-nonexistent"))
    with ServerThread(backend) as srv:
        status, body, _ = _run(go(srv.url))
    assert status == 404
    assert body["error"]["code"] == "model_not_found" and body["error"]["param"] == "model"
    assert "gpt-nonexistent" in body["error"]["message"]


@pytest.mark.parametrize("payload, param", [
    (b"{not json", None),
    (b"[1, 2]", None),
    ({"messages": [{"role": "user", "content": "hi"}]}, "model"),
    ({"model": MODEL}, "messages"),
    ({"model": MODEL, "messages": []}, "messages"),
    ({"model": MODEL, "messages": [{"role": "wizard", "content": "hi"}]}, "messages[0].role"),
    ({"model": MODEL, "messages": [{"role": "user", "content": 3}]}, "messages[0].content"),
    ({"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "temperature": "hot"}, "temperature"),
    ({"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 0}, "max_tokens"),
    ({"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "stream": True}, "stream"),
    ({"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "seed": 1.5}, "seed"),
])
def test_malformed_body_is_a_400_naming_the_field(backend, payload, param):
    async def go(url):
        async with aiohttp.ClientSession() as s:
            if isinstance(payload, bytes):
                return await _post(s, url, data=payload, headers={"Content-Type": "application/json"})
            return await _post(s, url, payload)
    with ServerThread(backend) as srv:
        status, body, _ = _run(go(srv.url))
    assert status == 400 and body["error"]["type"] == "invalid_request_error"
    assert body["error"]["param"] == param
    if param:
        assert param.split("[")[0] in body["error"]["message"]


def test_text_parts_content_is_accepted(backend):
    q = backend.world.questions(1, seed=13)[0]
    body = _body(q.question)
    body["messages"][1]["content"] = [{"type": "text", "text": q.question}]

    async def go(url):
        async with aiohttp.ClientSession() as s:
            return await _post(s, url, body)
    with ServerThread(backend) as srv:
        status, out, _ = _run(go(srv.url))
    assert status == 200
    assert out["choices"][0]["message"]["content"] == backend.respond(MODEL, submodel_messages(q.question), 512)[0]


def _within(count: int, n: int, p: float) -> bool:
    return abs(count - n * p) <= 4 * (n * p * (1 - p)) ** 0.5 + 1


def test_errors_and_rate_limits_come_at_their_rates(backend):
    n = 400
    faults = FaultConfig(error_rate=0.2, rate_limit_rate=0.15, retry_after_s=3, seed=1)

    async def go(url):
        sem = asyncio.Semaphore(32)
        async with aiohttp.ClientSession() as s:
            async def one(i):
                async with sem:
                    return await _post(s, url, _body(f"question {i}"))
            return await asyncio.gather(*(one(i) for i in range(n)))
    with ServerThread(backend, faults=faults) as srv:
        results = _run(go(srv.url))
    statuses = [r[0] for r in results]
    assert set(statuses) == {200, 429, 500}
    assert _within(statuses.count(500), n, 0.2) and _within(statuses.count(429), n, 0.15)
    for status, body, headers in results:
        if status == 429:
            assert headers["Retry-After"] == "3" and body["error"]["code"] == "rate_limit_exceeded"
        if status == 500:
            assert body["error"]["type"] == "server_error"


def test_hangs_and_slow_replies_come_at_their_rates(backend):
    # slow_s well above what 100 concurrent normal replies can queue for on 2 busy cores (~1 s seen)
    n, slow_s, client_timeout = 100, 3.0, 6.0
    faults = FaultConfig(timeout_rate=0.2, slow_rate=0.2, hang_s=60.0, slow_s=slow_s, seed=2)

    async def go(url):
        async with aiohttp.ClientSession() as s:
            async def one(i):
                t0 = time.monotonic()
                try:
                    status = (await _post(s, url, _body(f"question {i}"), timeout=client_timeout))[0]
                except asyncio.TimeoutError:
                    status = "timeout"
                return status, time.monotonic() - t0
            return await asyncio.gather(*(one(i) for i in range(n)))
    with ServerThread(backend, faults=faults) as srv:
        results = _run(go(srv.url))
    hung = sum(s == "timeout" for s, _ in results)
    slow = sum(s == 200 and dt >= slow_s for s, dt in results)
    assert all(s in (200, "timeout") for s, _ in results)
    assert _within(hung, n, 0.2) and _within(slow, n, 0.2)


def test_shutdown_releases_a_hanging_request(backend):
    async def go(srv):
        async with aiohttp.ClientSession() as s:
            task = asyncio.create_task(_post(s, srv.url, _body("hi"), timeout=120))
            await asyncio.sleep(0.3)
            await asyncio.to_thread(srv.stop)
            try:
                status = (await task)[0]
            except aiohttp.ClientError:
                status = "closed"
            return status
    srv = ServerThread(backend, faults=FaultConfig(timeout_rate=1.0, hang_s=600)).start()
    # a hang waited out (600 s) would meet the client's 120 s timeout first: asyncio.TimeoutError, not these
    assert _run(go(srv)) in (504, "closed")


def test_sim_latency_is_slept_in_the_server():
    slow = SimBackend.from_pool_yaml(SIM_YAML, seed=0, latency_scale=1.0)
    q = slow.world.questions(1, seed=14)[0]

    async def go(url):
        async with aiohttp.ClientSession() as s:
            t0 = time.monotonic()
            status = (await _post(s, url, _body(q.question, model="sim/mistral-7b-instruct-v0.3")))[0]
            return status, time.monotonic() - t0
    with ServerThread(slow) as srv:
        status, dt = _run(go(srv.url))
    # at least ~0.05 s to the first token (median 0.25 s) plus ~10 tokens at 140 tokens/s
    assert status == 200 and dt > 0.1


def test_fault_config_and_cli_reject_bad_settings():
    with pytest.raises(ValueError, match="sum"):
        FaultConfig(error_rate=0.6, rate_limit_rate=0.6)
    with pytest.raises(ValueError, match="slow_rate"):
        FaultConfig(slow_rate=-0.1)
    with pytest.raises(SystemExit, match="API_ID=PATH"):
        main(["--backend", "hf", "--hf-model", "no-equals-sign"])
    with pytest.raises(SystemExit, match="sum"):
        main(["--error-rate", "0.7", "--timeout-rate", "0.7"])


def test_the_sim_backend_is_the_world_the_pool_names(tmp_path, backend):
    """--backend sim serves the experts of the pool yaml's `world:`; a pool naming none is refused, named."""
    from router_r1.pool.server import _build_backend, _parse_args

    served = _build_backend(_parse_args(["--pool", str(SIM_YAML), "--seed", "2", "--world-entities", "40"]))
    assert type(served).__module__ == "sim.backend" and (served.world.seed, served.world.n) == (2, 40)
    assert served.model_ids() == backend.model_ids()
    paper = ROOT / "configs" / "pool" / "paper.yaml"
    with pytest.raises(SystemExit, match=f"{paper}: --backend sim needs a simulated pool.*names no world"):
        main(["--pool", str(paper)])
    gone = tmp_path / "gone.yaml"
    gone.write_text(SIM_YAML.read_text().replace("world: sim", "world: no_such_world"))
    with pytest.raises(SystemExit, match=f"{gone}: world 'no_such_world' cannot be imported"):
        main(["--pool", str(gone)])


def test_hf_backend_serves_a_tiny_model(tmp_path):
    from tiny import tiny_model, tiny_tokenizer

    from router_r1.pool.hf_backend import HFBackend
    tok = tiny_tokenizer()
    model = tiny_model(len(tok))
    model.save_pretrained(tmp_path)
    tok.save_pretrained(tmp_path)
    hf = HFBackend({"tiny/in-memory": (model, tok), "tiny/from-dir": str(tmp_path)})
    messages = submodel_messages("What is the capital of France?")
    prompt_len = len(tok(tok.apply_chat_template(messages, tokenize=False, add_generation_prompt=True),
                         add_special_tokens=False)["input_ids"])

    async def go(url):
        async with aiohttp.ClientSession() as s:
            body = {"model": "tiny/in-memory", "messages": messages, "temperature": 0.0, "max_tokens": 6}
            a = await _post(s, url, body)
            b = await _post(s, url, body)
            c = await _post(s, url, {**body, "model": "tiny/from-dir"})
            return a, b, c
    with ServerThread(hf) as srv:
        a, b, c = _run(go(srv.url))
    for status, body, _ in (a, b, c):
        assert status == 200 and isinstance(body["choices"][0]["message"]["content"], str)
        assert body["usage"]["prompt_tokens"] == prompt_len
        assert 0 <= body["usage"]["completion_tokens"] <= 6
        assert (body["choices"][0]["finish_reason"] == "length") == (body["usage"]["completion_tokens"] == 6)
    # greedy decoding is deterministic, and the saved copy is the same model
    assert a[1]["choices"][0]["message"] == b[1]["choices"][0]["message"] == c[1]["choices"][0]["message"]
    with pytest.raises(ValueError, match="not a directory"):
        HFBackend({"x": str(tmp_path / "missing")})


def _start_cli(extra: list[str], env: dict) -> subprocess.Popen:
    cmd = [sys.executable, "-m", "router_r1.pool.server", "--backend", "sim", "--pool", str(SIM_YAML),
           "--host", "127.0.0.1", "--port", "0", "--latency-scale", "0", *extra]
    return subprocess.Popen(cmd, cwd=ROOT, env={**os.environ, "PYTHONPATH": str(ROOT), **env},
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def test_cli_serves_with_a_token_from_the_environment():
    proc = _start_cli(["--token-env", "POOL_TEST_TOKEN"], {"POOL_TEST_TOKEN": "tok-abc123"})
    try:
        line = proc.stdout.readline().strip()
        assert line.startswith("pool server listening on http://127.0.0.1:") and line.endswith("/v1")
        url = line.split(" on ")[1]

        async def go():
            async with aiohttp.ClientSession() as s:
                ok = await _post(s, url, _body("hi"), headers={"Authorization": "Bearer tok-abc123"})
                bad = await _post(s, url, _body("hi"), headers={"Authorization": "Bearer other"})
                return ok[0], bad[0]
        assert _run(go()) == (200, 401)
    finally:
        proc.send_signal(signal.SIGTERM)
        out, err = proc.communicate(timeout=30)
    assert proc.returncode == 0
    assert "tok-abc123" not in line + out + err


def test_cli_refuses_a_missing_token_variable():
    env = {k: v for k, v in os.environ.items() if k != "POOL_TEST_TOKEN_UNSET"}
    proc = subprocess.run([sys.executable, "-m", "router_r1.pool.server", "--token-env", "POOL_TEST_TOKEN_UNSET",
                           "--port", "0"], cwd=ROOT, env={**env, "PYTHONPATH": str(ROOT)},
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode != 0 and "POOL_TEST_TOKEN_UNSET" in proc.stderr


# ---- hostile requests (issue 16): each a clear 4xx, never a 500, a traceback or a held connection

@pytest.mark.parametrize("payload, param", [
    (b"[" * 100_000 + b"]" * 100_000, None),  # nesting deeper than the JSON parser's recursion limit
    ({"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 10**400}, "max_tokens"),
    ({"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "seed": 10**400}, "seed"),
    ({"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "seed": -(10**400)}, "seed"),
])
def test_hostile_bodies_are_a_400(backend, payload, param, caplog):
    async def go(url):
        async with aiohttp.ClientSession() as s:
            data = payload if isinstance(payload, bytes) else __import__("json").dumps(payload).encode()
            return await _post(s, url, data=data, headers={"Content-Type": "application/json"})
    with ServerThread(backend) as srv:
        status, body, _ = _run(go(srv.url))
    assert status == 400 and body["error"]["param"] == param, body
    assert not [r for r in caplog.records if r.exc_info]  # no logged traceback


def test_a_body_that_never_arrives_does_not_hold_the_connection(backend):
    async def go(port):
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        writer.write(b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                     b"Content-Length: 900000\r\n\r\n{\"model\":")  # announces 900 kB, sends 9 bytes
        await writer.drain()
        head = await asyncio.wait_for(reader.read(200), 60.0)
        writer.close()
        return head
    from router_r1.pool.server import ServerSettings
    with ServerThread(backend, settings=ServerSettings(read_timeout_s=0.5)) as srv:
        head = _run(go(srv.port))
    assert head.startswith(b"HTTP/1.1 408"), head  # the server's read timeout answered, not the client's


def test_an_announced_body_over_the_size_limit_is_refused_at_once(backend):
    async def go(port):
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        writer.write(b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                     b"Content-Length: 100000000000\r\n\r\n{")
        await writer.drain()
        head = await asyncio.wait_for(reader.read(200), 10.0)
        writer.close()
        return head
    with ServerThread(backend) as srv:
        head = _run(go(srv.port))
    assert head.startswith(b"HTTP/1.1 413"), head


def test_a_request_whose_client_gave_up_is_logged(backend, caplog):
    """Issue 28.8: the pool server logged nothing for a request whose client timed out."""
    import logging

    caplog.set_level(logging.INFO)

    async def go(url):
        async with aiohttp.ClientSession() as s:
            try:
                await _post(s, url, _body("hi"), timeout=0.5)
            except asyncio.TimeoutError:
                return "timeout"
    with ServerThread(backend, faults=FaultConfig(timeout_rate=1.0, hang_s=60)) as srv:
        assert _run(go(srv.url)) == "timeout"
        deadline = time.monotonic() + 10
        while not [r for r in caplog.records if "no reply sent" in r.getMessage()] and time.monotonic() < deadline:
            time.sleep(0.05)
    [line] = [r.getMessage() for r in caplog.records if "no reply sent" in r.getMessage()]
    assert MODEL in line and "/v1/chat/completions" in line
    assert not [r for r in caplog.records if r.exc_info]
