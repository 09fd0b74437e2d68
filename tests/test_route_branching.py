"""Forked prompt groups (env.branch_turns): a group's episodes share one trunk up to the fork turn, against the real
simulated pool server; the trainer credits the fork turn's tokens against the siblings and nothing else."""
import itertools
import types

import numpy as np
import pytest
import torch
from omegaconf import OmegaConf

from router_r1.pool.server import ServerThread
from router_r1.router_env import RouterEnvConfig
from sim.backend import SimBackend
from test_rollout_manager import SIM, _sampling, make_env, make_rows
from verl.trainer.config import AlgorithmConfig
from verl.trainer.env_interface import RolloutResult
from verl.trainer.ppo_trainer import PPOTrainer
from verl.workers.rollout.base import GenOutput, SamplingParams
from sim.world import SimWorld


def cycling_policy(tok, rows, names, calls):
    """Each call routes the next hop to the next of `names` in turn (siblings differ), then answers; `calls`
    counts the generations of each (prompt, turn)."""
    by_prompt = {tuple(r.prompt_ids): r.fields["question"] for r in rows}
    pick = itertools.cycle(names)

    def generate(prompts, sampling):
        outs = []
        for ids in prompts:
            p, q = next((p, q) for p, q in by_prompt.items() if tuple(ids[: len(p)]) == p)
            seen = tok.decode(ids[len(p):]).count("<information>")
            calls[(p, seen)] = calls.get((p, seen), 0) + 1
            if seen < len(q.hops):
                text = f"<think>hop {seen}</think><search>{next(pick)}: {q.hops[seen].sub_question}</search>"
            else:
                text = f"<think>done</think><answer>{q.answers[0]}</answer>"
            outs.append(GenOutput(tok(text, add_special_tokens=False)["input_ids"], "stop"))
        return outs

    return generate


def two_hop_question():
    return next(q for q in SimWorld(seed=0).questions(20, seed=3, split="test", two_hop_frac=1.0) if len(q.hops) == 2)


def play(tok, branch_turns, n=4, validate=False, seed=7):
    calls: dict = {}
    with ServerThread(SimBackend.from_pool_yaml(SIM, seed=0, latency_scale=0.0)) as srv:
        env, registry = make_env(tok, srv.url)
        env.cfg.branch_turns = branch_turns
        rows = make_rows(tok, registry, [two_hop_question()]) * n
        sampling = SamplingParams(temperature=1.0, max_new_tokens=8, seed=seed)
        result = env.rollout(rows, cycling_policy(tok, rows, registry.names, calls), sampling, validate)
        env.client.close()
    return result, calls


@pytest.mark.parametrize("fork", [0, 1, 2])
def test_a_group_shares_its_trunk_up_to_the_fork_turn_and_marks_that_turn(tok, fork):
    result, calls = play(tok, [fork])
    turns = result.info["turns"]
    models = [[t["model"] for t in ep] for ep in turns]
    for i, ep in enumerate(turns):
        assert len(ep) == 3 and ep[-1]["action"] == "answer"  # two hops, then the answer
        mask, ids = result.info["branch_mask"][i], result.response_ids[i]
        marked = [t for t, m in zip(ids, mask) if m]
        assert tok.decode(marked) == ep[fork]["generated"]  # exactly the fork turn's policy tokens
        start = mask.index(1)
        assert ids[:start] == result.response_ids[0][:start]  # the shared trunk, token for token
    assert all(m[:fork] == models[0][:fork] for m in models)  # the turns before the fork: the trunk's
    if fork < 2:
        assert len({m[fork] for m in models}) == 4  # each sibling asked its own model at the fork
    prompt = tuple(result.prompt_ids[0])
    assert [calls.get((prompt, t), 0) for t in range(3)] == [1 if t < fork else 4 for t in range(3)]


