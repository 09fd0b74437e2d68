"""The peer comparison (experiments/trl_peer): one reward function and one set of rows for both trainers, each
driver writing the curve JSONL the summarizer reads, and the summarizer rebuilding the committed records. The
TRL parts skip where trl (the optional `peer` extra) is not installed. No test asserts a learning outcome."""
import importlib.util
import json
import shutil
from pathlib import Path

import pandas as pd
import pytest

from experiments.trl_peer import ours, summarize
from experiments.trl_peer.settings import PeerSettings, read_curve
from experiments.trl_peer.task import ONE_HOP, RouteTask, TrlReward, one_hop_rows, reply_answer, route_reward
from sim.world import SimWorld
from tests.tiny import tiny_model, tiny_tokenizer

ROOT = Path(__file__).resolve().parents[1]
RECORDS = ROOT / "docs/results/trl_peer"
needs_trl = pytest.mark.skipif(importlib.util.find_spec("trl") is None, reason="trl (the peer extra) not installed")
TINY = dict(group_size=2, prompts_per_step=2, max_completion_length=6)


def fields(golds):
    return {"reward_model": {"ground_truth": {"target": list(golds)}}}


@pytest.fixture(scope="module")
def world_rows(tmp_path_factory):
    """Six 1-hop questions of the simulated world (seed 0, the pool's) and two 2-hop ones, as QA rows."""
    world = SimWorld(seed=0)
    qs = [q for q in world.questions(40, 3, "train", 0.5)]
    one = [q for q in qs if len(q.hops) == 1][:6]
    two = [q for q in qs if len(q.hops) == 2][:2]
    rows = [{"data_source": ONE_HOP if len(q.hops) == 1 else "sim_2hop",
             "prompt": [{"role": "user", "content": f"Route: {q.question}"}],
             "reward_model": {"style": "rule", "ground_truth": {"target": list(q.answers)}},
             "extra_info": {"uid": f"q{i}", "question": q.question}} for i, q in enumerate(one + two)]
    path = tmp_path_factory.mktemp("qa") / "train.parquet"
    pd.DataFrame(rows).to_parquet(path)
    return path, one


@pytest.fixture(scope="module")
def sft(tmp_path_factory):
    """A random tiny policy with the router's tags as single tokens, saved as an HF dir (model + tokenizer)."""
    out = tmp_path_factory.mktemp("sft")
    tok = tiny_tokenizer()
    tok.save_pretrained(out)
    tiny_model(len(tok), hidden=32, layers=1).save_pretrained(out)
    return out


def test_reward_is_the_em_of_the_pool_reply_first_sentence(world_rows):
    _, questions = world_rows
    task = RouteTask()
    names = task.registry.names
    scores = [[route_reward(f"<think>x</think><search>{m}: {q.question}</search>", fields(q.answers)) for m in names]
              for q in questions]
    assert {s for row in scores for s in row} <= {0.0, 1.0} and all(max(row) == 1.0 for row in scores)
    q, m = next((q, m) for q, row in zip(questions, scores) for m, s in zip(names, row) if s == 1.0)
    route = f"<search>{m}: {q.question}</search>"
    assert reply_answer(task.reply(route)) in q.answers
    assert route_reward(route, fields(["Somebody Else"])) == 0.0  # the gold decides, not the reply alone
    for text in (f"<answer>{q.answers[0]}</answer>", f"<search>NoSuchModel: {q.question}</search>",
                 f"<search>{m}: {q.question}", ""):  # no playable route: 0, like a wrong answer
        assert route_reward(text, fields(q.answers)) == 0.0
    assert reply_answer("Fupal. Born in Fupal. I hope this helps.") == "Fupal"
    assert reply_answer("I don't know who that is.") == "I don't know who that is"


