"""The router server: the real `openai` client against the real server on loopback, a tiny router trained
by the fixture, the simulated pool behind a real pool server that checks its key."""
import argparse
import json
import logging
import threading
from dataclasses import replace

import openai
import pytest

from router_r1.eval.evaluate import Pool, load_policy, router_episodes, tokenize_prompt
from router_r1.pool.client import PoolClient
from router_r1.pool.registry import ModelRegistry
from router_r1.pool.server import ServerThread
from sim.backend import SimBackend
from router_r1.prompts import build_router_prompt
from router_r1.actions import NO_REPLY_TEXT
from router_r1.serve import RouterServerThread, build_service, parse_args, serving
from router_r1.runtime import EnvOverrides, EvalError
from router_r1.serve_engine import RunSettings, load_run_settings
from serve_fixture import ALPHAS, ANSWER, BIG, SIM, SUB_QUESTION, TURNS, write_val_parquet
from verl.workers.rollout.base import SamplingParams

POOL_KEY = "pool-key-7f3a9c-never-shown"
WRONG_KEY = "wrong-key-51be02-never-shown"
CLIENT_TOKEN = "client-token-1"
QUESTION = "What is the capital of Veloria?"


@pytest.fixture(scope="module")
def ckpt(trained_router):
    return trained_router


@pytest.fixture(scope="module")
def pool_server():
    # the simulated pool behind a server that wants the pool key
    with ServerThread(SimBackend.from_pool_yaml(SIM, seed=0, latency_scale=0.0), token=POOL_KEY) as srv:
        yield srv


@pytest.fixture(scope="module")
def served(ckpt, pool_server):
    """The CLI's own service (serving()), behind the server thread, with a client token."""
    mp = pytest.MonkeyPatch()
    mp.setenv("ROUTER_SIM_API_KEY", POOL_KEY)
    args = parse_args(["--checkpoint", str(ckpt.parent), "--pool", str(SIM), "--pool-url", pool_server.url])
    with serving(args) as service, RouterServerThread(service, token=CLIENT_TOKEN) as srv:
        yield service, srv
    mp.undo()


@pytest.fixture(scope="module")
def client(served):
    return openai.OpenAI(base_url=served[1].url, api_key=CLIENT_TOKEN, max_retries=0, timeout=60)


def ask(client, model="router-r1", **kw):
    return client.chat.completions.create(model=model, messages=[{"role": "user", "content": QUESTION}], **kw)


def test_models_answer_usage_cost_and_trace(served, client, caplog):
    caplog.set_level(logging.DEBUG)
    service, _ = served
    env = service.settings.env  # the run's saved settings
    assert {k: getattr(env, k) for k in TURNS} == TURNS and service.settings.alphas == ALPHAS
    assert [m.id for m in client.models.list()] == ["router-r1", "router-r1@0", "router-r1@0.6"]
    r = ask(client, "router-r1@0.6", extra_body={"trace": True})
    assert r.choices[0].message.content == ANSWER and r.choices[0].finish_reason == "stop"
    ext = r.model_extra["router_r1"]
    assert ext["alpha"] == 0.6 and ext["format_ok"] and ext["turns"] == 2
    [call] = ext["calls"]
    spec = service.pool.registry[BIG]
    pool_out = ext["usage"]["pool_completion_tokens"]
    assert call["model"] == BIG and call["sub_question"] == SUB_QUESTION and call["ok"] and call["latency_s"] > 0
    assert call["cost_usd"] == ext["cost_usd"] == pytest.approx(pool_out * spec.price_out_per_m / 1e6)
    u = ext["usage"]
    assert r.usage.prompt_tokens == u["router_prompt_tokens"] + u["pool_prompt_tokens"]
    assert r.usage.completion_tokens == u["router_completion_tokens"] + pool_out
    assert u["router_completion_tokens"] == 2 and pool_out > 0  # two turns, one token each (the fixture)
    assert "Cost weight for this question: 0.6 " in ext["trace"]["prompt"]
    # the evaluation path (router_episodes: the training env, batch schedule) plays the same episode
    prompt = tokenize_prompt(service.policy.tokenizer, build_router_prompt(QUESTION, service.pool.registry,
                                                                           service.policy.template, alpha=0.6))
    [ep] = router_episodes([prompt], service.policy, service.pool, service.env.cfg,
                           SamplingParams(greedy=True, temperature=0.0), 1)
    assert ep["text"] == ext["trace"]["trajectory"] and ep["cost_usd"] == pytest.approx(ext["cost_usd"])
    # the default alpha is the run's first; "alpha" in the body is the same as the model name
    plain = ask(client).model_extra["router_r1"]
    assert plain["alpha"] == 0.0 and "trace" not in plain
    assert ask(client, extra_body={"alpha": 0.6}).model_extra["router_r1"]["alpha"] == 0.6
    assert POOL_KEY not in json.dumps(r.model_dump()) and POOL_KEY not in caplog.text