def test_a_trunk_that_ends_before_the_fork_turn_forks_at_its_last_turn(tok):
    result, calls = play(tok, [6])  # beyond the answer (turn 2)
    for i, ep in enumerate(result.info["turns"]):
        marked = [t for t, m in zip(result.response_ids[i], result.info["branch_mask"][i]) if m]
        assert tok.decode(marked) == ep[-1]["generated"] and ep[-1]["action"] == "answer"
    assert sorted(calls.values()) == [1, 1, 4]


def test_validation_and_an_unforked_run_play_each_episode_apart(tok):
    for result, calls in (play(tok, [1], validate=True), play(tok, [])):
        assert "branch_mask" not in result.info
        assert sorted(calls.values()) == [4, 4, 4]


def test_the_fork_turn_is_a_pure_function_of_uid_and_seed(tok):
    with ServerThread(SimBackend.from_pool_yaml(SIM, seed=0, latency_scale=0.0)) as srv:
        env, _ = make_env(tok, srv.url)
        env.client.close()
    env.cfg.branch_turns = [0, 1, 2]
    draws = [env.fork_turn_of(f"q{i}", SamplingParams(seed=s)) for i in range(20) for s in (1, 2)]
    assert draws == [env.fork_turn_of(f"q{i}", SamplingParams(seed=s)) for i in range(20) for s in (1, 2)]
    assert set(draws) == {0, 1, 2}


def test_branch_turns_are_refused_outside_the_continuous_schedule_and_below_zero():
    with pytest.raises(ValueError, match="continuous schedule only"):
        RouterEnvConfig(response_length=8, max_response_length=64, schedule="sync", branch_turns=[1]).check()
    with pytest.raises(ValueError, match=">= 0"):
        RouterEnvConfig(response_length=8, max_response_length=64, branch_turns=[-1]).check()


def test_the_fork_turn_gets_the_sibling_advantage_and_every_other_token_the_estimators(tok):
    """PPO (GAE) on a forked group: on the marked tokens the advantage is score - group mean over the group's
    std; the shared trunk and the turns after the fork keep GAE's."""
    ids = [[5, 6, 7, 8, 9, 10]] * 4
    mask = [[1, 1, 0, 0, 1, 1]] * 4  # a policy turn, an <information> block, the fork turn
    branch = [[0, 0, 0, 0, 1, 1]] * 4
    scores = np.array([1.0, 0.0, 0.0, 0.6], dtype=np.float32)
    rows = [types.SimpleNamespace(uid="g")] * 4

    def advantages(info, **alg):
        cfg = OmegaConf.create({"algorithm": OmegaConf.structured(AlgorithmConfig(use_kl_in_reward=False, **alg))})
        trainer = types.SimpleNamespace(tokenizer=tok, cfg=cfg, env=types.SimpleNamespace(), ref=None, floor_ids=[])
        batch = PPOTrainer.to_batch(trainer, RolloutResult([[1, 2]] * 4, ids, mask, info), rows, scores,
                                    SamplingParams(temperature=1.0))
        m = batch.batch["response_mask"].float()
        batch.batch["values"] = torch.full_like(m, 0.25)
        metrics: dict = {}
        return PPOTrainer._advantages(trainer, batch, m, metrics)["advantages"], metrics

    plain, _ = advantages({})
    forked, metrics = advantages({"branch_mask": branch})
    on = torch.tensor(branch, dtype=torch.bool)
    s = torch.as_tensor(scores)
    expected = ((s - s.mean()) / (s.std() + 1e-6))[:, None].expand(4, 6)
    assert torch.allclose(forked[on], expected[on], atol=1e-5)
    assert torch.equal(forked[~on], plain[~on])
    assert not torch.allclose(forked[on], plain[on])
    assert metrics["adv/fork_token_share"] == pytest.approx(0.5)
    alone, _ = advantages({"branch_mask": branch}, fork_only=True)  # algorithm.fork_only: the fork turns alone
    assert torch.equal(alone[on], forked[on]) and not alone[~on].any() and plain[~on].any()
    with pytest.raises(ValueError, match="fork_only trains the fork turns"):
        advantages({}, fork_only=True)
