"""Alpha-conditioned oracle data (issue 31, sim/warm_start/alpha.py): each row's route is the plan of highest
expected reward at its alpha, its prompt states that alpha as the environment renders it, and routes only get
cheaper as alpha grows."""
import random
import re

import pandas as pd
import pytest

from sim.warm_start.alpha import GUESS, AlphaOracle, alpha0_costs, plan_shift
from sim.warm_start.build import build_rows, run
from sim.warm_start.cli import main
from sim.warm_start.name_swap import EntityNames
from sim.warm_start.recipe import make_recipe, parse_args
from router_r1.pool.client import PoolClient
from router_r1.pool.registry import ModelRegistry
from router_r1.pool.world import SIM_POOL
from sim.backend import SimBackend
from sim.world import SimWorld
from router_r1.prompts import alpha_text, load_template
from router_r1.reward.cost import CostNormalizer, cost_reward
from router_r1.reward.score import RewardConfig, compute_score
from router_r1.router_env import RouterEnv, RouterEnvConfig
from verl.trainer.dataset import PromptRow

ALPHAS = (0.0, 0.3, 0.6, 0.9)
GRID = [k / 10 for k in range(11)]
# what the alpha oracle's own CLI defaulted to before it folded into sim.warm_start
FLAGS = ["--alphas", "0", "0.3", "0.6", "0.9", "--noise", "0.05"]


def recipe(**kw):
    return make_recipe(**{"alphas": list(ALPHAS), "noise": 0.05, **kw})


@pytest.fixture(scope="module")
def oracle():
    registry = ModelRegistry.from_yaml(SIM_POOL).seen()
    world = SimWorld(seed=0)
    o = AlphaOracle(SimBackend.from_pool_yaml(SIM_POOL, seed=0, latency_scale=0.0, world=world), registry)
    questions = world.questions(300, 0, "train", 0.4)
    o.set_window(alpha0_costs(o, questions))
    return o, questions


@pytest.fixture(scope="module")
def written(tmp_path_factory):
    out = tmp_path_factory.mktemp("alpha_oracle")
    run(recipe(out_dir=out, n=120, alphas=list(ALPHAS), tokenizer=False))
    return out, pd.read_parquet(out / "oracle.parquet").to_dict("records")


def test_rows_carry_their_alpha_and_state_it(written):
    _, rows = written
    assert {r["alpha"] for r in rows} == set(ALPHAS)  # every alpha drawn over 120 rows (seeded)
    for r in rows:
        content = r["prompt"][0]["content"]
        assert alpha_text(r["alpha"]).strip() in content and content.count("Cost weight") == 1
        assert content.rstrip().endswith(r["question"])


def test_prompt_is_what_the_env_renders_for_that_alpha(written, tok):
    out, rows = written
    registry = ModelRegistry.from_yaml(SIM_POOL).seen()
    cfg = RouterEnvConfig(alphas=list(ALPHAS), response_length=16, max_response_length=256)
    env = RouterEnv(cfg, tok, registry, PoolClient(registry), template=load_template(out / "prompt_template.txt"))
    try:
        for i, r in enumerate(rows[:12]):
            row = PromptRow([0], r["uid"], {"extra_info": {"question": r["question"]}})
            built = tok(tok.apply_chat_template(list(r["prompt"]), add_generation_prompt=True, tokenize=False),
                        add_special_tokens=False)["input_ids"]
            assert env.budget_prompt(row, None, i, r["alpha"]) == built, r["uid"]
    finally:
        env.client.close()


def test_fixed_alpha_data_keeps_the_plain_prompt(tmp_path):
    run(recipe(out_dir=tmp_path, n=20, alphas=[0.9], alpha_text=False, tokenizer=False))
    rows = pd.read_parquet(tmp_path / "oracle.parquet").to_dict("records")
    assert {r["alpha"] for r in rows} == {0.9}
    assert not any("Cost weight" in r["prompt"][0]["content"] for r in rows)


