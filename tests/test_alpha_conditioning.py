"""Alpha-conditioned routing: a per-prompt cost weight, stated in the prompt, used by that prompt's reward;
and the routing-collapse diagnostics (call shares per source and their entropy). Real sim pool on loopback."""
import math
from pathlib import Path

import numpy as np
import pytest

from router_r1.router_env import make_env as factory
from router_r1.pool.client import PoolClient
from router_r1.pool.registry import ModelRegistry
from router_r1.pool.server import ServerThread
from sim.backend import SimBackend
from sim.world import SimWorld
from router_r1.prompts import TemplateError, alpha_text, build_router_prompt
from router_r1.reward.cost import CostNormalizer
from router_r1.reward.score import compute_scores
from router_r1.router_env import RouterEnv, RouterEnvConfig
from router_r1.routing_collapse import by_source, collapse_metrics
from scripted import scripted
from verl.trainer.dataset import PromptRow
from verl.workers.rollout.base import SamplingParams

SIM = Path(__file__).resolve().parents[1] / "configs" / "pool" / "sim.yaml"
BIG, CHEAP = "Mixtral-8x22B-Instruct", "LLaMA-3.1-8B-Instruct"


@pytest.fixture(scope="module")
def server():
    with ServerThread(SimBackend.from_pool_yaml(SIM, seed=0, latency_scale=0.0)) as srv:
        yield srv


@pytest.fixture(scope="module")
def questions():
    return [q for q in SimWorld(seed=0).questions(40, seed=5, split="test", two_hop_frac=0.0)][:8]


def env_for(tok, url, **cfg):
    registry = ModelRegistry.from_yaml(SIM, base_url=url).seen()
    base = dict(max_turns=2, max_obs_length=64, response_length=96, max_response_length=1024)
    return RouterEnv(RouterEnvConfig(**{"alpha": 0.5, **base, **cfg}), tok, registry, PoolClient(registry))


def rows_of(questions):
    return [PromptRow([1, 2, 3], f"sim-{i}", {"data_source": "one" if i % 2 else "two",
                                             "reward_model": {"ground_truth": {"target": q.answers}},
                                             "extra_info": {"question": q.question}})
            for i, q in enumerate(questions)]


def alpha_reader(tok, questions, seen):
    """Reads the cost weight from its prompt: under 0.5 it asks the dearest model, else a cheap one;
    after one reply it answers with the gold answer."""
    def turn(q, context):
        alpha = float(context.split("Cost weight for this question: ", 1)[1].split(" ", 1)[0])
        seen[q.question] = alpha
        if "<information>" in context.split(f"Question: {q.question}", 1)[1]:
            return f"<think>done</think><answer>{q.answers[0]}</answer>"
        return f"<think>ask</think><search>{BIG if alpha < 0.5 else CHEAP}: {q.question}</search>"
    return scripted(tok, questions, turn)


def test_prompt_states_the_drawn_alpha_and_the_reward_uses_it(tok, server, questions):
    env = env_for(tok, server.url, alphas=(0.0, 0.9), alpha_seed=1)
    rows, seen = rows_of(questions), {}
    result = env.rollout(rows, alpha_reader(tok, questions, seen), SamplingParams(seed=3), validate=False)
    alphas = result.info["alpha"]
    assert set(alphas) == {0.0, 0.9}  # both drawn over 8 prompts (seeded)
    assert [seen[q.question] for q in questions] == alphas  # each prompt stated its own alpha
    before = len(env.normalizers["train"])
    scores, metrics = env.score(result, rows, validate=False)
    assert len(env.normalizers["train"]) == before + len(rows)  # one window for every alpha
    for i, a in enumerate(alphas):
        assert metrics["em"][i] == 1.0 and metrics["format_ok"][i] == 1.0
        want = (1 - a) + a * metrics["cost_reward"][i]
        assert scores[i] == pytest.approx(want)  # that prompt's alpha, not env.alpha's 0.5
    # the cheap route at alpha 0.9 costs less than the dear one at 0
    assert np.mean(metrics["alpha_0.9/cost_usd"]) < np.mean(metrics["alpha_0/cost_usd"])
    assert len(metrics["alpha_0/em"]) + len(metrics["alpha_0.9/em"]) == len(rows)
    # validation: val_alpha fixes it; unset, the draw is per prompt and the same at every validation
    fixed = env_for(tok, server.url, alphas=(0.0, 0.9), val_alpha=0.3)
    assert fixed.alpha_of("x", SamplingParams(seed=1), validate=True) == 0.3
    v1 = [env.alpha_of(r.uid, SamplingParams(seed=1), True) for r in rows]
    assert v1 == [env.alpha_of(r.uid, SamplingParams(seed=2), True) for r in rows]
    assert env_for(tok, server.url).alpha_of("x", SamplingParams(), False) is None
    for e in (env, fixed):
        e.client.close()


