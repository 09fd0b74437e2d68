"""AdaTurn on the routing side: per-prompt turn budgets, and the four budget modes, on the real sim pool.

The policy is scripted (it routes every hop to one model, and answers when it has all
hops or when told the budget is spent), so the tests pin the environment's rules.
"""
from pathlib import Path

import numpy as np
import pytest

from router_r1.router_env import make_env as factory
from router_r1.pool.client import PoolClient
from router_r1.pool.registry import ModelRegistry
from router_r1.pool.server import ServerThread
from sim.backend import SimBackend
from sim.world import SimWorld
from router_r1.prompts import BUDGET_EXHAUSTED_TEXT, budget_exhausted_message, budget_text
from router_r1.reward.format import check_format
from router_r1.router_env import RouterEnv, RouterEnvConfig
from scripted import scripted
from verl.trainer.dataset import PromptRow
from verl.workers.rollout.base import SamplingParams

SIM = Path(__file__).resolve().parents[1] / "configs" / "pool" / "sim.yaml"
BIG = "Mixtral-8x22B-Instruct"


@pytest.fixture(scope="module")
def two_hop():
    qs = SimWorld(seed=0).questions(40, seed=5, split="test", two_hop_frac=0.5)
    return [q for q in qs if len(q.hops) == 2][:4]


@pytest.fixture(scope="module")
def server():
    with ServerThread(SimBackend.from_pool_yaml(SIM, seed=0, latency_scale=0.0)) as srv:
        yield srv


def rows_of(questions):
    return [PromptRow([1, 2, 3], f"q{i}", {"reward_model": {"ground_truth": {"target": q.answers}},
                                          "extra_info": {"question": q.question}})
            for i, q in enumerate(questions)]


def env_for(tok, url, **cfg):
    registry = ModelRegistry.from_yaml(SIM, base_url=url).seen()
    base = dict(max_turns=4, max_obs_length=64, response_length=96, max_response_length=1024)
    return RouterEnv(RouterEnvConfig(**{**base, **cfg}), tok, registry, PoolClient(registry))


def policy(tok, questions, log=None):
    """Route hop k after k observations; answer with gold when all hops are in, or when told to."""
    def turn(q, context):
        if log is not None:
            log.append(context)
        body = context.split(f"Question: {q.question}", 1)[1]
        seen = body.count("<information>")
        if BUDGET_EXHAUSTED_TEXT in body or seen >= len(q.hops):
            return f"<think>answer now</think><answer>{q.answers[0]}</answer>"
        return f"<think>hop {seen}</think><search>{BIG}: {q.hops[seen].sub_question}</search>"
    return scripted(tok, questions, turn)


def run(tok, url, questions, validate=True, seed=None, **cfg):
    env = env_for(tok, url, **cfg)
    rows = rows_of(questions)
    result = env.rollout(rows, policy(tok, questions), SamplingParams(seed=seed), validate=validate)
    scores, metrics = env.score(result, rows, validate=validate)
    env.client.close()
    return result, scores, metrics


@pytest.mark.parametrize("schedule", ["overlap", "sync"])
def test_forced_answer_rolls_back_the_refused_turn(tok, server, two_hop, schedule):
    result, scores, metrics = run(tok, server.url, two_hop, budgets=(1,), budget_mode="forced", schedule=schedule)
    message = tok(budget_exhausted_message(), add_special_tokens=False)["input_ids"]
    for i, q in enumerate(two_hop):
        turns, ids, mask = result.info["turns"][i], result.response_ids[i], result.response_mask[i]
        assert result.info["forced"][i] and not result.info["hit_budget"][i]
        assert result.info["route_count"][i] == 1 and result.info["turn_budget"][i] == 1
        assert [t["action"] for t in turns] == ["route", "route", "answer"] and turns[1]["refused"]
        # The refused turn left no token; the control message is environment text right before the answer.
        policy_text = tok.decode([t for t, m in zip(ids, mask) if m])
        assert q.hops[1].sub_question not in tok.decode(ids)
        assert policy_text == turns[0]["generated"] + turns[2]["generated"]
        answer_ids = tok(turns[2]["generated"], add_special_tokens=False)["input_ids"]
        k = len(ids) - len(answer_ids) - len(message)
        assert ids[k:k + len(message)] == message and mask[k:k + len(message)] == [0] * len(message)
        assert mask[-len(answer_ids):] == [1] * len(answer_ids)
        # The reward reads the trajectory without the control message: format holds, answer is gold.
        assert BUDGET_EXHAUSTED_TEXT not in result.info["text"][i]
        assert check_format(result.info["text"][i], env_for(tok, server.url).registry) == (True, "ok")
    assert list(scores) == [1.0] * len(two_hop)
    assert metrics["forced"] == [1.0] * len(two_hop) and metrics["budget_1/em"] == [1.0] * len(two_hop)


def test_both_schedules_give_identical_forced_episodes(tok, server, two_hop):
    out = {s: run(tok, server.url, two_hop, budgets=(1, 2), budget_mode="forced", schedule=s, validate=False,
                  seed=7)[0] for s in ("overlap", "sync")}
    assert out["overlap"].response_ids == out["sync"].response_ids
    assert out["overlap"].response_mask == out["sync"].response_mask
    assert out["overlap"].info["forced"] == out["sync"].info["forced"]


