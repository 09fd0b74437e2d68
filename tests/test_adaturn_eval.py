"""AdaTurn evaluation: evaluate/test.sh --budget, infer.py --budget, tools/analysis/eval_budgets.py (real sim pool)."""
import json
import re

import pandas as pd
import pytest

import infer
from router_r1.eval.evaluate import EvalConfig, EvalError, Policy, evaluate, parse_args, with_training_shape
from router_r1.eval.evaluate import main as evaluate_main
from router_r1.runtime import open_pool
from router_r1.prompts import BUDGET_EXHAUSTED_TEXT, budget_text
from router_r1.router_env import RouterEnvConfig
from sim_split import TEMPLATE, sim_test_split
from tools.analysis import eval_budgets
from verl.workers.rollout.base import GenOutput, SamplingParams

BIG, CHEAP = "Mixtral-8x22B-Instruct", "LLaMA-3.1-8B-Instruct"


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    path = sim_test_split(tmp_path_factory.mktemp("data"), test_size=6, two_hop_frac=0.5)
    return path, {r["extra_info"]["question"]: list(r["reward_model"]["ground_truth"]["target"])
                  for r in pd.read_parquet(path).to_dict("records")}


class TwoCalls:
    """Ask BIG, then CHEAP, then answer gold; answer at once when told the budget is spent."""

    def __init__(self, tok, golds):
        self.tok, self.golds, self.prompts = tok, golds, []

    def __call__(self, prompts, sampling):
        outs = []
        for ids in prompts:
            text = self.tok.decode(ids)
            q = re.search(r"Question: (.*)\n", text).group(1)
            if not any(p in text for p in self.prompts):
                self.prompts.append(text)
            calls = text.count("<information>")
            if BUDGET_EXHAUSTED_TEXT in text or calls >= 2:
                turn = f"<think>done</think><answer>{self.golds[q][0]}</answer>"
            else:
                turn = f"<think>ask</think><search>{(BIG, CHEAP)[calls]}: {q}</search>"
            outs.append(GenOutput(self.tok(turn, add_special_tokens=False)["input_ids"], "stop"))
        return outs


def run_eval(tmp_path, test_file, policy, **kw):
    cfg = EvalConfig(data=[str(test_file)], sim=True, out=str(tmp_path / "out"), max_obs_length=200,
                     response_length=64, max_response_length=1024, checkpoints=["p"], **kw)
    return evaluate(cfg, load=lambda c: policy, log=lambda msg: None)


def test_budget_flag_states_and_enforces_the_budget(tmp_path, tok, data):
    test_file, golds = data
    n = len(golds)
    runs = {}
    for name, kw in {"end1": dict(budget=1), "forced1": dict(budget=1, budget_mode="forced"),
                     "two": dict(budget=2), "notext": dict(budget=1, budget_text=False)}.items():
        policy = TwoCalls(tok, golds)
        runs[name] = (run_eval(tmp_path / name, test_file, Policy(tok, policy, template=TEMPLATE), **kw)
                      ["runs"][0]["overall"], policy.prompts)
    end, forced, two, notext = (runs[k][0] for k in ("end1", "forced1", "two", "notext"))
    assert (end["calls"], end["hit_budget"], end["forced"], end["em"]) == (1.0, 1.0, 0.0, 0.0)
    assert (forced["calls"], forced["hit_budget"], forced["forced"], forced["em"]) == (1.0, 0.0, 1.0, 1.0)
    assert forced["format_ok"] == 1.0
    assert (two["calls"], two["hit_budget"], two["em"]) == (2.0, 0.0, 1.0)
    assert all(budget_text(1).strip() in p for p in runs["end1"][1]) and len(runs["end1"][1]) == n
    assert all(budget_text(2).strip() in p for p in runs["two"][1])
    assert not any("at most" in p for p in runs["notext"][1]) and notext["hit_budget"] == 1.0
    records = [json.loads(x) for x in (tmp_path / "forced1" / "out" / "trajectories.jsonl").read_text().splitlines()]
    assert all(r["turn_budget"] == 1 and r["forced"] for r in records)


