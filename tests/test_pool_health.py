"""Training fails loudly when the pool keeps failing: RouterEnv's per-batch pool failure rate and its gate."""
from __future__ import annotations

import copy
import math
from dataclasses import replace
from pathlib import Path

import pandas as pd
import pytest
from hydra import compose, initialize_config_dir

from router_r1.pool.client import PoolClient
from router_r1.pool.health import PoolFailureError, PoolHealth, call_stats
from router_r1.pool.registry import ModelRegistry
from router_r1.pool.server import FaultConfig, ServerThread
from sim.backend import SimBackend
from router_r1.prompts import build_router_prompt
from router_r1.router_env import RouterEnv, RouterEnvConfig
from tiny import tiny_tokenizer
from verl.trainer.dataset import PromptRow
from verl.trainer import checkpoint
from verl.trainer.main_ppo import CONFIG_DIR, run
from verl.trainer.tracking import console_line
from verl.workers.rollout.base import GenOutput, SamplingParams

SIM = Path(__file__).resolve().parents[1] / "configs" / "pool" / "sim.yaml"
CHEAP = "LLaMA-3.1-8B-Instruct"


def _env(tok, url, health):
    registry = ModelRegistry.from_yaml(SIM, base_url=url).seen()
    client = PoolClient(registry, max_retries=0, timeout_s=5.0, deadline_s=5.0)
    cfg = RouterEnvConfig(max_turns=2, max_obs_length=32, response_length=64, max_response_length=512, schedule="sync")
    return RouterEnv(cfg, tok, registry, client, health=health), registry


def _rows(tok, registry, n=4):
    rows = []
    for i in range(n):
        text = tok.apply_chat_template(build_router_prompt(f"question {i}?", registry), add_generation_prompt=True,
                                       tokenize=False)
        rows.append(PromptRow(tok(text, add_special_tokens=False)["input_ids"], f"q{i}",
                              {"reward_model": {"ground_truth": {"target": ["x"]}}}))
    return rows


def _policy(tok):
    """Route once, then answer."""
    def generate(prompts, sampling):
        outs = []
        for ids in prompts:
            routed = "<information>" in tok.decode(ids[-200:])
            text = "<think>t</think><answer>x</answer>" if routed else f"<think>t</think><search>{CHEAP}: q?</search>"
            outs.append(GenOutput(tok(text, add_special_tokens=False)["input_ids"], "stop"))
        return outs
    return generate


def test_a_pool_that_keeps_failing_stops_training_with_the_reason():
    tok = tiny_tokenizer()
    health = PoolHealth(max_failure_rate=0.2, patience=2, hint="env.call_timeout_s=5")
    sampling = SamplingParams(temperature=1.0)
    with ServerThread(SimBackend.from_pool_yaml(SIM, seed=0, latency_scale=0.0),
                      faults=FaultConfig(error_rate=1.0)) as dead, \
            ServerThread(SimBackend.from_pool_yaml(SIM, seed=0, latency_scale=0.0)) as alive:
        bad_env, registry = _env(tok, dead.url, health)
        good_env, _ = _env(tok, alive.url, health)  # same gate: one run whose pool comes back
        rows = _rows(tok, registry)

        def batch(env, validate=False):
            result = env.rollout(rows, _policy(tok), sampling, validate=validate)
            return env.score(result, rows, validate=validate)[1]

        m = batch(bad_env)  # first unhealthy training batch: logged, not fatal
        assert m["pool/failure_rate"] == [1.0] and m["pool/calls"] == [4.0]
        assert batch(bad_env, validate=True)["pool/failure_rate"] == [1.0]  # validation only reports
        m = batch(good_env)  # a healthy batch resets the streak
        assert m["pool/failure_rate"] == [0.0] and m["pool/latency_p95_s"][0] >= m["pool/latency_p50_s"][0] > 0
        assert m["pool/latency_p50_s"][0] >= m["pool/server_p50_s"][0] >= 0  # the server's time, inside the call's
        batch(bad_env)
        with pytest.raises(PoolFailureError) as e:
            batch(bad_env)
        bad_env.client.close()
        good_env.client.close()
    msg = str(e.value)
    assert "env.max_pool_failure_rate 0.2 for 2 training batches in a row" in msg
    assert "4 of 4 calls (100%: server_error 4)" in msg and msg.endswith("env.call_timeout_s=5")