def test_end_is_the_default_and_mask_and_penalize_baselines(tok, server, two_hop):
    end, end_scores, _ = run(tok, server.url, two_hop, budgets=(1,))
    masked, mask_scores, _ = run(tok, server.url, two_hop, budgets=(1,), budget_mode="mask")
    pen, pen_scores, _ = run(tok, server.url, two_hop, budgets=(1,), budget_mode="penalize")
    fine, fine_scores, _ = run(tok, server.url, two_hop, budgets=(2,), budget_mode="mask")
    for i in range(len(two_hop)):
        # end: the second route is not executed and the episode stops without an answer
        assert end.info["hit_budget"][i] and not end.info["forced"][i] and end.info["route_count"][i] == 1
        assert end.info["turns"][i][-1]["action"] == "route" and "ok" not in end.info["turns"][i][-1]
        assert sum(end.response_mask[i]) > 0
        assert masked.response_ids[i] == end.response_ids[i] and set(masked.response_mask[i]) == {0}
        assert pen.response_mask[i] == end.response_mask[i]
        # with enough budget nothing is masked
        assert not fine.info["hit_budget"][i] and sum(fine.response_mask[i]) > 0
    assert list(end_scores) == list(pen_scores) == [-1.0] * len(two_hop)
    assert list(fine_scores) == [1.0] * len(two_hop)


def test_penalize_overrides_a_gate_that_would_not_punish(tok, server, two_hop):
    # A budget-hit trajectory never holds an answer, so give it one by hand: the gate alone would say 1.
    env = env_for(tok, server.url, budgets=(0,), budget_mode="penalize")
    rows = rows_of(two_hop[:1])
    result = env.rollout(rows, policy(tok, two_hop), SamplingParams(), validate=True)
    result.info["text"][0] = f"<think>x</think><answer>{two_hop[0].answers[0]}</answer>"  # a right answer...
    scores, _ = env.score(result, rows, validate=True)  # ...but the episode hit the budget
    env.client.close()
    assert result.info["hit_budget"][0] and scores[0] == -1.0


def test_budget_is_stated_in_the_prompt_and_is_the_routing_limit(tok, server, two_hop):
    log = []
    env = env_for(tok, server.url, budgets=(0, 2), budget_mode="forced")
    rows = rows_of(two_hop)
    result = env.rollout(rows, policy(tok, two_hop, log), SamplingParams(), validate=True)
    env.client.close()
    budgets = result.info["turn_budget"]
    assert set(budgets) == {0, 2}
    assert [env.row_load(r, SamplingParams(), True) for r in rows] == budgets  # the engine's load hint agrees
    for i, b in enumerate(budgets):
        prompt = tok.decode(result.prompt_ids[i])
        assert budget_text(b).strip() in prompt and two_hop[i].question in prompt
        assert result.info["route_count"][i] == min(b, 2)
        assert result.info["forced"][i] == (b == 0)


def test_budget_draw_is_deterministic_per_uid_and_step(tok, server):
    env = env_for(tok, server.url, budgets=(1, 2, 3, 4, 5, 6), budget_seed=3)
    env.client.close()
    uids = [f"sim_1hop-train-{i}" for i in range(300)]
    step1 = [env.budget_of(u, SamplingParams(seed=11), validate=False) for u in uids]
    again = [env.budget_of(u, SamplingParams(seed=11), validate=False) for u in uids]
    step2 = [env.budget_of(u, SamplingParams(seed=12), validate=False) for u in uids]
    val1 = [env.budget_of(u, SamplingParams(greedy=True), validate=True) for u in uids]
    val2 = [env.budget_of(u, SamplingParams(greedy=True, seed=99), validate=True) for u in uids]
    assert step1 == again and val1 == val2  # resume draws the same; validation is one fixed mix
    assert step1 != step2  # a row seen at another step gets a fresh draw
    counts = np.bincount(step1, minlength=7)[1:]
    assert set(step1) == {1, 2, 3, 4, 5, 6} and counts.min() > 25  # roughly uniform over the set
    fixed = env_for(tok, server.url, budgets=(1, 2, 3), val_budget=8)
    fixed.client.close()
    assert fixed.budget_of("x", SamplingParams(), validate=True) == 8
    off = env_for(tok, server.url)
    off.client.close()
    assert off.budget_of("x", SamplingParams(seed=1), validate=False) is None


def test_bad_budget_config_and_rows_are_named(tok, server, two_hop):
    with pytest.raises(ValueError, match="budget_mode"):
        env_for(tok, server.url, budget_mode="drop")
    with pytest.raises(ValueError, match="budgets"):
        env_for(tok, server.url, budgets=(2, -1))
    env = env_for(tok, server.url, budgets=(2,))
    row = PromptRow([1, 2], "nq-train-7", {"reward_model": {"ground_truth": {"target": ["x"]}}})
    with pytest.raises(ValueError, match=r"row 0 \(uid nq-train-7\).*extra_info.question"):
        env.rollout([row], policy(tok, two_hop), SamplingParams(), validate=True)
    env.client.close()


def test_factory_reads_the_adaturn_keys(tok, server, tmp_path):
    template = tmp_path / "t.txt"
    template.write_text("Budget: {budget}Q: {question}")
    shape = {"response_length": 64, "max_response_length": 512}  # a run config links these to rollout.*
    env = factory({**shape, "pool": str(SIM), "pool_url": server.url, "budgets": [1, 3], "budget_seed": 4,
                   "val_budget": 2, "budget_mode": "forced", "prompt_template": str(template)}, tok)
    env.client.close()
    c = env.cfg
    assert (c.budgets, c.budget_seed, c.val_budget, c.budget_mode) == ([1, 3], 4, 2, "forced")
    assert env.template == "Budget: {budget}Q: {question}" and env.rules.budget_mode == "forced"
    plain = factory({**shape, "pool": str(SIM), "pool_url": server.url}, tok)
    plain.client.close()
    assert plain.cfg.budgets == [] and plain.cfg.budget_mode == "end"
