"""env.schedule=auto: sync where the engine decodes whole batches cheaper (the hf loop on the CPU), else continuous."""
from __future__ import annotations

import threading

import pytest

from router_r1.pool.client import PoolClient
from router_r1.pool.registry import ModelRegistry
from router_r1.pool.server import ServerThread
from router_r1.router_env import RouterEnv, RouterEnvConfig
from router_r1.runtime import seeded
from sim.backend import SimBackend
from test_pool_health import SIM, _policy, _rows
from tiny import tiny_model, tiny_tokenizer
from verl.workers.rollout.base import SamplingParams
from verl.workers.rollout.hf_rollout import HFRollout
from verl.workers.rollout.static_rollout import StaticRollout


class Policy:
    """test_pool_health's route-once-then-answer policy; records each call's rows and whether it ran on the caller's
    thread."""

    def __init__(self, tok, lockstep: bool | None):
        self.tok, self.calls, self._generate = tok, [], _policy(tok)
        if lockstep is not None:
            self.lockstep_batches = lockstep

    def __call__(self, prompts, sampling):
        self.calls.append((len(prompts), threading.current_thread() is threading.main_thread()))
        return self._generate(prompts, sampling)


def _rollout(policy, schedule: str, rows: int = 6, **env):
    tok = policy.tok
    with ServerThread(SimBackend.from_pool_yaml(SIM, seed=0, latency_scale=0.0)) as srv:
        registry = ModelRegistry.from_yaml(SIM, base_url=srv.url).seen()
        cfg = RouterEnvConfig(max_turns=2, max_obs_length=32, response_length=64, max_response_length=512,
                              schedule=schedule, **env)
        with PoolClient(registry) as client:
            env = RouterEnv(cfg, tok, registry, client)
            result = env.rollout(_rows(tok, registry, rows), policy, SamplingParams(greedy=True), validate=True)
    return env, result


def test_auto_plays_sync_for_an_engine_that_wants_whole_batches(capsys):
    policy = Policy(tiny_tokenizer(), lockstep=True)
    env, result = _rollout(policy, "auto")
    # sync: one call a turn with every live episode, on the caller's thread (continuous batches in a worker thread)
    assert policy.calls == [(6, True), (6, True)]
    assert all("<answer>x</answer>" in t for t in result.info["text"])
    assert "env.schedule=auto plays sync" in capsys.readouterr().out


@pytest.mark.parametrize("lockstep", [None, False])
def test_auto_stays_continuous_otherwise(lockstep, capsys):
    policy = Policy(tiny_tokenizer(), lockstep=lockstep)
    _rollout(policy, "auto")
    assert policy.calls and not any(main for _, main in policy.calls)  # BatchedAsync's worker thread
    assert "env.schedule=auto plays continuous" in capsys.readouterr().out


def test_auto_keeps_forked_groups_continuous_and_explicit_schedules_as_set():
    tok = tiny_tokenizer()
    with ServerThread(SimBackend.from_pool_yaml(SIM, seed=0, latency_scale=0.0)) as srv:
        registry = ModelRegistry.from_yaml(SIM, base_url=srv.url).seen()
        with PoolClient(registry) as client:
            def env(**kw):
                return RouterEnv(RouterEnvConfig(response_length=8, max_response_length=64, **kw), tok, registry, client)
            lockstep = Policy(tok, lockstep=True)
            assert env(schedule="auto", branch_turns=[0]).schedule_for(lockstep) == "continuous"
            assert env(schedule="continuous").schedule_for(lockstep) == "continuous"
            assert env(schedule="overlap").schedule_for(lockstep) == "overlap"
            assert env(schedule="sync").schedule_for(Policy(tok, lockstep=None)) == "sync"
    with pytest.raises(ValueError, match="continuous schedule only"):
        RouterEnvConfig(response_length=8, max_response_length=64, schedule="sync", branch_turns=[1]).check()


def test_the_hf_loop_wants_whole_batches_on_the_cpu_and_hf_static_does_not():
    tok = tiny_tokenizer()
    hf = HFRollout(tiny_model(len(tok)), tok, eos_token_ids=[])
    static = StaticRollout(tiny_model(len(tok)), tok, eos_token_ids=[], max_model_len=64)
    assert hf.lockstep_batches is True and static.lockstep_batches is False
    # evaluation hands the env seeded(policy.generate): the engine's wish comes through the wrapper
    assert seeded(hf.generate).lockstep_batches is True
    assert seeded(static.generate).lockstep_batches is False and seeded(Policy(tok, True)).lockstep_batches is False
