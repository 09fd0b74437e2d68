"""Cost as the bill shows it: each pool call's prompt tokens at the model's input price plus its completion tokens at
the output price (`billed_usd`), beside the reference's output-only cost (`cost_usd`), in the episodes, the
evaluation summary and, with env.cost_basis billed, the reward."""
import json
import math
import re

import numpy as np
import pytest

from router_r1.eval import report
from router_r1.eval.evaluate import EvalConfig, Policy, evaluate
from router_r1.pool.messages import submodel_messages
from router_r1.pool.registry import ModelRegistry
from router_r1.router_env import RouterEnv, RouterEnvConfig
from router_r1.reward.cost import COST_FIELDS
from sim.backend import SimBackend
from sim_split import sim_test_split
from verl.trainer.dataset import PromptRow
from verl.trainer.env_interface import RolloutResult
from verl.workers.rollout.base import GenOutput

from pathlib import Path

SIM = Path(__file__).resolve().parents[1] / "configs" / "pool" / "sim.yaml"
BIG, CHEAP = "Mixtral-8x22B-Instruct", "LLaMA-3.1-8B-Instruct"


def bill(model: str, query: str) -> tuple[float, float, int]:
    """(output-only cost, billed cost, prompt tokens) of asking the simulated `model` `query`, priced here."""
    spec = ModelRegistry.from_yaml(SIM)[model]
    backend = SimBackend.from_pool_yaml(SIM, seed=0, latency_scale=0.0)
    _, pt, ct = backend.respond(spec.api_id, submodel_messages(query), spec.max_tokens)
    return ct * spec.price_out_per_m / 1e6, (pt * spec.price_in_per_m + ct * spec.price_out_per_m) / 1e6, pt


def ask_then_answer(tok):
    """A policy that asks BIG the whole question, then answers 'x'."""
    def generate(prompts, sampling):
        outs = []
        for ids in prompts:
            text = tok.decode(ids)
            q = re.search(r"Question: (.*)\n", text).group(1)
            turn = "<think>done</think><answer>x</answer>" if "<information>" in text else \
                f"<think>ask</think><search>{BIG}: {q}</search>"
            outs.append(GenOutput(tok(turn, add_special_tokens=False)["input_ids"], "stop"))
        return outs
    return generate


def test_the_sim_pools_carry_input_prices():
    for spec in ModelRegistry.from_yaml(SIM).models.values():
        assert spec.price_in_per_m == spec.price_out_per_m > 0, spec.name


def test_evaluation_bills_the_prompt_tokens_beside_the_references_cost(tmp_path, tok):
    (tmp_path / "data").mkdir()
    test_file = sim_test_split(tmp_path / "data", test_size=4)
    cfg = EvalConfig(data=[str(test_file)], sim=True, out=str(tmp_path / "out"), max_obs_length=200,
                     response_length=64, max_response_length=1024, checkpoints=["scripted"],
                     baselines=[f"single:{CHEAP}"], schedule="sync")
    summary = evaluate(cfg, load=lambda c: Policy(tok, ask_then_answer(tok)), log=lambda msg: None)
    records = [json.loads(x) for x in (tmp_path / "out" / "trajectories.jsonl").read_text().splitlines()]
    for r in records:
        model = BIG if r["run"] == "scripted" else CHEAP
        output, billed, prompt_tokens = bill(model, r["question"])
        assert prompt_tokens > 0
        assert r["cost_usd"] == pytest.approx(output, rel=1e-12)  # the reference's: output tokens only
        assert r["billed_usd"] == pytest.approx(billed, rel=1e-12) and r["billed_usd"] > r["cost_usd"]
        (call,) = [t for t in r["turns"] if "ok" in t]
        assert call["billed_usd"] == pytest.approx(billed, rel=1e-12) and call["prompt_tokens"] == prompt_tokens
    router, single = summary["runs"]
    for run in (router, single):
        o = run["overall"]
        mine = [r for r in records if r["run"] == run["label"]]
        assert o["billed_1e6_usd"] == pytest.approx(1e6 * np.mean([r["billed_usd"] for r in mine]))
        assert o["billed_usd"] > o["cost_usd"] and o["pool_prompt_tokens"] > 0
    # the router's own tokens are a column of their own; a baseline without a policy has none
    assert router["overall"]["router_tokens"] == pytest.approx(np.mean([r["policy_tokens"] for r in records
                                                                        if r["run"] == "scripted"]))
    assert router["overall"]["router_tokens"] > 0 and math.isnan(single["overall"]["router_tokens"])
    table = report.format_table(summary["runs"])
    assert "billed 1e-6$" in table and "router tok" in table
    row = next(x for x in table.splitlines() if x.startswith("scripted") and " overall " in x)
    assert f"{router['overall']['billed_1e6_usd']:.2f}" in row


def scored(basis: str, billed: list[float]) -> list[float]:
    """RouterEnv.score's cost rewards for three right answers of equal output cost and the given billed costs."""
    reg = ModelRegistry.from_yaml(SIM).seen()
    text = f"<think>ask</think><search>{BIG}: q</search><information>Paris.</information><think>ok</think>" \
           "<answer>Paris</answer>"
    n = len(billed)
    info = {"text": [text] * n, "turns": [[{"action": "answer"}]] * n, "cost_usd": [2e-6] * n,
            "billed_usd": billed, "route_count": [1] * n, "hit_budget": [False] * n, "pool_failures": [0] * n}
    result = RolloutResult(prompt_ids=[[1]] * n, response_ids=[[1]] * n, response_mask=[[1]] * n, info=info)
    rows = [PromptRow([1], str(i), {"reward_model": {"ground_truth": {"target": ["Paris"]}}}) for i in range(n)]
    env = RouterEnv(RouterEnvConfig(max_turns=2, max_obs_length=64, response_length=32, max_response_length=256,
                                    alpha=0.5, cost_basis=basis), None, reg, None)
    env.score(result, rows, validate=False)  # fills the window, then the same costs are read against it
    _, metrics = env.score(result, rows, validate=False)
    assert metrics["cost_usd"] == [2e-6] * n and metrics["billed_usd"] == billed  # both reported either way
    return metrics["cost_reward"]


def test_the_reward_reads_the_billed_cost_only_when_asked():
    billed = [3e-6, 6e-6, 9e-6]
    assert len(set(scored("output", billed))) == 1  # the default: equal output costs, equal R_cost
    low, mid, high = scored("billed", billed)
    assert low > mid > high
    with pytest.raises(ValueError, match="env.cost_basis must be one of output|billed"):
        RouterEnvConfig(max_turns=2, max_obs_length=64, response_length=32, max_response_length=256,
                        cost_basis="input").check()
    assert COST_FIELDS == {"output": "cost_usd", "billed": "billed_usd"} and RouterEnvConfig.cost_basis == "output"
