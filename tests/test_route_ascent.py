"""tools/analysis/route_ascent: the routing table learned at the route under known credit, on a tiny router."""
import json

import pandas as pd
import pytest

from router_r1.pool.registry import ModelRegistry
from tiny import tiny_model, tiny_tokenizer
from tools.analysis import route_ascent

pytestmark = pytest.mark.usefixtures("one_thread")
POOL = "configs/pool/sim.yaml"
DOMAINS = ["science", "business", "geography", "sports", "people", "arts"]


def test_q_table_pays_accuracy_times_the_cost_weighted_reward():
    names, q = route_ascent.q_table(POOL, alpha=0.6)
    # Qwen2.5-7B: 0.95 on science at $0.30 of the dearest $1.20; Mistral-7B: 0.30 there at $0.20
    assert q["science"]["Qwen2.5-7B-Instruct"] == pytest.approx(0.95 * (0.4 + 0.6 * (1 - 0.30 / 1.20)))
    assert q["science"]["Mistral-7B-Instruct"] == pytest.approx(0.30 * (0.4 + 0.6 * (1 - 0.20 / 1.20)))
    assert route_ascent.q_table(POOL, alpha=0.0)[1]["arts"]["Mixtral-8x22B-Instruct"] == pytest.approx(0.92)
    assert names == list(ModelRegistry.from_yaml(POOL).seen().models)


@pytest.fixture(scope="module")
def router(tmp_path_factory):
    """A tiny router whose listed names are whole tokens, saved as a checkpoint, and prompts of each domain."""
    root = tmp_path_factory.mktemp("ascent")
    names = list(ModelRegistry.from_yaml(POOL).seen().models)
    tok = tiny_tokenizer(extra_tokens=names)
    tiny_model(len(tok), seed=5).save_pretrained(root / "sft")
    tok.save_pretrained(root / "sft")
    for split, n in (("train", 60), ("test", 24)):
        rows = [{"prompt": [{"role": "user", "content": f"Question: fact {i} of {DOMAINS[i % 6]}?"}],
                 "extra_info": {"domain": DOMAINS[i % 6] + (">geography" if i % 5 == 0 else ""), "uid": f"{split}-{i}"}}
                for i in range(n)]
        pd.DataFrame(rows).to_parquet(root / f"{split}.parquet")
    return root


def run(router, tmp_path, *flags) -> list[dict]:
    out = tmp_path / "r.jsonl"
    route_ascent.main(["--checkpoint", str(router / "sft"), "--data", str(router / "train.parquet"),
                       "--eval-data", str(router / "test.parquet"), "--pool", POOL, "--batch", "12",
                       "--out", str(out), *flags])
    return [json.loads(line) for line in out.read_text().splitlines()]


@pytest.mark.parametrize("style", ["think", "search"])
def test_exact_credit_teaches_each_domain_its_best_model(router, tmp_path, style):
    got = run(router, tmp_path, "--style", style, "--updates", "120", "--every", "60", "--lr", "3e-3")
    assert [r["update"] for r in got] == [0, 60, 120]
    assert got[0]["p_best/all"] < 0.4 and got[-1]["p_best/all"] > 0.8, got
    assert all(got[-1][f"p_best/{d}"] > 0.5 for d in DOMAINS)


@pytest.mark.parametrize("flags", [["--estimator", "sampled", "--samples", "3", "--entropy-coef", "0.1"],
                                   ["--estimator", "critic"]])
def test_the_sampled_and_critic_estimators_update_the_policy(router, tmp_path, flags):
    got = run(router, tmp_path, "--updates", "3", "--every", "3", "--lr", "3e-3", *flags)
    assert len(got) == 2 and got[1]["p_best/all"] != got[0]["p_best/all"]


def test_ppo_epochs_take_the_plain_step_first_then_clipped_ones(router, tmp_path):
    """One PPO epoch is the policy-gradient step (the ratio is 1 where it is taken); more epochs move further; the
    option belongs to the sampled estimator."""
    flags = ["--estimator", "sampled", "--samples", "3", "--updates", "3", "--every", "3", "--lr", "3e-3"]
    plain, one, three = (run(router, tmp_path, *flags, *extra) for extra in ([], ["--ppo-epochs", "1"],
                                                                           ["--ppo-epochs", "3"]))
    assert one[1]["p_best/all"] == pytest.approx(plain[1]["p_best/all"], abs=1e-5)
    assert three[1]["p_best/all"] != pytest.approx(one[1]["p_best/all"], abs=1e-4)
    with pytest.raises(SystemExit):
        run(router, tmp_path, "--ppo-epochs", "2")  # the exact estimator has no draws to clip


def test_a_name_of_several_tokens_is_refused_by_name(router):
    tok = tiny_tokenizer()  # the names are BPE pieces here
    with pytest.raises(SystemExit, match="'Qwen2.5-7B-Instruct' is not one token after"):
        route_ascent.name_ids(tok, "<think>A science fact. Ask ", ["Qwen2.5-7B-Instruct"])


def test_the_summary_tables_each_estimators_readings(tmp_path):
    from experiments.route_credit import summarize
    rows = lambda ps: "".join(json.dumps({"update": u, "p_best/all": p, **{f"p_best/{d}": p for d in DOMAINS}}) + "\n"
                              for u, p in ps)
    (tmp_path / "exact.jsonl").write_text(rows([(0, 0.17), (100, 0.45), (200, 0.99)]))
    (tmp_path / "sampled.jsonl").write_text(rows([(0, 0.17), (100, 0.24)]))
    assert summarize.main([str(tmp_path), "--records", str(tmp_path / "rec")]) == 0
    table = (tmp_path / "rec" / "table.md").read_text()
    assert "| exact | 0.17 | 0.45 | 0.99 | - | - | 0.99 0.99 0.99 0.99 0.99 0.99 (update 200) |" in table
    assert "| sampled | 0.17 | 0.24 | - |" in table and (tmp_path / "rec" / "p_best.png").stat().st_size > 0
    (tmp_path / "critic.jsonl").write_text("")
    with pytest.raises(SystemExit, match="no readings in critic"):
        summarize.main([str(tmp_path)])


def test_exploring_draws_keep_every_name_at_its_uniform_share():
    import torch
    p = torch.tensor([[0.9, 0.05, 0.03, 0.01, 0.005, 0.0], [0.2, 0.2, 0.2, 0.2, 0.1, 0.05]])  # mass 0.995 and 0.95
    mu = route_ascent.behaviour(p, 0.3)
    assert torch.allclose(mu.sum(-1), torch.ones(2))
    assert float(mu.min()) >= 0.3 / 6 - 1e-7
    assert torch.allclose(route_ascent.behaviour(p, 0.0), p / p.sum(-1, keepdim=True))