def test_routes_never_get_dearer_as_alpha_grows(oracle):
    o, questions = oracle
    for q in questions:
        plans = [o.plan(q, 0, None, 0.0, set(), a, o.max_routes) for a in GRID]
        for lo, hi in zip(plans, plans[1:]):
            assert hi.cost_usd <= lo.cost_usd + 1e-15, (q.uid, lo.label, hi.label)
            # the expected cost penalty P(right) * (1 - R_cost) falls too (what the argmax trades away)
            pen = [p.p_right * (1 - cost_reward(p.cost_usd, o.bounds)) for p in (lo, hi)]
            assert pen[1] <= pen[0] + 1e-12


def test_where_the_default_pool_routes_differ(oracle):
    """In configs/pool/sim.yaml the cheap specialists (0.95) are the best plan up to alpha 0.8; at 0.9 two-hop
    questions whose first hop is Qwen's (science, business) ask the cheaper Mistral instead; no plan guesses."""
    o, questions = oracle
    shift = plan_shift(o, questions, GRID)
    assert all(shift[a]["differ"] == 0 for a in GRID if a <= 0.8)
    assert shift[0.9]["differ"] > 0.03 and shift[0.9]["cost_1e6"] < shift[0.0]["cost_1e6"]
    assert shift[0.9]["p_right"] < shift[0.0]["p_right"]
    assert all(shift[a][GUESS] == 0 for a in GRID)
    moved = [q for q in questions if o.plan(q, 0, None, 0.0, set(), 0.9, 3).label
             != o.plan(q, 0, None, 0.0, set(), 0.0, 3).label]
    assert moved and all(len(q.hops) == 2 and q.hops[0].domain in ("science", "business") for q in moved)


def test_plan_value_is_the_training_reward(oracle):
    """A right trajectory's reward, scored as training scores it against a window holding the alpha-0 costs, is
    the oracle's value at P(right) = 1."""
    o, questions = oracle
    registry = ModelRegistry.from_yaml(SIM_POOL).seen()
    costs, checked = alpha0_costs(o, questions), 0
    for q in questions[:40]:
        for a in (0.3, 0.9):
            traj, _ = o.run_alpha(q, a, random.Random(0))
            if traj.answer not in q.answers:
                continue
            norm = CostNormalizer(window=len(costs))
            norm.history.extend(c ** 0.5 for c in costs)
            score, _ = compute_score(traj.text, q.answers, traj.cost_usd, len(traj.routes), registry, norm,
                                     RewardConfig(alpha=a))
            assert score == pytest.approx(o.value(1.0, traj.cost_usd, a))
            checked += 1
    assert checked > 40


def test_bad_input_is_named(tmp_path, capsys):
    with pytest.raises(ValueError, match="--alphas"):
        build_rows(recipe(out_dir=tmp_path, n=5, alphas=[0.2, 1.5]), SIM_POOL)
    assert main(["--out-dir", str(tmp_path), *FLAGS, "--n", "5", "--no-tokenizer", "--cost-window", "3e-6",
                 "1e-6"]) == 1
    assert "--cost-window must be 0 <= LOW < HIGH" in capsys.readouterr().err