def test_streaming_gives_the_answer_and_usage(client):
    chunks = list(ask(client, stream=True, stream_options={"include_usage": True}))
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == ANSWER
    assert chunks[-1].usage is not None and chunks[-1].usage.total_tokens > 0
    assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] == "stop"


def test_concurrent_requests_share_generate_calls(served, client):
    service, _ = served
    before = len(service.engine.batch_sizes)
    answers = [None] * 6
    threads = [threading.Thread(target=lambda i=i: answers.__setitem__(i, ask(client).choices[0].message.content))
               for i in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert answers == [ANSWER] * 6
    batches = service.engine.batch_sizes[before:]
    assert sum(batches) == 12 and max(batches) > 1  # 6 episodes x 2 turns, some turns batched together


def test_bad_requests_and_auth_are_openai_errors(served, client):
    with pytest.raises(openai.AuthenticationError):
        openai.OpenAI(base_url=served[1].url, api_key="wrong", max_retries=0).models.list()
    with pytest.raises(openai.BadRequestError, match="alpha"):
        ask(client, extra_body={"alpha": 1.5})
    with pytest.raises(openai.BadRequestError, match="disagrees"):
        ask(client, "router-r1@0.6", extra_body={"alpha": 0.3})
    with pytest.raises(openai.NotFoundError, match="model_not_found|does not exist"):
        ask(client, "gpt-4o")
    with pytest.raises(openai.BadRequestError, match="user message"):
        client.chat.completions.create(model="router-r1", messages=[{"role": "system", "content": "hi"}])


def test_failing_pool_is_an_observation_and_no_answer_is_an_error(ckpt, pool_server, tmp_path, caplog, monkeypatch):
    caplog.set_level(logging.DEBUG)
    # the pool refuses this key (HTTP 401): the call fails, the router reads the failure note and answers
    yaml_text = SIM.read_text().replace("ROUTER_SIM_API_KEY", "ROUTER_TEST_WRONG_KEY")
    (tmp_path / "pool.yaml").write_text(yaml_text)
    monkeypatch.setenv("ROUTER_TEST_WRONG_KEY", WRONG_KEY)
    full = ModelRegistry.from_yaml(tmp_path / "pool.yaml", base_url=pool_server.url)
    pool = Pool(full.seen(), full, PoolClient(full, max_retries=0), "refusing pool")
    policy = load_policy(ckpt)
    settings = load_run_settings(ckpt)
    with RouterServerThread(build_service(policy, pool, settings)) as srv:
        c = openai.OpenAI(base_url=srv.url, api_key="none", max_retries=0, timeout=60)
        r = ask(c, extra_body={"trace": True})
        ext = r.model_extra["router_r1"]
        assert r.choices[0].message.content == ANSWER
        assert [(x["model"], x["ok"], x["cost_usd"]) for x in ext["calls"]] == [(BIG, False, 0.0)]
        assert NO_REPLY_TEXT in ext["trace"]["trajectory"]
        body = json.dumps(r.model_dump())
    # a router that cannot answer (no routing turn left, and it always routes): an error JSON, not retried
    no_turns = replace(settings, env=replace(settings.env, max_turns=0))
    with RouterServerThread(build_service(policy, pool, no_turns)) as srv:
        c = openai.OpenAI(base_url=srv.url, api_key="none", max_retries=2, timeout=60)
        with pytest.raises(openai.InternalServerError) as err:
            ask(c)
        assert err.value.status_code == 500 and err.value.body["code"] == "router_no_answer"
        assert "turn budget" in err.value.body["message"]
        assert err.value.response.json()["router_r1"]["calls"] == []  # what it did, beside the error
        assert caplog.text.count("answered=False") == 1  # the SDK did not retry it
    pool.client.close()
    for secret in (WRONG_KEY, POOL_KEY):
        assert secret not in body and secret not in caplog.text and secret not in str(err.value.body)


def test_settings_come_from_the_saved_run_config(ckpt, tmp_path):
    s = load_run_settings(ckpt, EnvOverrides(max_turns=3))
    assert {k: getattr(s.env, k) for k in TURNS} == {**TURNS, "max_turns": 3}
    assert s.alphas == ALPHAS and s.alpha == 0.0 and s.pool == str(SIM)
    assert "run_config.yaml" in s.source and "flags" in s.source
    bare = load_run_settings(tmp_path)  # no run config: the paper run's shape, said so
    assert "no run_config.yaml" in bare.source and bare.alphas == () and bare.env.max_turns == 4
    (tmp_path / "run_config.yaml").write_text("env:\n  factory: router_r1.router_env:make_env\n  max_turnz: 2\n")
    with pytest.raises(EvalError, match="max_turnz"):
        load_run_settings(tmp_path)
    (tmp_path / "run_config.yaml").write_text("env:\n  factory: router_r1.router_env:make_env\n  max_turns: -1\n"
                                              "  response_length: 8\n  max_response_length: 64\n")
    with pytest.raises(EvalError, match=r"run_config.yaml.*max_turns"):
        load_run_settings(tmp_path)
    assert isinstance(s, RunSettings)


@pytest.fixture(scope="module")
def val_file(tmp_path_factory):
    return write_val_parquet(tmp_path_factory.mktemp("val") / "val.parquet")


def test_calibrate_meets_a_target_or_says_it_cannot(ckpt, pool_server, val_file, tmp_path, monkeypatch, capsys):
    from router_r1.calibrate import Point, choose, main as calibrate_main

    monkeypatch.setenv("ROUTER_SIM_API_KEY", POOL_KEY)
    base = ["--checkpoint", str(ckpt), "--data", str(val_file), "--pool-url", pool_server.url, "--alphas", "0", "0.6"]
    # this router sends every question to the dearest model at any alpha: a share of 1 is met, 0.5 is not
    assert calibrate_main([*base, "--target-dear-share", "1.0", "--out", str(tmp_path / "a")]) == 0
    out = json.loads((tmp_path / "a" / "calibration.json").read_text())
    assert out["dearest_model"] == BIG and out["chosen_alpha"] == 0.0  # equal EM: the smaller alpha
    assert [(p["alpha"], p["em"], p["dear_share"], p["calls_per_question"]) for p in out["points"]] == \
        [(0.0, 0.5, 1.0, 1.0), (0.6, 0.5, 1.0, 1.0)]  # one of the two golds is ANSWER
    assert out["points"][0]["cost_per_1k_usd"] > 0
    assert calibrate_main([*base, "--target-dear-share", "0.5", "--out", str(tmp_path / "b")]) == 1
    assert "no alpha meets dear_share <= 0.5" in capsys.readouterr().out
    # the choice: best EM under the target, not the cheapest
    pts = [Point(a, 10, em, (0, 1), cost, 0.0, 1.0, {}, 0.0)
           for a, em, cost in ((0.0, 0.6, 30.0), (0.3, 0.55, 20.0), (0.6, 0.5, 12.0), (0.9, 0.3, 5.0))]
    assert choose(pts, 25.0, "cost_per_1k_usd").alpha == 0.3 and choose(pts, 4.0, "cost_per_1k_usd") is None


def test_bench_serve_runs_and_agrees_with_the_evaluation_path(ckpt, val_file):
    from tools.bench import bench_serve

    args = argparse.Namespace(checkpoint=str(ckpt), data=str(val_file), pool=None, clients=3, duration=30.0,
                              max_requests=6, limit=None, sim_latency=0.0, max_turns=None, max_obs_length=None,
                              response_length=None, max_response_length=None, out=None)
    out = bench_serve.bench(args)
    assert out["server"]["requests"] == 6 and out["server"]["answered"] == 6 and out["answers_agree"] == 1.0
    assert out["eval_path"]["questions"] == 6 and out["server"]["latency_s"]["p99"] >= out["server"]["latency_s"]["p50"]


def test_evaluation_tells_a_conditioned_checkpoint_its_alpha(ckpt, pool_server, val_file, tmp_path, monkeypatch):
    from router_r1.eval.evaluate import EvalConfig, evaluate

    monkeypatch.setenv("ROUTER_SIM_API_KEY", POOL_KEY)
    prompts = []

    def load(c):
        policy = load_policy(c)
        generate = policy.generate

        def spy(batch, sampling):
            prompts.extend(policy.tokenizer.decode(p) for p in batch)
            return generate(batch, sampling)
        return replace(policy, generate=spy)

    for alpha, said in ((0.6, "Cost weight for this question: 0.6 "), (None, "Cost weight for this question: 0 ")):
        prompts.clear()
        out = evaluate(EvalConfig(data=[str(val_file)], checkpoints=[str(ckpt)], pool=str(SIM),
                                  pool_url=pool_server.url, alpha=alpha, out=str(tmp_path / f"e{alpha}")),
                       load=load, log=lambda *_: None)
        assert prompts and all(said in p for p in prompts)  # --alpha, else the run's first alpha
        assert out["runs"][0]["overall"]["em"] == 0.5


def test_an_answer_from_a_malformed_episode_says_so(served, client, monkeypatch):
    """Issue 45.15: an episode that broke the output format (here an answer with no <think> before it) was a 200
    with finish_reason "stop", the made-up answer looking like any other."""
    from scripted import scripted
    from verl.workers.rollout.base import as_async
    service, _ = served
    tok = service.policy.tokenizer

    class Q:
        question = QUESTION
    monkeypatch.setattr(service, "engine", as_async(scripted(tok, [Q], lambda q, ctx: "<answer>Rome</answer>")))
    r = ask(client)
    ext = r.model_extra["router_r1"]
    assert r.choices[0].message.content == "Rome" and r.choices[0].finish_reason == "malformed"
    assert ext["format_ok"] is False and ext["format_reason"].startswith("start")
    chunks = list(ask(client, stream=True))
    assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] == "malformed"
    monkeypatch.undo()  # the trained router again: a well-formed answer stops as usual
    r = ask(client)
    assert r.choices[0].finish_reason == "stop" and r.model_extra["router_r1"]["format_reason"] == "ok"
