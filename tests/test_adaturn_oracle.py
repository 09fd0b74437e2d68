"""The budget-aware oracle (sim/warm_start/budget.py): trajectories that respect the stated budget."""
from pathlib import Path

import pandas as pd
import pytest

from sim.warm_start.budget import CONTROL, reward_text
from sim.warm_start.build import build_rows, run
from sim.warm_start.cli import main
from sim.warm_start.recipe import make_recipe
from router_r1.pool.registry import ModelRegistry
from router_r1.prompts import budget_exhausted_message, budget_text
from router_r1.actions import parse_action
from router_r1.reward.format import check_format
from tiny import tiny_tokenizer
from verl.trainer.sft_data import tokenize_example

SIM = Path(__file__).resolve().parents[1] / "configs" / "pool" / "sim.yaml"
TEMPLATE = "Route or answer.\n{budget}Question: {question}\n"
RECIPE = str(Path(__file__).resolve().parents[1] / "configs" / "recipes" / "budget.yaml")


def recipe(**kw):
    """The budget oracle's own defaults before it folded into sim.warm_start: noise 0.2, forced 0.3, no tokenizer."""
    return make_recipe(**{"noise": 0.2, "forced_frac": 0.3, "tokenizer": False, **kw})


@pytest.fixture(scope="module")
def rows(tmp_path_factory):
    t = tmp_path_factory.mktemp("tpl") / "t.txt"
    t.write_text(TEMPLATE)
    return build_rows(recipe(out_dir="unused", n=150, budgets=[0, 1, 2], forced_frac=0.5, noise=0.0,
                             two_hop_frac=0.5), t).rows


def test_every_row_states_its_budget_and_keeps_to_it(rows):
    registry = ModelRegistry.from_yaml(SIM).seen()
    assert {r["budget"] for r in rows} == {0, 1, 2}
    for r in rows:
        assert budget_text(r["budget"]).strip() in r["prompt"][0]["content"]
        assert r["routes"] <= r["budget"] and len(r["route_models"]) == r["routes"]
        assert check_format(reward_text(r["segments"]), registry) == (True, "ok")
        assert r["response_text"] == "".join(s["text"] for s in r["segments"])
        policy_routes = [s for s in r["segments"] if s["by_policy"] and "<search>" in s["text"]]
        assert len(policy_routes) == r["routes"]  # a refused route leaves no text
    assert all(r["routes"] == 0 for r in rows if r["budget"] == 0)


def test_small_budgets_change_the_plan(rows):
    registry = ModelRegistry.from_yaml(SIM).seen()
    two_hop_b1 = [r for r in rows if r["budget"] == 1 and r["data_source"] == "sim_2hop" and not r["forced"]]
    two_hop_b2 = [r for r in rows if r["budget"] == 2 and r["data_source"] == "sim_2hop" and not r["forced"]]
    assert two_hop_b1 and two_hop_b2
    for r in two_hop_b1:  # one call for two facts: the whole question at once
        route = parse_action(r["segments"][0]["text"], registry)
        assert route.kind == "route" and route.query == r["question"]
    assert any(r["routes"] == 2 for r in two_hop_b2)  # enough budget: hop by hop
    assert sum(r["em"] for r in two_hop_b1) > 0  # composing experts answer some of them


def test_forced_examples_show_the_control_message_as_environment_text(rows):
    forced = [r for r in rows if r["forced"]]
    assert forced and all(r["mode"] == "forced" for r in forced)
    assert {r["budget"] for r in forced} >= {0, 1}
    assert CONTROL == budget_exhausted_message()
    tok = tiny_tokenizer()
    for r in forced:
        segs = r["segments"]
        k = next(i for i, s in enumerate(segs) if s["text"] == CONTROL)
        assert not segs[k]["by_policy"] and k == len(segs) - 2  # the control message, then the answer
        assert segs[-1]["by_policy"] and "<answer>" in segs[-1]["text"]
        assert r["routes"] == r["budget"]  # the budget was spent before the refused call
        ex = tokenize_example(tok, r["prompt"], segs)  # SFT trains the answer, never the control message
        control_ids = tok(CONTROL, add_special_tokens=False)["input_ids"]
        answer_ids = tok(segs[-1]["text"], add_special_tokens=False)["input_ids"]
        start = len(ex.ids) - len(answer_ids) - len(control_ids)
        assert ex.ids[start:start + len(control_ids)] == control_ids
        assert ex.mask[start:start + len(control_ids)] == [0] * len(control_ids)
        assert ex.mask[-len(answer_ids):] == [1] * len(answer_ids)


def test_run_writes_the_parquet_and_bad_flags_are_errors(tmp_path, capsys):
    t = tmp_path / "t.txt"
    t.write_text(TEMPLATE)
    written = run(recipe(out_dir=tmp_path / "o", n=20, budgets=[1, 3], prompt_template=t, report=True))
    frame = pd.read_parquet(written["oracle"])
    assert len(frame) == 20 and set(frame["budget"]) <= {1, 3} and "budget 3" in written["report"]
    assert (tmp_path / "o" / "prompt_template.txt").read_text() == TEMPLATE
    assert main(["--recipe", RECIPE, "--out-dir", str(tmp_path / "x"), "--n", "5", "--budgets", "2", "-1",
                 "--prompt-template", str(t)]) == 1
    assert "--budgets" in capsys.readouterr().err
    assert main(["--recipe", RECIPE, "--out-dir", str(tmp_path / "x"), "--n", "5", "--forced-frac", "2",
                 "--prompt-template", str(t)]) == 1
    assert "--forced-frac" in capsys.readouterr().err