def test_renamed_rows_keep_their_routes_and_rename_consistently(tmp_path):
    # --rename 1 (issue 32's SFT data): the same rows, plans and costs, each row's entities renamed by one mapping
    cfg = dict(n=80, alphas=list(ALPHAS), tokenizer=False)
    run(recipe(out_dir=tmp_path / "plain", **cfg))
    run(recipe(out_dir=tmp_path / "renamed", rename=1.0, **cfg))
    plain, renamed = (pd.read_parquet(tmp_path / d / "oracle.parquet").to_dict("records") for d in ("plain", "renamed"))
    names = EntityNames.from_world(SimWorld(seed=0), reserved=set(
        re.findall(r"\w+", (tmp_path / "plain" / "prompt_template.txt").read_text())))
    pattern = names.pattern
    for p, r in zip(plain, renamed):
        assert r["renamed"] and not p["renamed"]
        for key in ("alpha", "plan", "mode", "route_models", "cost_usd", "em", "domain"):
            assert list(p[key]) == list(r[key]) if key == "route_models" else p[key] == r[key], (r["uid"], key)
        assert r["question"] != p["question"]
        content = r["prompt"][0]["content"]
        assert content.rstrip().endswith(r["question"]) and alpha_text(r["alpha"]).strip() in content
        assert r["response_text"] == "".join(s["text"] for s in r["segments"])
        assert [s["by_policy"] for s in p["segments"]] == [s["by_policy"] for s in r["segments"]]
        texts = lambda row: "\n".join([row["question"], row["response_text"], *row["answers"]])
        before, after = pattern.findall(texts(p)), pattern.findall(texts(r))
        assert len(before) == len(after) and pattern.sub("#", texts(p)) == pattern.sub("#", texts(r)), r["uid"]
        mapping = {}
        for old, new in zip(before, after):  # one renaming for the whole row: question, segments and answers
            assert mapping.setdefault(old, new) == new and new != old, (r["uid"], old, new)
            assert names.type_of[old] == names.type_of[new]
        assert len(set(mapping.values())) == len(mapping)


def test_whole_names_are_one_token(tmp_path):
    from transformers import AutoTokenizer

    world = SimWorld(seed=0, n_entities_per_type=20)
    assert main(["--out-dir", str(tmp_path), *FLAGS, "--n", "60", "--world-entities", "20", "--whole-names",
                 "--rename", "1"]) == 0
    tok = AutoTokenizer.from_pretrained(tmp_path / "tokenizer")
    person, company = world.by_type["person"][3], world.by_type["company"][3]
    assert " " in person and " " in company
    for name in (person, company):
        ids = tok(f"Who is {name}?", add_special_tokens=False)["input_ids"]
        assert name in [tok.decode([i]) for i in ids], name
    rows = pd.read_parquet(tmp_path / "oracle.parquet").to_dict("records")
    assert all(r["renamed"] for r in rows)


def test_every_stated_alpha_is_one_token(tmp_path):
    from transformers import AutoTokenizer

    from router_r1.prompts import alpha_text

    assert main(["--out-dir", str(tmp_path), *FLAGS, "--n", "20", "--world-entities", "20"]) == 0
    tok = AutoTokenizer.from_pretrained(tmp_path / "tokenizer")
    for alpha in (0, 0.15, 0.3, 0.35, 0.6, 0.9, 1):
        ids = tok(alpha_text(alpha), add_special_tokens=False)["input_ids"]
        assert f"{alpha:g}" in [tok.decode([i]).strip() for i in ids], alpha
        assert tok.decode(ids) == alpha_text(alpha)


def test_each_alpha_asks_every_question_at_every_alpha(tmp_path):
    # the sim_tradeoff pool, where the best route depends on alpha: rows that differ only in the stated alpha
    pool = "configs/pool/sim_tradeoff.yaml"
    run(recipe(out_dir=tmp_path, n=160, alphas=list(ALPHAS), each_alpha=True, noise=0.0, pool=pool,
                          tokenizer=False))
    rows = pd.read_parquet(tmp_path / "oracle.parquet").to_dict("records")
    assert len(rows) == 160
    groups = [rows[i:i + len(ALPHAS)] for i in range(0, len(rows), len(ALPHAS))]
    for g in groups:
        assert [r["alpha"] for r in g] == list(ALPHAS) and len({r["question"] for r in g}) == 1
        assert len({r["prompt"][0]["content"] for r in g}) == len(ALPHAS)  # the alpha sentence tells them apart
    assert len({r["question"] for r in rows}) == 40
    differ = sum(len({r["plan"] for r in g}) > 1 for g in groups)
    assert differ >= 10, differ  # the planner's routes change with alpha for many questions on this pool
    with pytest.raises(ValueError, match=r"--n \(10\) must be a multiple of the 4 alphas"):
        build_rows(recipe(out_dir=tmp_path, n=10, alphas=list(ALPHAS), each_alpha=True), SIM_POOL)


