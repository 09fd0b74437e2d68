"""Routing baselines (oracle, oracle-hops: the simulated world's, sim/oracle_baselines.py; knn, mlp): each picks
the right model in a small constructed case, and the evaluator runs them through the real simulated pool."""
import json
from pathlib import Path

import numpy as np
import pytest

from sim.qa import SimConfig, build_sim
from router_r1.eval.baselines import BaselineError, parse_baselines
from router_r1.eval.embed import HashedNgramEmbedder, make_embedder
from router_r1.eval.evaluate import EvalConfig, EvalError, evaluate
from router_r1.eval.learned_routers import KnnRouter, MlpRouter, Outcomes, choose, cost_bounds, r_cost, select_k
from router_r1.eval.routing_baselines import learned_picks, train_outcomes
from router_r1.pool.client import PoolResult
from router_r1.pool.registry import ModelRegistry
from router_r1.stages import capitalised_entities
from sim.oracle_baselines import oracle_episodes, oracle_hops_episodes
from sim.truth import SimTruth
from sim.world import SimWorld
from router_r1.reward.qa_em import em_score
from router_r1.runtime import open_pool

REPO = Path(__file__).resolve().parents[1]
SIM = REPO / "configs" / "pool" / "sim.yaml"
GEO, PEOPLE, SCI = "LLaMA-3.1-8B-Instruct", "Mistral-7B-Instruct", "Qwen2.5-7B-Instruct"
BIG = "Mixtral-8x22B-Instruct"


@pytest.fixture(scope="module")
def truth():
    return SimTruth.from_registry(ModelRegistry.from_yaml(SIM).seen(), seed=0)


def question(world: SimWorld, relations: tuple[str, ...]):
    return next(q for q in world.questions(200, seed=3, split="test")
                if tuple(h.relation for h in q.hops) == relations)


def test_oracle_picks_the_cheapest_expert_that_knows_the_question(truth):
    capital = question(truth.world, ("capital",))
    mentor = question(truth.world, ("mentor",))
    # one fact: the domain's cheap specialist (0.95), not Mixtral (0.92, dearer)
    assert truth.pick(truth.facts(capital.question)) == GEO
    assert truth.knowing(truth.facts(capital.question)) == [GEO, BIG]
    assert truth.pick(truth.facts(mentor.question)) == PEOPLE
    # two facts asked whole: the cheap experts compose badly (multi_hop 0.2-0.3), Mixtral best
    two = next(q for q in truth.world.questions(200, seed=3, split="test") if len(q.hops) == 2)
    assert truth.pick(truth.facts(two.question)) == BIG
    assert truth.p_right(BIG, truth.facts(two.question)) == pytest.approx(0.92 * 0.92 * 0.85)
    # restricted to some models, the best of those
    # (0.30 is within KNOW_MARGIN of 0.35, and Mistral is the cheaper)
    assert truth.pick(truth.facts(capital.question), among=[SCI, PEOPLE]) == PEOPLE
    assert truth.pick(truth.facts(capital.question), among=[SCI, "Gemma-2-27B-Instruct"]) == "Gemma-2-27B-Instruct"
    assert truth.facts("What is the weather like?") is None


def test_entities_of_a_question(truth):
    q = question(truth.world, ("founder",))
    name = q.hops[0].subject
    assert truth.entities(q.question) == [name]
    assert capitalised_entities(q.question) == [name]
    assert capitalised_entities("In which city was Tom Varen born?") == ["Tom Varen"]
    assert capitalised_entities("who founded acme?") == []


def test_oracle_baselines_through_the_sim_pool(truth):
    capital = question(truth.world, ("capital",))
    two = next(q for q in truth.world.questions(200, seed=3, split="test") if len(q.hops) == 2)
    qs = [capital.question, two.question]
    with open_pool() as pool:
        models = pool.registry.names
        eps = oracle_episodes(truth, models, qs, ["r0", "r1"], pool.client, 8, 128)
        hops = oracle_hops_episodes(truth, models, qs, ["r0", "r1"], pool.client, 8, 128)
    assert [e["turns"][0]["model"] for e in eps] == [GEO, BIG]
    assert all(e["route_count"] == 1 for e in eps)
    # oracle-hops: one call per fact, each to its domain's specialist; hop 2 asks about hop 1's answer
    assert hops[0]["route_count"] == 1 and hops[0]["turns"][0]["query"] == capital.question
    assert hops[1]["route_count"] == 2
    specialist = {"geography": GEO, "sports": GEO, "people": PEOPLE, "arts": PEOPLE, "science": SCI,
                  "business": SCI}
    assert [t["model"] for t in hops[1]["turns"][:2]] == [specialist[h.domain] for h in two.hops]
    first_answer = hops[1]["turns"][0]["information"].split(".")[0]
    assert first_answer in hops[1]["turns"][1]["query"]
    assert hops[1]["text"].count("<information>") == 2 and hops[1]["text"].endswith("</answer>")


def test_oracle_names_a_question_the_world_cannot_read(truth):
    with pytest.raises(BaselineError, match="row 7.*cannot read"):
        oracle_episodes(truth, [GEO], ["What is the weather like?"], ["row 7"], None, 8, 128)


