"""The multi-turn rollout against the real simulated pool server.

The policy here is scripted (it writes fixed turns), so the test isolates the manager:
context building, masks, pool calls, failure handling, turn budget, and scoring.
"""
from pathlib import Path

import pytest

from router_r1.pool.client import PoolClient
from router_r1.pool.registry import ModelRegistry
from router_r1.pool.server import FaultConfig, ServerThread
from sim.backend import SimBackend
from sim.world import SimWorld
from router_r1.prompts import build_router_prompt
from router_r1.actions import NO_REPLY_TEXT
from router_r1.router_env import RouterEnv, RouterEnvConfig
from verl.trainer.dataset import PromptRow
from verl.workers.rollout.base import GenOutput

SIM = Path(__file__).resolve().parents[1] / "configs" / "pool" / "sim.yaml"
BIG = "Mixtral-8x22B-Instruct"


@pytest.fixture(scope="module")
def questions():
    return SimWorld(seed=0).questions(6, seed=3, split="test", two_hop_frac=0.5)


def make_rows(tok, registry, questions):
    rows = []
    for i, q in enumerate(questions):
        messages = build_router_prompt(q.question, registry)
        text = tok.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
        ids = tok(text, add_special_tokens=False)["input_ids"]
        rows.append(PromptRow(ids, f"q{i}", {"reward_model": {"ground_truth": {"target": q.answers}},
                                            "question": q}))
    return rows


def scripted_policy(tok, rows, route_to=BIG, calls=None):
    """Route each oracle hop to `route_to`, then answer with the gold answer."""
    by_prompt = {tuple(r.prompt_ids): r.fields["question"] for r in rows}

    def generate(prompts, sampling):
        assert set(sampling.stop) == {"</search>", "</answer>"}
        outs = []
        for ids in prompts:
            p, q = next((p, q) for p, q in by_prompt.items() if tuple(ids[: len(p)]) == p)
            seen = tok.decode(ids[len(p):]).count("<information>")  # the prompt names the tag too
            if seen < len(q.hops):
                text = f"<think>hop {seen}</think><search>{route_to}: {q.hops[seen].sub_question}</search>"
            else:
                text = f"<think>done</think><answer>{q.answers[0]}</answer>"
            outs.append(GenOutput(tok(text, add_special_tokens=False)["input_ids"], "stop"))
        if calls is not None:
            calls.append(len(prompts))
        return outs

    return generate


def make_env(tok, url, schedule="continuous", max_turns=4, alpha=0.0, **client_kw):
    registry = ModelRegistry.from_yaml(SIM, base_url=url).seen()
    client = PoolClient(registry, **client_kw)
    cfg = RouterEnvConfig(max_turns=max_turns, max_obs_length=64, response_length=96, max_response_length=1024,
                          schedule=schedule, alpha=alpha)
    return RouterEnv(cfg, tok, registry, client), registry


@pytest.mark.parametrize("schedule", ["continuous", "overlap", "sync"])
def test_episodes_route_through_the_real_pool_and_score(tok, questions, schedule):
    with ServerThread(SimBackend.from_pool_yaml(SIM, seed=0, latency_scale=0.0)) as srv:
        env, registry = make_env(tok, srv.url, schedule)
        rows = make_rows(tok, registry, questions)
        result = env.rollout(rows, scripted_policy(tok, rows), _sampling(), validate=False)
        scores, metrics = env.score(result, rows, validate=False)
        env.client.close()

    for i, q in enumerate(questions):
        turns = result.info["turns"][i]
        assert result.info["route_count"][i] == len(q.hops)
        assert [t["model"] for t in turns[:-1]] == [BIG] * len(q.hops)
        assert all(t["ok"] and t["cost_usd"] > 0 for t in turns[:-1])
        assert result.info["cost_usd"][i] == pytest.approx(sum(t["cost_usd"] for t in turns[:-1]))
        # Mask: policy tokens decode to exactly the generated turns; the rest is <information>.
        ids, mask = result.response_ids[i], result.response_mask[i]
        policy = tok.decode([t for t, m in zip(ids, mask) if m == 1])
        env_text = tok.decode([t for t, m in zip(ids, mask) if m == 0])
        assert policy == "".join(t["generated"] for t in turns)
        assert env_text.count("<information>") == env_text.count("</information>") == len(q.hops)
        assert "<think>" not in env_text and "<search>" not in env_text
    assert metrics["format_ok"] == [1.0] * len(questions)
    assert list(scores) == [1.0] * len(questions)  # right answers, alpha = 0


