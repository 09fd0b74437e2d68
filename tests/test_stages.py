"""Stage diagnosis (router_r1/stages.py) on constructed trajectories over the simulated world, whose answer key
(sim/stages.py) router_r1 reaches through the pool's `world:` (router_r1/pool/world.py)."""
import math
from pathlib import Path

import pytest

from router_r1.pool.registry import ModelRegistry
from router_r1.pool.world import answer_key
from router_r1.stages import STAGES, stage_metrics, stage_rates, trajectory_stages

SIM = Path(__file__).resolve().parents[1] / "configs" / "pool" / "sim.yaml"
GEO, PEOPLE, SCI, BIG = "LLaMA-3.1-8B-Instruct", "Mistral-7B-Instruct", "Qwen2.5-7B-Instruct", "Mixtral-8x22B-Instruct"
SPECIALIST = {"geography": GEO, "sports": GEO, "people": PEOPLE, "arts": PEOPLE, "science": SCI, "business": SCI}


@pytest.fixture(scope="module")
def truth():
    return answer_key(ModelRegistry.from_yaml(SIM).seen(), seed=0)


@pytest.fixture(scope="module")
def qs(truth):
    all_q = truth.world.questions(200, seed=5, split="test")
    return next(q for q in all_q if len(q.hops) == 1), next(q for q in all_q if len(q.hops) == 2)


def call(model, query, info, ok=True):
    return {"action": "route", "model": model, "query": query, "ok": ok, "information": info}


def test_a_clean_one_hop_trajectory_passes_every_stage(truth, qs):
    one, _ = qs
    gold = one.answers[0]
    turns = [call(SPECIALIST[one.domain], one.question, f"{gold}. It is so."), {"action": "answer"}]
    st = trajectory_stages(one.question, [gold], turns, em=1.0, format_ok=True, truth=truth)
    assert st == {"format_ok": 1.0, "copy_ok": 1.0, "expert_ok": 1.0, "expert_best": 1.0, "gold_in_info": 1.0,
                  "em_given_gold": 1.0, "decomposed": None}


def test_each_failure_is_caught_where_it_happens(truth, qs):
    one, two = qs
    gold = one.answers[0]
    name = one.hops[0].subject
    # a garbled sub-question: the entity is lost; the world cannot read it, so no expert verdict
    garbled = one.question.replace(name, "Zzyzx Works")
    st = trajectory_stages(one.question, [gold], [call(BIG, garbled, "I can't tell.")], 0.0, True, truth)
    assert st["copy_ok"] == 0.0 and st["expert_ok"] is None and st["gold_in_info"] == 0.0
    assert st["em_given_gold"] is None
    # garbled into another entity of the world (issue 32's "Puluhil Works"): copy fails, the expert is judged
    # on the question it was asked
    other = "Who founded Puluhil Works?"
    st = trajectory_stages(one.question, [gold], [call(SCI, other, "Someone.")], 0.0, True, truth)
    assert st["copy_ok"] == 0.0 and st["expert_best"] == 1.0
    # right question, knowing but dear expert: expert ok, not the cheapest
    st = trajectory_stages(one.question, [gold], [call(BIG, one.question, f"{gold}.")], 1.0, True, truth)
    assert (st["expert_ok"], st["expert_best"]) == (1.0, 0.0)
    # a cheap expert of another domain: not ok
    wrong = next(m for m in (GEO, PEOPLE, SCI) if m != SPECIALIST[one.domain])
    st = trajectory_stages(one.question, [gold], [call(wrong, one.question, "I don't know.")], 0.0, True, truth)
    assert (st["expert_ok"], st["expert_best"]) == (0.0, 0.0)
    # the pool gave the answer, the router lost it
    st = trajectory_stages(one.question, [gold], [call(SPECIALIST[one.domain], one.question, f"It is {gold}.")],
                           0.0, False, truth)
    assert st["gold_in_info"] == 1.0 and st["em_given_gold"] == 0.0 and st["format_ok"] == 0.0
    # a failed call's text does not count as information
    st = trajectory_stages(one.question, [gold], [call(BIG, one.question, gold, ok=False)], 0.0, True, truth)
    assert st["gold_in_info"] == 0.0
    # no call at all: nothing to copy or judge
    st = trajectory_stages(one.question, [gold], [{"action": "answer"}], 0.0, True, truth)
    assert st["copy_ok"] is None and st["expert_ok"] is None and st["gold_in_info"] == 0.0


def test_two_hop_decomposition(truth, qs):
    _, two = qs
    h1, h2 = two.hops
    split = [call(SPECIALIST[h1.domain], h1.sub_question, f"{h1.answer}."),
             call(SPECIALIST[h2.domain], h2.sub_question, f"{h2.answer}.")]
    st = trajectory_stages(two.question, two.answers, split, 1.0, True, truth)
    assert st["decomposed"] == 1.0 and st["expert_best"] == 1.0 and st["copy_ok"] == 1.0
    whole = [call(BIG, two.question, "x"), call(BIG, two.question, "x")]  # asked twice, never split
    st = trajectory_stages(two.question, two.answers, whole, 0.0, True, truth)
    assert st["decomposed"] == 0.0 and st["expert_best"] == 1.0  # Mixtral is the oracle for the whole question
    assert trajectory_stages(two.question, two.answers, whole[:1], 0.0, True, None)["decomposed"] is None


