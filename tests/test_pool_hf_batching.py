"""The pool server's transformers back end: dynamic batching, the bounded queue, GGUF files."""
from __future__ import annotations

import asyncio
import logging
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import aiohttp
import pytest

from router_r1.pool.client import PoolClient, RouteRequest
from router_r1.pool.hf_backend import HFBackend
from router_r1.pool.registry import ModelRegistry
from router_r1.pool.server import ServerThread
from router_r1.pool.messages import submodel_messages
from tiny import tiny_model, tiny_tokenizer

ROOT = Path(__file__).resolve().parents[1]

QUESTIONS = ["What is the capital of France?", "Who wrote Hamlet?", "Which river is the longest in Europe?",
             "How many moons does Mars have?", "hi", "When does the train leave? At 10:30 in the morning, or later?"]


@pytest.fixture(scope="module")
def tiny():
    tok = tiny_tokenizer()
    return tiny_model(len(tok), seed=3), tok


async def _post_all(url: str, bodies: list[dict]) -> list[tuple[int, dict, dict]]:
    async def one(s, body):
        async with s.post(f"{url}/chat/completions", json=body, timeout=aiohttp.ClientTimeout(total=60)) as r:
            return r.status, await r.json(content_type=None), dict(r.headers)
    async with aiohttp.ClientSession() as s:
        return await asyncio.gather(*[one(s, b) for b in bodies])


def test_concurrent_greedy_requests_are_batched_and_answer_as_one_at_a_time(tiny):
    # prompts of different lengths (left padding) and different max_tokens in one batch
    hf = HFBackend({"tiny": tiny}, max_batch_size=8, batch_window_s=0.5)
    bodies = [{"model": "tiny", "messages": submodel_messages(q), "temperature": 0.0, "max_tokens": 5 + 3 * i}
              for i, q in enumerate(QUESTIONS)]
    alone = [hf.generate("tiny", b["messages"], 0.0, b["max_tokens"]) for b in bodies]

    async def submit_all():
        done = await asyncio.gather(*[hf.submit("tiny", b["messages"], 0.0, b["max_tokens"], None) for b in bodies])
        await hf.aclose()
        return done
    done = asyncio.run(submit_all())
    sizes = [d.batch_size for d in done]
    assert max(sizes) == len(bodies)  # one batch held them all
    assert [(d.text, d.prompt_tokens, d.completion_tokens) for d in done] == alone
    assert any(n > 0 for _, _, n in alone) and len({t for t, _, _ in alone}) > 1  # real, differing replies

    with ServerThread(hf) as srv:  # the same through HTTP, with the latency header
        replies = asyncio.run(_post_all(srv.url, bodies))
    for (status, body, headers), (text, pt, ct) in zip(replies, alone):
        assert status == 200, body
        assert body["choices"][0]["message"]["content"] == text
        assert (body["usage"]["prompt_tokens"], body["usage"]["completion_tokens"]) == (pt, ct)
        assert float(headers["X-Latency-S"]) > 0


def test_a_seeded_request_is_decoded_alone_and_reproducibly(tiny):
    hf = HFBackend({"tiny": tiny}, max_batch_size=8, batch_window_s=0.2)
    msgs = submodel_messages("Who wrote Hamlet?")

    async def go():
        done = await asyncio.gather(*[hf.submit("tiny", msgs, 1.0, 12, 7) for _ in range(3)],
                                    hf.submit("tiny", msgs, 0.0, 12, None))
        await hf.aclose()
        return done
    done = asyncio.run(go())
    assert [d.batch_size for d in done[:3]] == [1, 1, 1]
    assert done[0].text == done[1].text == done[2].text == hf.generate("tiny", msgs, 1.0, 12, 7)[0]


def test_a_full_queue_gives_429_with_retry_after_and_the_client_backs_off(tiny):
    hf = HFBackend({"tiny": tiny}, max_batch_size=1, batch_window_s=0.0, max_queue=1)
    body = {"model": "tiny", "messages": submodel_messages("hi"), "temperature": 0.0, "max_tokens": 40}
    with ServerThread(hf) as srv:
        statuses = asyncio.run(_post_all(srv.url, [body] * 6))
        registry = ModelRegistry.from_dict({"defaults": {"base_url": srv.url, "api_key_env": "NO_SUCH_KEY_VAR",
                                                         "price_out_per_m": 1.0, "max_tokens": 40},
                                            "models": [{"name": "Tiny", "api_id": "tiny"}]})
        client = PoolClient(registry, max_retries=6, backoff_base_s=0.05, backoff_max_s=2.0, timeout_s=30,
                            deadline_s=60)
        t0 = time.monotonic()
        results = client.route([RouteRequest("Tiny", q) for q in QUESTIONS])
        waited = time.monotonic() - t0
        client.close()
    refused = [(s, b, h) for s, b, h in statuses if s == 429]
    assert refused and all(s in (200, 429) for s, _, _ in statuses)
    assert all(int(h["Retry-After"]) >= 1 and b["error"]["type"] == "rate_limit_error" for _, b, h in refused)
    # every call answered in the end; some only after waiting out a Retry-After
    assert all(r.ok for r in results), [r.error for r in results]
    assert max(r.attempts for r in results) > 1 and waited >= 1.0


def test_a_gguf_file_is_served(tmp_path, tiny):
    pytest.importorskip("gguf")
    from gguf_tiny import write_llama_gguf

    model, tok = tiny
    path = tmp_path / "tiny.gguf"
    write_llama_gguf(path, model, tok)
    from_gguf = HFBackend({"g": str(path)})
    msgs = submodel_messages("What is the capital of France?")
    assert from_gguf.generate("g", msgs, 0.0, 8) == HFBackend({"t": tiny}).generate("t", msgs, 0.0, 8)
    with pytest.raises(ValueError, match="missing.gguf: GGUF file not found"):
        HFBackend({"x": str(tmp_path / "missing.gguf")})