def test_alpha_sentence_placement_and_bad_values(tok):
    registry = ModelRegistry.from_yaml(SIM).seen()
    default = build_router_prompt("Who?", registry, alpha=0.6)[0]["content"]
    assert alpha_text(0.6).strip() in default and "Cost weight for this question: 0.6 " in default
    assert build_router_prompt("Who?", registry)[0]["content"].count("Cost weight") == 0  # unconditioned: as before
    # a template written before conditioning: the sentence goes just before the budget sentence
    old = "Rules.\n{budget}Models:\n{pool}\nQuestion: {question}\n"
    text = build_router_prompt("Who?", registry, old, turn_budget=2, alpha=0.3)[0]["content"]
    assert text.index("Cost weight") < text.index("at most 2 times") < text.index("Models:")
    with pytest.raises(TemplateError, match="alpha"):
        build_router_prompt("Who?", registry, "Q: {question}", alpha=0.3)
    with pytest.raises(ValueError, match="alpha"):
        alpha_text(1.5)
    with pytest.raises(ValueError, match="alphas"):
        RouterEnvConfig(alphas=[0.2, 1.2], response_length=8, max_response_length=64).check()
    with pytest.raises(ValueError, match="alphas has 1 entries"):
        compute_scores(["x", "y"], [["a"], ["b"]], [0.0, 0.0], [0, 0], registry, CostNormalizer(), alphas=[0.1])


def test_factory_reads_the_alpha_keys(tok, server):
    env = factory({"pool": str(SIM), "pool_url": server.url, "alphas": [0, 0.6], "alpha_seed": 2,
                   "val_alpha": 0.6, "response_length": 64, "max_response_length": 512}, tok)
    assert env.cfg.alphas == [0.0, 0.6] and env.cfg.alpha_seed == 2 and env.cfg.val_alpha == 0.6
    env.client.close()


def test_collapse_metrics_shares_and_entropy():
    names = [BIG, CHEAP, "Mistral-7B-Instruct"]
    call = lambda m: {"model": m, "ok": True}  # noqa: E731
    turns = [[call(BIG)], [call(BIG), call(CHEAP)], [call(BIG)], [{"model": BIG}], []]  # 4th: never called
    sources = ["nq", "nq", "hotpot", "hotpot", "hotpot"]
    stats = by_source(turns, sources, names)
    nq_shares, nq_h = stats["nq"]
    assert nq_shares == {BIG: 2 / 3, CHEAP: 1 / 3, "Mistral-7B-Instruct": 0.0}
    assert nq_h == pytest.approx(-(2 / 3) * math.log2(2 / 3) - (1 / 3) * math.log2(1 / 3))
    assert stats["hotpot"][1] == 0.0  # collapsed: every call to one model
    assert stats["all"][0][BIG] == 0.75
    m = collapse_metrics(turns, sources, names)
    assert m["routing/hotpot/share/" + BIG] == [1.0] and m["routing/hotpot/entropy_bits"] == [0.0]
    empty = collapse_metrics([[]], ["x"], names)
    assert "routing/x/entropy_bits" not in empty and empty["routing/x/share/" + BIG] == [0.0]


def test_evaluation_report_carries_call_shares_and_entropy():
    from router_r1.eval import report

    call = lambda m: {"model": m, "ok": True, "latency_s": 0.1}  # noqa: E731
    base = dict(em=1.0, f1=1.0, format_ok=True, cost_usd=1e-5, cost_reward=0.5, reward=1.0, pool_failures=0,
                hit_budget=False)
    trajs = [{**base, "data_source": "nq", "turns": [call(BIG)], "models_called": [BIG], "route_count": 1},
             {**base, "data_source": "nq", "turns": [call(CHEAP)], "models_called": [CHEAP], "route_count": 1},
             {**base, "data_source": "hq", "turns": [call(BIG), call(BIG)], "models_called": [BIG], "route_count": 2}]
    s = report.summarize(trajs, [BIG, CHEAP])
    nq = s["sources"]["nq"]
    assert nq["call_share"] == {BIG: 0.5, CHEAP: 0.5} and nq["routing_entropy_bits"] == 1.0
    assert s["sources"]["hq"]["routing_entropy_bits"] == 0.0 and s["overall"]["call_share"][BIG] == 0.75
    table = report.format_table([{"label": "r", **s}])
    assert "H calls" in table and " 1.00" in table.splitlines()[-3]