def test_budget_needs_a_template_with_a_budget_slot(tmp_path, tok, data):
    test_file, golds = data
    with pytest.raises(EvalError, match=r"\{budget\}"):
        run_eval(tmp_path, test_file, Policy(tok, TwoCalls(tok, golds), template="Q: {question}\n"), budget=1)


def test_cli_budget_flags(data):
    test_file, _ = data  # test.sh hands every argument to this parser
    cfg = parse_args(["--data", str(test_file), "--budget", "2", "--budget-mode", "forced", "--no-budget-text"])
    assert (cfg.budget, cfg.budget_mode, cfg.budget_text) == (2, "forced", False)
    plain = parse_args(["--data", str(test_file)])
    assert (plain.budget, plain.budget_mode, plain.budget_text) == (None, "end", True)
    plain, cfg = (with_training_shape(c, log=lambda msg: None) for c in (plain, cfg))  # the env: the paper run's
    assert plain.router_config().budgets == [] and cfg.router_config().budgets == [2]
    assert cfg.router_config(max_turns=0).budgets == []  # the direct baseline keeps its own limit
    assert evaluate_main(["--data", str(test_file), "--budget", "-1", "--sim"]) == 2


def test_infer_budget_forced_answer_is_recorded_and_rendered(tok, data):
    _, golds = data
    question = next(iter(golds))
    rcfg = RouterEnvConfig(max_turns=4, max_obs_length=200, response_length=64, max_response_length=1024,
                           schedule="sync", budgets=[1], budget_in_prompt=False, budget_mode="forced")
    policy = TwoCalls(tok, golds)
    with open_pool(sim=True) as pool:
        record = infer.run_question(question, Policy(tok, policy, template=TEMPLATE), pool, rcfg,
                                    SamplingParams(greedy=True, temperature=0.0), gold=golds[question], budget=1)
    assert budget_text(1).strip() in policy.prompts[0]
    assert record["forced"] and not record["hit_budget"] and record["turn_budget"] == 1
    assert [t["action"] for t in record["turns"]] == ["route", "route", "answer"] and record["turns"][1]["refused"]
    assert record["calls"] == 1 and record["em"] == 1.0 and record["format_ok"]
    text = infer.render(record, color=False)
    assert "refused, the turn budget is spent" in text and f"answer  {golds[question][0]}" in text


def test_eval_budgets_table_json_and_curve(tmp_path, tok, data):
    test_file, golds = data
    base = EvalConfig(data=[str(test_file)], sim=True, max_obs_length=200, response_length=64,
                      max_response_length=1024)
    load = lambda c: Policy(tok, TwoCalls(tok, golds), template=TEMPLATE)  # noqa: E731
    rows = eval_budgets.budget_rows(base, [("aware", "a", True), ("plain", "p", False)], [1, 2], ["forced"],
                                    tmp_path, load=load, log=lambda m: None)
    assert len(rows) == 2 * 2
    by = {(r["run"], r["mode"], r["budget"]): r for r in rows}
    assert by["aware", "forced", 1]["forced"] == 1.0 and by["aware", "forced", 1]["em"] == 1.0
    assert by["plain", "forced", 2]["calls"] == 2.0 and by["plain", "forced", 2]["truncated"] == 0.0
    assert by["plain", "forced", 2]["forced"] == 0.0 and by["aware", "forced", 1]["calls"] == 1.0
    md = eval_budgets.markdown(rows)
    assert md.count("\n") == 2 + len(rows) and "| aware | forced | 1 |" in md
    (tmp_path / "a.json").write_text(json.dumps({"rows": rows[:2]}))
    (tmp_path / "b.json").write_text(json.dumps({"rows": rows[2:]}))
    assert eval_budgets.main(["--merge", str(tmp_path / "a.json"), str(tmp_path / "b.json"),
                              "--out", str(tmp_path / "m")]) == 0
    assert json.loads((tmp_path / "m" / "budgets.json").read_text())["rows"] == rows
    assert (tmp_path / "m" / "budgets.md").read_text() == md
    assert (tmp_path / "m" / "budgets.png").read_bytes()[:4] == b"\x89PNG"
    assert eval_budgets.split_label("x=out/hf") == ("x", "out/hf")
    assert eval_budgets.split_label("out/a=b") == (None, "out/a=b")