def test_without_a_world_entities_come_from_capitalised_words():
    turns = [call("M", "Who directed the film Titanic?", "James Cameron directed it.")]
    st = trajectory_stages("Who directed Titanic?", ["James Cameron"], turns, 1.0, True, None)
    assert st["copy_ok"] == 1.0 and st["gold_in_info"] == 1.0 and st["expert_ok"] is None
    st = trajectory_stages("Who directed Titanic?", ["James Cameron"], [call("M", "Who directed it?", "-")], 0, True)
    assert st["copy_ok"] == 0.0


def test_a_world_that_judges_other_stages_is_refused(truth, qs):
    class Stray:
        def entities(self, text):
            return None

        def call_stages(self, question, calls, routable):
            return {"expert_ok": 1.0}

    one, _ = qs
    with pytest.raises(ValueError, match="call_stages gave .*expert_best"):
        trajectory_stages(one.question, ["x"], [call(GEO, one.question, "x")], 0.0, True, Stray())


def test_rates_and_training_metrics_skip_what_does_not_apply():
    a = dict.fromkeys(STAGES)
    a.update(format_ok=1.0, gold_in_info=1.0, em_given_gold=0.0)
    b = dict.fromkeys(STAGES)
    b.update(format_ok=0.0, gold_in_info=0.0)
    rates = stage_rates([a, b])
    assert rates["format_ok"] == 0.5 and rates["gold_in_info"] == 0.5 and rates["em_given_gold"] == 0.0
    assert math.isnan(rates["decomposed"])
    m = stage_metrics([a, b])
    assert set(m) == {f"stage/{s}" for s in STAGES}  # every key, so batches agree
    assert m["stage/em_given_gold"] == [0.0] and m["stage/decomposed"] == []


def test_training_env_reports_the_stages(truth, qs):
    """RouterEnv.score puts stage/* beside em and format_ok (a scripted trajectory, no policy)."""
    import numpy as np

    from router_r1.router_env import RouterEnv, RouterEnvConfig
    from verl.trainer.dataset import PromptRow
    from verl.trainer.env_interface import RolloutResult

    one, _ = qs
    gold = one.answers[0]
    reg = ModelRegistry.from_yaml(SIM).seen()
    model = SPECIALIST[one.domain]
    text = (f"<think>ask</think><search>{model}: {one.question}</search><information>{gold}.</information>"
            f"<think>ok</think><answer>{gold}</answer>")
    turns = [call(model, one.question, f"{gold}."), {"action": "answer"}]
    info = {"text": [text], "turns": [turns], "cost_usd": [1e-6], "route_count": [1], "hit_budget": [False],
            "pool_failures": [0]}
    result = RolloutResult(prompt_ids=[[1]], response_ids=[[1]], response_mask=[[1]], info=info)
    row = PromptRow([1], "u", {"extra_info": {"question": one.question}, "data_source": "sim_1hop",
                               "reward_model": {"ground_truth": {"target": [gold]}}})
    env = RouterEnv(RouterEnvConfig(max_turns=2, max_obs_length=64, response_length=32, max_response_length=256),
                    None, reg, None, truth=truth)
    scores, metrics = env.score(result, [row], validate=True)
    assert metrics["em"] == [1.0] and float(np.asarray(scores)[0]) == 1.0
    assert metrics["stage/copy_ok"] == [1.0] and metrics["stage/expert_best"] == [1.0]
    assert metrics["stage/gold_in_info"] == [1.0] and metrics["stage/decomposed"] == []


def test_make_env_adds_the_world_s_answer_key_for_a_simulated_pool():
    """The hook: a pool yaml naming a world gets its answer key (the expert and two-hop stages); one without a
    world gets the world-free stages."""
    from router_r1.router_env import RouterEnvConfig, make_env

    shape = dict(max_turns=2, max_obs_length=64, response_length=32, max_response_length=256, sim_seed=3)
    sim = make_env(RouterEnvConfig(pool=str(SIM), **shape), None, client=object())
    assert sim.truth is not None and sim.truth.world.seed == 3 and set(sim.truth.experts) == set(sim.registry.names)
    paper = make_env(RouterEnvConfig(pool=str(SIM.parent / "paper.yaml"), **shape), None, client=object())
    assert paper.truth is None


def test_cli_diagnoses_recorded_trajectories(tmp_path, qs, capsys):
    import json

    from router_r1.eval.stage_table import main

    one, _ = qs
    gold = one.answers[0]
    rec = {"run": "ppo", "data_source": "sim_1hop", "question": one.question, "golds": [gold], "em": 0.0,
           "format_ok": True, "turns": [call(BIG, one.question, f"{gold}."), {"action": "answer"}]}
    path = tmp_path / "trajectories.jsonl"
    path.write_text(json.dumps(rec) + "\n")
    assert main([str(path)]) == 0
    line = next(x for x in capsys.readouterr().out.splitlines() if x.startswith("ppo") and "overall" in x)
    # format, copy, expert ok, cheapest, gold in info, EM|gold, 2-hop split
    assert line.split()[2:] == ["1", "1.000", "1.000", "1.000", "0.000", "1.000", "0.000", "-"]
    path.write_text('{"run": "x"}\n')
    assert main([str(path)]) == 2 and "line 1" in capsys.readouterr().err