def test_one_hop_rows_keep_one_hop_questions_in_a_seeded_order(world_rows, tmp_path):
    path, _ = world_rows
    a, b = one_hop_rows(path, 1), one_hop_rows(path, 2)
    assert set(a["data_source"]) == {ONE_HOP} and len(a) == 6
    assert sorted(a["extra_info"].map(lambda e: e["uid"])) == sorted(b["extra_info"].map(lambda e: e["uid"]))
    assert list(one_hop_rows(path, 1)["extra_info"].map(lambda e: e["uid"])) == list(a["extra_info"].map(lambda e: e["uid"]))
    pd.DataFrame({"data_source": ["sim_2hop"], "prompt": [[]]}).to_parquet(tmp_path / "two.parquet")
    with pytest.raises(ValueError, match="no sim_1hop rows"):
        one_hop_rows(tmp_path / "two.parquet", 1)


def our_config(s, data, sft_dir, out):
    from verl.trainer.main_ppo import load_config

    return load_config("ppo_trainer", ours.overrides(s, str(data), str(sft_dir), str(out), 1, 1))


@needs_trl
def test_both_trainers_get_the_same_reward_function_rows_and_settings(world_rows, sft, tmp_path):
    from verl.trainer.dataset import PromptDataset
    from verl.trainer.env_interface import load_env
    from experiments.trl_peer import peer

    data = tmp_path / "rows.parquet"
    one_hop_rows(world_rows[0], 1).to_parquet(data)
    s = PeerSettings(**TINY)
    cfg = our_config(s, data, sft, tmp_path / "ours")
    tok = tiny_tokenizer()
    env = load_env(cfg.env.factory, cfg.env, tok)
    trainer = peer.build_trainer(s, str(data), str(sft), str(tmp_path / "trl"), 1, 1)
    assert trainer.reward_funcs[0].fn is env.reward_fn is route_reward
    # the same prompts, token for token, in the same order, with the same golds
    ds = PromptDataset([str(data)], tok, "prompt", 512, "error")
    trl_ids, _, _ = trainer._tokenize_prompts([r["prompt"] for r in trainer.train_dataset])
    assert [list(x) for x in trl_ids] == [list(r.prompt_ids) for r in ds.rows]
    assert [r["reward_model"]["ground_truth"]["target"] for r in trainer.train_dataset] == \
        [list(r.fields["reward_model"]["ground_truth"]["target"]) for r in ds.rows]
    assert list(trainer._get_train_sampler())[:4] == [0, 0, 1, 1]  # unshuffled, as data.shuffle=false
    # the shared settings, as each trainer reads them
    a = trainer.args
    assert (a.num_generations, a.per_device_train_batch_size) == (cfg.rollout.n, cfg.actor.ppo_mini_batch_size)
    assert cfg.data.train_batch_size * cfg.rollout.n == s.samples_per_step and a.gradient_accumulation_steps == 1
    assert (a.temperature, a.learning_rate, a.beta, a.epsilon, a.max_grad_norm, a.max_completion_length) == (
        cfg.rollout.temperature, cfg.actor.lr, cfg.actor.kl_loss_coef, cfg.actor.clip_ratio_low, cfg.actor.grad_clip,
        cfg.rollout.response_length)
    # both stop a route at its closing tag: our env's stop strings, TRL's eos ids
    assert set(tok.convert_ids_to_tokens(peer.stop_token_ids(tok)[1:])) == {"</search>", "</answer>"}


@needs_trl
def test_trl_gradient_equals_the_objective_ours_is_checked_against(world_rows, sft, tmp_path):
    """TRL's loss on a fixed batch has the gradient of the written-out GRPO objective (clipped surrogate, k3 KL),
    which tests/test_ppo_update_exact.py holds our actor to: TRL 1.16's default ratio-weighted KL does not."""
    from experiments.trl_peer import diagnose, peer

    data = tmp_path / "rows.parquet"
    one_hop_rows(world_rows[0], 1).to_parquet(data)
    s = PeerSettings(**{**TINY, "max_completion_length": 12})
    trainer = peer.build_trainer(s, str(data), str(sft), str(tmp_path / "trl"), 1, 1)
    got = diagnose.gradient_check(trainer, list(peer.dataset(str(data))), s, 0)
    assert got["grad_norm"]["objective"] > 0 and got["max_abs_diff_over_max_abs"] < 1e-4, got