def test_parse_baselines_groups():
    reg = ModelRegistry.from_yaml(SIM)
    kinds = [b.label for b in parse_baselines(["all"], reg, reg.seen())]
    assert kinds[-4:] == ["oracle", "oracle-hops", "knn", "mlp"] and len(kinds) == 10
    assert [b.label for b in parse_baselines(["routers", "knn"], reg, reg.seen())] == [
        "oracle", "oracle-hops", "knn", "mlp"]
    with pytest.raises(BaselineError, match="oracle-hops, knn, mlp"):
        parse_baselines(["knn:5"], reg, reg.seen())


# ---------------------------------------------------------------------------------- learned routers

def test_choice_rule_is_expected_reward_at_alpha():
    # model 0: right 60% for 1e-6 $; model 1: right 100% for 1e-4 $
    p = np.array([[0.6, 1.0]])
    c = np.array([[1e-6, 1e-4]])
    bounds = cost_bounds(np.array([1e-6, 1e-4]))
    assert r_cost(np.array([0.0, 1e-6, 1e-4]), bounds).tolist() == pytest.approx([1.0, 1.0, 0.0])
    assert choose(p, c, 0.0, bounds).tolist() == [1]  # accuracy only
    assert choose(p, c, 0.9, bounds).tolist() == [0]  # 0.6 * 1.0 > 1.0 * 0.1
    # a tie in expected reward goes to the cheaper model
    assert choose(np.array([[1.0, 1.0]]), c, 0.0, bounds).tolist() == [0]


def constructed_outcomes():
    """Geography questions: model A right and cheap; business questions: only model B right."""
    geo = [f"What is the capital of Land{i}?" for i in range(12)]
    biz = [f"Who founded Firm{i} Works?" for i in range(12)]
    correct = np.array([[1, 1]] * 12 + [[0, 1]] * 12, dtype=float)
    cost = np.array([[1e-6, 5e-5]] * 24)
    return Outcomes(["A", "B"], geo + biz, correct, cost)


@pytest.mark.parametrize("kind", ["knn", "mlp"])
def test_learned_routers_pick_the_model_that_knows_the_kind_of_question(kind):
    out = constructed_outcomes()
    tests = ["What is the capital of Land99?", "Who founded Firm77 Works?"]
    picks, detail = learned_picks(kind, out, tests, alpha=0.5, embedder="hashed", k=5)
    assert picks == ["A", "B"]  # A for geography (as right as B, cheaper), B where only B knows
    assert "hashed" in detail and "alpha 0.5" in detail


def test_knn_chooses_k_by_leave_one_out_on_the_train_split():
    # 12 geography questions only A knows, 6 business ones only B knows: a k above 5 lets geography outvote
    geo = [f"What is the capital of Land{i}?" for i in range(12)]
    biz = [f"Who founded Firm{i} Works?" for i in range(6)]
    out = Outcomes(["A", "B"], geo + biz, np.array([[1, 0]] * 12 + [[0, 1]] * 6, dtype=float),
                   np.array([[1e-6, 5e-5]] * 18))
    x = HashedNgramEmbedder().fit(out.questions).encode(out.questions)
    k, scores = select_k(x, out, 0.0, cost_bounds(out.cost), ks=(3, 5, 10, 20))
    assert k == 3 and scores[3] == scores[5] == 1.0 > scores[10]  # ties go to the smaller k
    assert list(scores) == [3, 5, 10]  # a k of the whole split is left out
    out = constructed_outcomes()
    picks, detail = learned_picks("knn", out, ["Who founded Firm77 Works?"], alpha=0.5, embedder="hashed")
    assert picks == ["B"] and "leave-one-out" in detail


def test_knn_and_mlp_estimates():
    out = constructed_outcomes()
    emb = HashedNgramEmbedder().fit(out.questions)
    x, t = emb.encode(out.questions), emb.encode(["Who founded Firm5 Works?"])
    p, c = KnnRouter(x, out, k=4).estimate(t)
    assert p.tolist() == [[0.0, 1.0]] and c[0].tolist() == pytest.approx([1e-6, 5e-5])
    p, c = MlpRouter(x, out).estimate(t)
    assert p[0, 0] < 0.2 and p[0, 1] > 0.8
    with pytest.raises(ValueError, match="--embedder"):
        make_embedder("bert")


class CountingClient:
    """A pool client that answers 'Paris' for model A and 'unknown' for B, counting calls."""

    def __init__(self):
        self.calls = 0

    def route(self, reqs):
        self.calls += len(reqs)
        return [PoolResult(True, "Paris. It is." if r.model == "A" else "unknown", 1, 2, 1e-6, 0.0, None, 1,
                           False, r.model) for r in reqs]