def test_call_stats_counts_calls_not_episodes():
    turns = [[{"ok": True, "latency_s": 1.0}, {"ok": False, "error": "timeout", "latency_s": 3.0}, {"action": "x"}],
             [{"ok": True, "latency_s": 9.0, "cached": True}], []]
    s = call_stats(turns)
    assert (s["calls"], s["failed"], s["errors"]) == (3, 1, {"timeout": 1})
    assert s["failure_rate"] == pytest.approx(1 / 3) and s["latency_p50_s"] == 2.0  # the cache hit left out
    assert math.isnan(s["server_p50_s"])  # no server said its time
    s = call_stats([[{"ok": True, "latency_s": 5.0, "server_s": 1.0}, {"ok": True, "latency_s": 1.0}]])
    assert (s["latency_p50_s"], s["server_p50_s"]) == (3.0, 1.0)
    with pytest.raises(ValueError, match="max_failure_rate"):
        PoolHealth(max_failure_rate=1.5)


def test_the_gate_settings_come_from_the_env_section():
    from router_r1.router_env import make_env

    env = make_env({"pool": str(SIM), "response_length": 8, "max_response_length": 64, "call_timeout_s": 7,
                    "max_pool_failure_rate": 0.5, "pool_failure_patience": 4}, tokenizer=tiny_tokenizer())
    assert (env.health.max_failure_rate, env.health.patience) == (0.5, 4)
    assert "env.call_timeout_s=7" in env.health.hint
    env.client.close()


def _dead():
    """A sim pool server whose every call fails (500)."""
    return ServerThread(SimBackend.from_pool_yaml(SIM, seed=0, latency_scale=0.0), faults=FaultConfig(error_rate=1.0))


def test_the_pool_counts_are_checkpointed_so_a_resumed_run_stops_at_once():
    tok = tiny_tokenizer()
    sampling = SamplingParams(temperature=1.0)
    with _dead() as dead:
        env, registry = _env(tok, dead.url, PoolHealth(max_failure_rate=0.2, patience=3))
        rows = _rows(tok, registry)
        for _ in range(2):  # under the patience: logged, not fatal
            env.score(env.rollout(rows, _policy(tok), sampling, validate=False), rows, validate=False)
        state = copy.deepcopy(env.state_dict())  # what a checkpoint carries
        env.client.close()
        resumed, _ = _env(tok, dead.url, PoolHealth(max_failure_rate=0.2, patience=3))
        resumed.load_state_dict(state)
        m = None
        with pytest.raises(PoolFailureError, match="for 3 training batches in a row"):
            m = resumed.score(resumed.rollout(rows, _policy(tok), sampling, validate=False), rows, validate=False)
        resumed.client.close()
    assert m is None
    assert resumed.health.run_failure_rate == 1.0 and resumed.health.state_dict()["calls"] == 12


def test_check_run_weighs_the_whole_run():
    health = PoolHealth(max_failure_rate=0.2, patience=3, hint="env.call_timeout_s=5")
    ok, failed = {"ok": True, "latency_s": 0.1}, {"ok": False, "error": "timeout", "latency_s": 5.0}
    for batch in ([[failed]] * 4, [[ok]] * 4, [[failed]] * 4):  # never three unhealthy batches in a row
        m = health.observe(batch, validate=False)
    assert m["pool/run_failure_rate"] == [pytest.approx(8 / 12)]
    health.observe([[ok]] * 8, validate=True)  # validation is not the run's training
    with pytest.raises(PoolFailureError) as e:
        health.check_run()
    assert "8 of 12 training calls (67%: timeout 8)" in str(e.value) and str(e.value).endswith("env.call_timeout_s=5")
    fine = PoolHealth(max_failure_rate=0.2)
    fine.observe([[ok]] * 9 + [[failed]], validate=False)
    fine.check_run()  # 10% failed: within the limit
    PoolHealth().check_run()  # a run without a pool call