@needs_trl
def test_drivers_write_the_curves_the_summarizer_reads(world_rows, sft, tmp_path):
    from experiments.trl_peer import peer

    data = tmp_path / "data/seed1.parquet"
    data.parent.mkdir()
    one_hop_rows(world_rows[0], 1).to_parquet(data)
    flags = ["--data", str(data), "--sft", str(sft), "--seed", "1", "--steps", "2",
             "--group-size", "2", "--prompts-per-step", "2", "--max-completion-length", "6"]
    assert ours.main([*flags, "--out", str(tmp_path / "runs/ours/seed1")]) == 0
    assert peer.main([*flags, "--out", str(tmp_path / "runs/peer/seed1")]) == 0
    for folder, name in (("ours", "ours"), ("peer", "trl")):
        rows = read_curve(tmp_path / f"runs/{folder}/seed1/curve.jsonl")
        assert [(r["trainer"], r["step"], r["samples"]) for r in rows] == [(name, 1, 4), (name, 2, 8)]
        assert all(0.0 <= r["reward"] <= 1.0 for r in rows)
    records = tmp_path / "records"
    assert summarize.main(["--collect", str(tmp_path / "runs"), "--records", str(records)]) == 0
    s = json.loads((records / "summary.json").read_text())
    assert s["seeds"] == [1] and s["samples"] == [4, 8] and (records / "reward.png").stat().st_size > 10_000
    assert "| 1-8 |" in (records / "table.md").read_text()


def test_summarizer_rebuilds_the_committed_records(tmp_path):
    here = tmp_path / "trl_peer"
    shutil.copytree(RECORDS, here)
    assert summarize.main(["--records", str(here)]) == 0
    assert (here / "table.md").read_bytes() == (RECORDS / "table.md").read_bytes()
    assert (here / "summary.json").read_bytes() == (RECORDS / "summary.json").read_bytes()
    # one seed's reward at one step raised: the window holding that step changes, and no other row
    curve = here / "curves/trl_seed1.jsonl"
    rows = [json.loads(x) for x in curve.read_text().splitlines()]
    rows[0]["reward"] += 0.5
    curve.write_text("".join(json.dumps(r) + "\n" for r in rows))
    summarize.main(["--records", str(here)])
    changed = [a for a, b in zip((here / "table.md").read_text().splitlines(),
                                 (RECORDS / "table.md").read_text().splitlines()) if a != b]
    assert [c.split(" |")[0] for c in changed if c.startswith("|")] == ["| 1-320", "| all"]


def test_summarizer_rebuilds_the_gzipped_records(tmp_path):
    """The uniform-start record keeps its curves as .jsonl.gz: read and paired like plain ones."""
    here = tmp_path / "uniform_start"
    shutil.copytree(RECORDS / "uniform_start", here)
    assert sorted(p.name for p in (here / "curves").iterdir())[0] == "ours_seed1.jsonl.gz"
    assert summarize.main(["--records", str(here)]) == 0
    assert (here / "table.md").read_bytes() == (RECORDS / "uniform_start/table.md").read_bytes()
    assert json.loads((here / "summary.json").read_text())["seeds"] == [1, 2, 3]


def test_summarizer_refuses_runs_that_do_not_pair(tmp_path):
    curves = tmp_path / "curves"
    curves.mkdir()
    row = lambda t, seed, step: {"trainer": t, "seed": seed, "step": step, "samples": 4 * step, "reward": 0.5,  # noqa: E731
                                 "step_s": 1.0}
    (curves / "ours_seed1.jsonl").write_text(json.dumps(row("ours", 1, 1)) + "\n")
    (curves / "trl_seed2.jsonl").write_text(json.dumps(row("trl", 2, 1)) + "\n")
    with pytest.raises(ValueError, match="seeds differ"):
        summarize.load(tmp_path)
    (curves / "trl_seed2.jsonl").write_text(json.dumps({"trainer": "trl"}) + "\n")
    with pytest.raises(ValueError, match="trl_seed2.jsonl:1: missing seed"):
        summarize.load(tmp_path)