def test_think_alpha_restates_the_weight_before_each_pick_and_changes_nothing_else(tmp_path):
    cfg = dict(n=60, alphas=list(ALPHAS), pool="configs/pool/sim_tradeoff.yaml", tokenizer=False)
    run(recipe(out_dir=tmp_path / "plain", **cfg))
    run(recipe(out_dir=tmp_path / "think", think_alpha=True, **cfg))
    plain, think = (pd.read_parquet(tmp_path / d / "oracle.parquet").to_dict("records") for d in ("plain", "think"))
    stated = 0
    for p, t in zip(plain, think):
        assert list(p["route_models"]) == list(t["route_models"]) and p["prompt"][0]["content"] == t["prompt"][0]["content"]
        weight = f"Cost weight {t['alpha']:g}. "
        if t["mode"] == "oracle":  # the slips are the hop oracle's trajectories, as without the flag
            picks = re.findall(r"<think>([^<]*)</think><search>", t["response_text"])
            assert len(picks) == t["routes"] and all(f"{weight}Ask " in k for k in picks), t["response_text"]
            stated += len(picks)
        assert t["response_text"].replace(weight, "") == p["response_text"], t["uid"]
    assert stated >= 60


def test_think_alpha_at_start_opens_each_decision_with_the_weight_and_moves_nothing_else(tmp_path):
    cfg = dict(n=60, alphas=list(ALPHAS), pool="configs/pool/sim_tradeoff.yaml", tokenizer=False, think_alpha=True)
    run(recipe(out_dir=tmp_path / "pick", **cfg))
    run(recipe(out_dir=tmp_path / "start", think_alpha_at="start", **cfg))
    pick, start = (pd.read_parquet(tmp_path / d / "oracle.parquet").to_dict("records") for d in ("pick", "start"))
    opened = moved = 0
    for p, s in zip(pick, start):
        assert list(p["route_models"]) == list(s["route_models"]) and p["prompt"][0]["content"] == s["prompt"][0]["content"]
        weight = f"Cost weight {s['alpha']:g}. "
        if s["mode"] == "oracle":  # each decision (an ask or a guess) opens with the weight, once
            thinks = re.findall(r"<think>([^<]*)</think><(?:search|answer)>", s["response_text"])
            decisions = [k for k in thinks if k != "Answer found."]  # the last think reads a reply, decides nothing
            assert decisions and all(k.startswith(weight) and k.count(weight) == 1 for k in decisions), s["response_text"]
            opened += len(decisions)
            moved += s["response_text"] != p["response_text"]
        assert s["response_text"].replace(weight, "") == p["response_text"].replace(weight, ""), s["uid"]
    assert opened >= 60 and moved >= 30  # "A science fact. Cost weight 0.3. Ask" became "Cost weight 0.3. A science ..."
    flags = ["--out-dir", "x", *FLAGS, "--think-alpha"]
    assert parse_args([*flags, "--think-alpha-at", "start"]).per_alpha.think_alpha_at == "start"
    assert parse_args(flags).per_alpha.think_alpha_at == "pick"
    with pytest.raises(ValueError, match=r"--think-alpha-at start places the restated weight: it needs --think-alpha"):
        build_rows(recipe(out_dir=tmp_path, n=8, think_alpha_at="start"), SIM_POOL)
    with pytest.raises(ValueError, match=r"--think-alpha-at must be one of pick, start, got 'end'"):
        build_rows(recipe(out_dir=tmp_path, n=8, think_alpha=True, think_alpha_at="end"), SIM_POOL)
