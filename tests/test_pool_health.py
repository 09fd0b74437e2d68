"""Training fails loudly when the pool keeps failing: RouterEnv's per-batch pool failure rate and its gate."""
from __future__ import annotations

from pathlib import Path

import pytest

from router_r1.pool.client import PoolClient
from router_r1.pool.health import PoolFailureError, PoolHealth, call_stats
from router_r1.pool.registry import ModelRegistry
from router_r1.pool.server import FaultConfig, ServerThread, SimBackend
from router_r1.prompts import build_router_prompt
from router_r1.reward.score import RewardConfig
from router_r1.router_env import RouterConfig, RouterEnv
from tiny import tiny_tokenizer
from verl.trainer.dataset import PromptRow
from verl.workers.rollout.base import GenOutput, SamplingParams

SIM = Path(__file__).resolve().parents[1] / "configs" / "pool" / "sim.yaml"
CHEAP = "LLaMA-3.1-8B-Instruct"


def _env(tok, url, health):
    registry = ModelRegistry.from_yaml(SIM, base_url=url).seen()
    client = PoolClient(registry, max_retries=0, timeout_s=5.0, deadline_s=5.0)
    cfg = RouterConfig(max_turns=2, max_obs_length=32, response_length=64, max_response_length=512, schedule="sync")
    return RouterEnv(cfg, tok, registry, client, RewardConfig(), health=health), registry


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
    with pytest.raises(ValueError, match="max_failure_rate"):
        PoolHealth(max_failure_rate=1.5)


def test_the_gate_settings_come_from_the_env_section():
    from router_r1.router_env import make_env

    env = make_env({"pool": str(SIM), "response_length": 8, "max_response_length": 64, "call_timeout_s": 7,
                    "max_pool_failure_rate": 0.5, "pool_failure_patience": 4}, tokenizer=tiny_tokenizer())
    assert (env.health.max_failure_rate, env.health.patience) == (0.5, 4)
    assert "env.call_timeout_s=7" in env.health.hint
    env.client.close()