def test_the_step_line_shows_the_pool_failure_rate():
    line = console_line({"reward/mean": 0.5, "pool/failure_rate/mean": 0.75, "pool/run_failure_rate/mean": 0.5}, 2)
    assert line == "step 2 | reward 0.500 pool_fail 0.75 pool_fail_run 0.50"


# ---- a real training run on a dead pool (issue 29.6) ----

def make_scripted_env(env_cfg, tokenizer):
    """The routing env whose policy turns are scripted (route once, then answer) whatever the model writes:
    a tiny random model never routes, and these runs are about the pool."""
    from router_r1.router_env import make_env

    env = make_env(env_cfg, tokenizer)
    play = env.rollout
    env.rollout = lambda rows, generate, sampling, validate: play(
        rows, _policy(tokenizer), replace(sampling, return_logprobs=False), validate)
    return env


def _train(out, data, url, *overrides):
    with initialize_config_dir(CONFIG_DIR, version_base=None):
        cfg = compose("ppo_trainer", overrides=[
            f"trainer.output_dir={out}", "trainer.logger=[console,jsonl]", "trainer.export_hf=false",
            "trainer.val_before_train=false", "trainer.test_freq=0", "trainer.save_freq=1", "data.val_files=[]",
            f"data.train_files=[{data}]", "data.train_batch_size=2", "rollout.response_length=24",
            "rollout.max_response_length=512", "env=router", "env.factory=test_pool_health:make_scripted_env",
            f"env.pool={SIM}", f"env.pool_url={url}", "env.schedule=sync", "env.max_retries=0",
            "env.call_timeout_s=5", "env.call_deadline_s=5", "env.max_obs_length=32", *overrides])
    return run(cfg)


def test_a_short_run_on_a_dead_pool_fails_loudly_and_its_resume_stops_at_once(tmp_path, capsys):
    data = tmp_path / "router.parquet"
    pd.DataFrame([{"data_source": "toy", "prompt": [{"role": "user", "content": f"question {i}?"}],
                   "reward_model": {"ground_truth": {"target": ["x"]}}, "extra_info": {"uid": f"q{i}", "index": i}}
                  for i in range(8)]).to_parquet(data)
    out = tmp_path / "run"
    with _dead() as dead:
        with pytest.raises(PoolFailureError, match="over the whole run: 4 of 4 training calls"):
            _train(out, data, dead.url, "trainer.total_steps=2")  # two steps: under the patience of 3
        printed = capsys.readouterr().out
        assert "step 2/2 |" in printed and "pool_fail 1.00" in printed  # the step line
        assert "finished 2 of 2 steps" in printed and "pool_fail " in printed.split("finished 2 of 2 steps")[1]
        with pytest.raises(PoolFailureError, match="for 3 training batches in a row"):
            _train(out, data, dead.url, "trainer.total_steps=4", "trainer.resume=auto")
    assert [d.name for d in checkpoint.step_dirs(out)] == ["step_000001", "step_000002"]  # none after the resume


def test_the_servers_own_time_is_reported_beside_the_call_time():
    """Issue 28.8: the pool 'latency' included the client's queueing and retries and was reported as if it were
    the pool's; the server's own time (X-Latency-S) now comes back beside it."""
    from router_r1.pool.client import RouteRequest

    with ServerThread(SimBackend.from_pool_yaml(SIM, seed=0, latency_scale=0.0),
                      faults=FaultConfig(slow_rate=1.0, slow_s=0.2)) as srv:
        registry = ModelRegistry.from_yaml(SIM, base_url=srv.url).seen()
        client = PoolClient(registry, max_retries=0, timeout_s=30.0, deadline_s=60.0, max_concurrency_per_endpoint=1)
        results = client.route([RouteRequest(CHEAP, f"question {i}?") for i in range(3)])
        client.close()
    assert all(r.ok and r.server_s is not None and 0.2 <= r.server_s <= r.latency_s for r in results)
    # one connection slot: the last call answered waited for the two before it, which only the client's time holds
    assert max(r.latency_s for r in results) >= sum(r.server_s for r in results)