def test_every_schedule_gives_the_same_episodes(tok, questions):
    out = {}
    with ServerThread(SimBackend.from_pool_yaml(SIM, seed=0, latency_scale=0.0)) as srv:
        for schedule in ("continuous", "overlap", "sync"):
            env, registry = make_env(tok, srv.url, schedule)
            rows = make_rows(tok, registry, questions)
            out[schedule] = env.rollout(rows, scripted_policy(tok, rows), _sampling(), validate=False)
            env.client.close()
    assert out["overlap"].response_ids == out["sync"].response_ids == out["continuous"].response_ids
    assert out["overlap"].response_mask == out["sync"].response_mask == out["continuous"].response_mask


def test_failed_pool_calls_become_observations(tok, questions):
    faults = FaultConfig(error_rate=1.0)  # every call fails with HTTP 500
    with ServerThread(SimBackend.from_pool_yaml(SIM, seed=0, latency_scale=0.0), faults=faults) as srv:
        env, registry = make_env(tok, srv.url, max_retries=1, backoff_base_s=0.01, backoff_max_s=0.02)
        rows = make_rows(tok, registry, questions[:2])
        result = env.rollout(rows, scripted_policy(tok, rows), _sampling(), validate=False)
        env.client.close()
    for i in range(2):
        assert result.info["pool_failures"][i] >= 1
        assert result.info["cost_usd"][i] == 0.0
        assert NO_REPLY_TEXT in result.info["text"][i]
        assert result.info["turns"][i][0]["error"] == "server_error"


def test_unknown_model_is_an_invalid_action_without_a_call(tok, questions):
    with ServerThread(SimBackend.from_pool_yaml(SIM, seed=0, latency_scale=0.0)) as srv:
        env, registry = make_env(tok, srv.url, max_turns=2)
        rows = make_rows(tok, registry, questions[:1])
        result = env.rollout(rows, scripted_policy(tok, rows, route_to="GPT-9-Ultra"), _sampling(), validate=False)
        scores, metrics = env.score(result, rows, validate=False)
        env.client.close()
    turns = result.info["turns"][0]
    assert [t["action"] for t in turns] == ["invalid", "invalid", "invalid"]  # 2 routing turns + the final one
    assert turns[0]["reason"] == "unknown_model"
    assert result.info["route_count"][0] == 0 and result.info["hit_budget"][0]
    assert scores[0] == -1.0  # never answered: broken format


def test_cost_windows_of_train_and_val_are_separate(tok, questions):
    with ServerThread(SimBackend.from_pool_yaml(SIM, seed=0, latency_scale=0.0)) as srv:
        env, registry = make_env(tok, srv.url, alpha=0.5)
        rows = make_rows(tok, registry, questions)
        result = env.rollout(rows, scripted_policy(tok, rows), _sampling(), validate=True)
        env.score(result, rows, validate=True)
        env.client.close()
    assert len(env.normalizers["val"]) == len(questions)
    assert len(env.normalizers["train"]) == 0
    state = env.state_dict()
    env.normalizers["val"] = type(env.normalizers["val"])()
    env.load_state_dict(state)
    assert len(env.normalizers["val"]) == len(questions)


def _sampling():
    from verl.workers.rollout.base import SamplingParams

    return SamplingParams(temperature=1.0, max_new_tokens=8)


def test_format_failures_are_counted_by_the_rule_that_broke(tok, questions):
    """Even rows answer at once without <think> (rule "start"); odd rows follow the protocol."""
    with ServerThread(SimBackend.from_pool_yaml(SIM, seed=0, latency_scale=0.0)) as srv:
        env, registry = make_env(tok, srv.url)
        rows = make_rows(tok, registry, questions)
        good = scripted_policy(tok, rows)
        bare = {tuple(r.prompt_ids) for r in rows[::2]}
        answer = tok("<answer>x</answer>", add_special_tokens=False)["input_ids"]

        def generate(prompts, sampling):
            outs = good(prompts, sampling)
            return [GenOutput(answer, "stop") if tuple(p) in bare else o for p, o in zip(prompts, outs)]

        result = env.rollout(rows, generate, _sampling(), validate=False)
        scores, metrics = env.score(result, rows, validate=False)
        env.client.close()
    n = len(rows)
    assert metrics["format_fail/start"] == [float(i % 2 == 0) for i in range(n)]
    assert all(metrics[f"format_fail/{r}"] == [0.0] * n for r in ("tags", "answer", "end", "think", "information",
                                                                   "route"))
    assert list(scores) == [-1.0 if i % 2 == 0 else 1.0 for i in range(n)]