def test_a_batch_whose_clients_all_left_stops_decoding(tiny):
    from router_r1.pool.hf_backend import _Request

    hf = HFBackend({"tiny": tiny})
    ids = hf.prompt_ids("tiny", submodel_messages("Who wrote Hamlet?"))

    async def decode(cancel: bool):
        loop = asyncio.get_running_loop()
        batch = [_Request(ids, 0.0, 60, None, loop.create_future()) for _ in range(2)]
        if cancel:
            for r in batch:
                r.future.cancel()
        return hf._generate("tiny", batch)
    kept, left = asyncio.run(decode(False)), asyncio.run(decode(True))
    assert kept[0][1] > 10  # this prompt decodes well past the first token when someone waits for it
    assert [n for _, n in left] == [1, 1]  # nobody waiting: stopped after the first step


def test_too_long_or_unencodable_prompts_are_a_400_before_the_model(tiny, caplog):
    """One 3 MB request once held the device 13 minutes at 6.2 GB; a lone surrogate was a 500 TypeError."""
    caplog.set_level(logging.INFO)
    hf = HFBackend({"tiny": tiny}, max_prompt_tokens=400)  # the sub-model prompt of "hi" is ~250
    base = {"model": "tiny", "messages": submodel_messages("hi"), "temperature": 0.0, "max_tokens": 8}
    bodies = [{**base, "messages": [{"role": "user", "content": "capital " * 2000}]},
              {**base, "max_tokens": 1024},  # tiny's context holds 1024 positions, the prompt needs some too
              {**base, "messages": [{"role": "user", "content": "who \ud800 wrote"}]},
              base]
    with ServerThread(hf) as srv:
        (s1, b1, _), (s2, b2, _), (s3, b3, _), (s4, _, _) = asyncio.run(_post_all(srv.url, bodies))
    assert (s1, b1["error"]["param"], b1["error"]["code"]) == (400, "messages", "context_length_exceeded")
    assert "--max-prompt-tokens" in b1["error"]["message"]
    assert (s2, b2["error"]["param"], b2["error"]["code"]) == (400, "max_tokens", "context_length_exceeded")
    assert (s3, b3["error"]["param"]) == (400, "messages[0].content") and s4 == 200
    assert not [r for r in caplog.records if r.exc_info]


def test_serving_a_gguf_file_without_the_gguf_package_says_so_in_one_line(tmp_path, monkeypatch):
    from router_r1.pool.server import main

    path = tmp_path / "model.gguf"
    path.write_bytes(b"GGUF")
    monkeypatch.setitem(sys.modules, "gguf", None)  # as if the [gguf] extra were not installed
    with pytest.raises(SystemExit) as e:
        main(["--backend", "hf", "--hf-model", f"m={path}"])
    message = str(e.value)
    assert "[gguf]" in message and str(path) in message and "\n" not in message


def test_the_cli_answers_429_when_full_and_stops_on_sigterm_mid_decode(tmp_path):
    """Run as `python -m` (the module is __main__): a full queue was a 500 `Overloaded`; SIGTERM waited for a
    decode of any length to finish."""
    tok = tiny_tokenizer()
    tiny_model(len(tok), seed=3, max_position_embeddings=1 << 20).save_pretrained(tmp_path)  # never says EOS
    tok.save_pretrained(tmp_path)
    cmd = [sys.executable, "-m", "router_r1.pool.server", "--backend", "hf", "--hf-model", f"tiny={tmp_path}",
           "--port", "0", "--threads", "1", "--max-batch-size", "1", "--batch-window-s", "0", "--max-queue", "1"]
    proc = subprocess.Popen(cmd, cwd=ROOT, env={**os.environ, "PYTHONPATH": str(ROOT)}, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    base = {"model": "tiny", "messages": submodel_messages("hi"), "temperature": 0.0}

    async def go(url):
        async with aiohttp.ClientSession() as s:
            async def post(body):
                try:
                    async with s.post(f"{url}/chat/completions", json=body,
                                      timeout=aiohttp.ClientTimeout(total=120)) as r:
                        return r.status, await r.json(content_type=None)
                except aiohttp.ClientError as e:  # the server closed it while stopping
                    return "closed", str(e)
            long = asyncio.create_task(post({**base, "max_tokens": 500_000}))  # hours of decoding
            await asyncio.sleep(1.0)
            queued = asyncio.create_task(post({**base, "max_tokens": 8}))  # waits behind it: the queue is full
            await asyncio.sleep(0.5)
            refused = await asyncio.gather(*[post({**base, "max_tokens": 8}) for _ in range(3)])
            proc.send_signal(signal.SIGTERM)
            return refused, await long, await queued
    try:
        line = proc.stdout.readline().strip()
        assert line.startswith("pool server listening on "), proc.stderr.read()[-2000:]
        refused, long, queued = asyncio.run(go(line.split(" on ")[1]))
        out, err = proc.communicate(timeout=60)  # before: decoding went on for 500,000 tokens
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    assert [s for s, _ in refused] == [429] * 3, refused
    assert all(b["error"]["type"] == "rate_limit_error" for _, b in refused)
    assert long[0] in (429, "closed") and queued[0] in (429, "closed"), (long, queued)
    assert proc.returncode == 0 and "Traceback" not in err, err[-3000:]