def test_train_outcomes_are_asked_once_and_cached(tmp_path):
    reg = ModelRegistry.from_dict({"models": [{"name": "A", "api_id": "a", "price_out_per_m": 1.0},
                                              {"name": "B", "api_id": "b", "price_out_per_m": 2.0}]})
    client = CountingClient()
    qs, golds = ["What is the capital of France?", "Capital of Gaul?"], [["Paris"], ["Paris"]]
    first = train_outcomes(client, reg, qs, golds, 8, tmp_path, "pool", log=lambda *_: None)
    assert client.calls == 4 and first.correct.tolist() == [[1, 0], [1, 0]]
    again = train_outcomes(client, reg, qs, golds, 8, tmp_path, "pool", log=lambda *_: None)
    assert client.calls == 4 and again.correct.tolist() == first.correct.tolist()
    train_outcomes(client, reg, qs, [["Lyon"], ["Paris"]], 8, tmp_path, "pool", log=lambda *_: None)
    assert client.calls == 8  # other golds: asked again


# ---------------------------------------------------------------------------------- end to end

def test_evaluate_runs_the_routing_baselines(tmp_path):
    build_sim(SimConfig(out_dir=tmp_path, train_size=60, val_size=1, test_size=10, two_hop_frac=0.4))
    cfg = EvalConfig(data=[str(tmp_path / "test.parquet")], skip_router=True, embedder="hashed",
                     baselines=["routers", "single:Mixtral-8x22B"], out=str(tmp_path / "eval"))
    summary = evaluate(cfg, log=lambda *_: None)
    runs = {r["label"]: r for r in summary["runs"]}
    assert "hashed" in runs["knn"]["detail"] and "60 train questions x 6 models" in runs["mlp"]["detail"]
    assert "sim world seed 0" in runs["oracle"]["detail"]
    # the oracle asks cheap specialists for one-hop questions: cheaper than Mixtral alone
    assert runs["oracle-hops"]["overall"]["cost_usd"] < runs["single:Mixtral-8x22B-Instruct"]["overall"]["cost_usd"]
    # the stages: oracle-hops splits every two-fact question and always asks the cheapest knowing expert
    assert runs["oracle-hops"]["overall"]["stages"]["decomposed"] == 1.0
    assert runs["oracle-hops"]["overall"]["stages"]["expert_best"] == 1.0
    assert runs["oracle"]["overall"]["stages"]["decomposed"] == 0.0
    assert runs["oracle"]["overall"]["stages"]["copy_ok"] == 1.0
    assert "vs_router" not in runs["oracle"]  # no router run to compare with
    records = [json.loads(x) for x in (tmp_path / "eval" / "trajectories.jsonl").read_text().splitlines()]
    assert all(r["format_ok"] for r in records)
    assert all(r["em"] == em_score(r["answer"], r["golds"]) for r in records)
    assert list(tmp_path.glob("router_outcomes/train_outcomes-*.json"))
    with pytest.raises(EvalError, match="no train data"):
        evaluate(EvalConfig(data=[str(tmp_path / "test.parquet")], skip_router=True, baselines=["knn"],
                            train_data=str(tmp_path / "nope.parquet"), out=str(tmp_path / "e2")), log=lambda *_: None)


def test_test_sh_adds_the_baselines_on_the_embedded_default(tmp_path):
    """Without --data/--pool/--baseline, test.sh passes TEST_BASELINES on beside the router; with any, it does not
    (PYTHON=echo shows the command it would run)."""
    import os
    import subprocess

    data = tmp_path / "test.parquet"
    data.write_text("")
    env = {**os.environ, "PYTHON": "echo", "ROUTER_TEST_DATA": str(data), "TEST_BASELINES": "oracle single:Mistral-7B"}

    def args(*extra, **more):
        run_env = {k: v for k, v in {**env, **more}.items() if v is not None}
        proc = subprocess.run(["bash", str(REPO / "test.sh"), *extra], cwd=REPO, env=run_env,
                              capture_output=True, text=True, timeout=60)
        assert proc.returncode == 0, proc.stderr
        return proc.stdout.split()

    got = args()
    assert got[got.index("--baseline") + 1] == "oracle" and "single:Mistral-7B" in got and str(data) in got
    assert args("--baseline", "knn").count("--baseline") == 1
    for flag in ("--data", "--pool", "--pool-url"):
        assert "--baseline" not in args(flag, "x"), flag
    assert "--baseline" not in args(TEST_BASELINES="")
    default = args(TEST_BASELINES=None)
    assert default[default.index("--baseline") + 1] == "all"  # unset: every baseline


def test_oracle_on_a_pool_without_sim_profiles_says_what_it_needs():
    from router_r1.eval.evaluate import EvalRow, Pool, Run, run_one

    reg = ModelRegistry.from_dict({"models": [{"name": "A", "api_id": "a", "price_out_per_m": 1.0}]}, source="real.yaml")
    rows = [EvalRow("u", "s", ["x"], [{"role": "user", "content": "q"}], "Who founded Acme?", "f row 0")]
    cfg = EvalConfig(data=["f"], alpha=0.0, max_obs_length=64)
    with pytest.raises(EvalError, match="oracle needs a simulated pool.*real.yaml names none"):
        run_one(Run("oracle", "oracle"), rows, Pool(reg, reg, None, "real"), None, cfg)
    with pytest.raises(EvalError, match="knn needs train data"):
        run_one(Run("knn", "knn"), rows, Pool(reg, reg, None, "real"), None, cfg)
