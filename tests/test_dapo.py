"""DAPO: the group filter and the overlong penalty by hand, and dynamic sampling in a real trainer run."""
from collections import Counter
from pathlib import Path

import numpy as np
import pytest
import torch
from hydra import compose, initialize_config_dir

from verl.algos.advantages import compute_grpo_advantages
from verl.algos.dapo import informative_groups, overlong_penalty, select_groups
from verl.trainer.dataset import train_batch_indices
from verl.trainer.main_ppo import CONFIG_DIR, run
from verl.trainer.ppo_trainer import PPOTrainer
from verl.trainer.single_turn import SingleTurnEnv
from verl.trainer.tracking import read_jsonl

ROOT = Path(__file__).resolve().parents[1]


# ------------------------------------------------------------------ pure functions
def test_informative_groups_by_hand():
    scores = [1.0, 1.0, 0.0, 1.0, 0.5, 0.5, 0.3]
    uids = ["a", "a", "b", "b", "c", "c", "d"]
    assert informative_groups(scores, uids) == {"a": False, "b": True, "c": False, "d": False}
    with pytest.raises(ValueError, match="group_ids"):
        informative_groups([1.0, 2.0], ["a"])


def test_dropped_groups_are_exactly_those_with_zero_advantage():
    scores = torch.tensor([1.0, 1.0, 0.0, 1.0, -1.0, -1.0, 0.2, 0.7, 0.2])
    uids = np.array(["a", "a", "b", "b", "c", "c", "d", "d", "d"], dtype=object)
    adv, _ = compute_grpo_advantages(scores, uids, torch.ones(9, 3))
    has_signal = {g: bool(adv[uids == g].abs().sum() > 0) for g in dict.fromkeys(uids)}
    assert informative_groups(scores.tolist(), list(uids)) == has_signal == {"a": False, "b": True, "c": False,
                                                                              "d": True}


def test_select_groups_takes_the_first_informative_groups_in_row_order():
    # groups: a flat, b spread, c spread, d flat, e spread (two rows each, interleaved a little)
    uids = ["a", "b", "a", "b", "c", "c", "d", "d", "e", "e"]
    scores = [0, 0, 0, 1, 2, 3, 5, 5, 0, 1]
    rows, counts = select_groups(scores, uids, n_groups=2)
    assert rows == [1, 3, 4, 5]  # b and c; e is beyond the target
    assert counts == {"kept": 3, "dropped": 2, "trained": 2, "filled": 0}


def test_select_groups_when_short_fills_with_flat_groups_only_to_the_world_size():
    uids = ["a", "a", "a", "b", "b", "b", "c", "c", "c"]
    scores = [1, 1, 1, 0, 1, 0, 2, 2, 2]  # only b is informative
    rows, counts = select_groups(scores, uids, n_groups=4)  # one rank: train on b alone
    assert rows == [3, 4, 5] and counts["trained"] == 1 and counts["filled"] == 0
    rows, counts = select_groups(scores, uids, n_groups=4, multiple=2)  # 3 rows do not split over 2 ranks
    assert rows == [0, 1, 2, 3, 4, 5] and counts == {"kept": 1, "dropped": 2, "trained": 2, "filled": 1}
    rows, counts = select_groups([1, 1, 2, 2], ["a", "a", "b", "b"], n_groups=2)  # nothing informative
    assert rows == [0, 1] and counts["filled"] == 1
    with pytest.raises(ValueError, match="multiple of 2"):
        select_groups([1, 1, 1], ["a", "a", "a"], n_groups=1, multiple=2)


def test_overlong_penalty_by_hand():
    # max 10, buffer 4: free up to 6 tokens, then -1/4 per token, -1 from 10 on
    got = overlong_penalty([0, 5, 6, 7, 8, 10, 12], max_length=10, buffer=4)
    assert np.allclose(got, [0, 0, 0, -0.25, -0.5, -1.0, -1.0])
    assert np.allclose(overlong_penalty([9], 10, 4, factor=0.5), [-0.375])
    with pytest.raises(ValueError, match="buffer"):
        overlong_penalty([1], max_length=10, buffer=0)
    with pytest.raises(ValueError, match="buffer"):
        overlong_penalty([1], max_length=10, buffer=11)


def test_dapo_config_carries_the_paper_settings():
    from verl.trainer.main_ppo import uses

    with initialize_config_dir(CONFIG_DIR, version_base=None):
        c = compose("dapo")
    assert (c.actor.clip_ratio_low, c.actor.clip_ratio_high, c.actor.loss_agg_mode) == (0.2, 0.28, "token-mean")
    assert c.algorithm.adv_estimator == "grpo" and c.algorithm.grpo_norm_by_std and c.rollout.n > 1
    assert c.algorithm.dynamic_sampling.enable and c.algorithm.dynamic_sampling.max_gen_batches >= 1
    assert uses(c) == (False, False)  # no critic, no KL anywhere so no reference model
    assert c.algorithm.overlong_penalty.max_length == c.rollout.max_response_length
    assert c.env.factory == "router_r1.router_env:make_env"  # the embedded default underneath


# ------------------------------------------------------------------ in the trainer
N_ROWS, BATCH, N = 32, 4, 2  # toy_prompts.parquet has 32 rows, uids toy-0 .. toy-31


def varied(uid: str) -> bool:
    """Even toy rows have samples that score differently; odd rows score all 0."""
    return int(uid.split("-")[1]) % 2 == 0


class GroupEnv(SingleTurnEnv):
    """Single-turn episodes scored by the row: a varied row's k-th sample scores k, others 0."""

    def score(self, result, rows, validate):
        seen, scores = Counter(), []
        for r in rows:
            scores.append(float(seen[r.uid]) if varied(r.uid) else 0.0)
            seen[r.uid] += 1
        return np.array(scores, dtype=np.float32), {"response_length": [len(x) for x in result.response_ids]}


def make_group_env(env_cfg, tokenizer):
    return GroupEnv(tokenizer, None, int(env_cfg.max_response_length))


def make_zero_env(env_cfg, tokenizer):
    return SingleTurnEnv(tokenizer, lambda text, fields: 0.0, int(env_cfg.max_response_length))


def config(tmp_path, *overrides):
    with initialize_config_dir(CONFIG_DIR, version_base=None):
        return compose("ppo_trainer", overrides=[
            f"trainer.output_dir={tmp_path}", "trainer.logger=[jsonl]", "trainer.export_hf=false",
            "trainer.val_before_train=false", "trainer.test_freq=0", "trainer.save_freq=0", "data.val_files=[]",
            "data.train_files=[tests/data/toy_prompts.parquet]", f"data.train_batch_size={BATCH}",
            "rollout.response_length=12", "algorithm.adv_estimator=grpo", "algorithm.use_kl_in_reward=false",
            *overrides])


def expected_draws(first_batch: int, max_batches: int, seed: int = 42) -> tuple[int, list[str], int]:
    """(batches drawn, uids of the first BATCH varied groups in data order, varied groups seen)."""
    groups = []
    for k in range(max_batches):
        idx = train_batch_indices(N_ROWS, BATCH, first_batch + k, seed)
        groups += [f"toy-{i}" for i in idx]
        hits = [g for g in groups if varied(g)]
        if len(hits) >= BATCH:
            return k + 1, hits[:BATCH], len(hits)
    return max_batches, hits, len(hits)


@pytest.fixture
def trained_uids(monkeypatch):
    """The uids of every batch the trainer hands to the update, per step."""
    seen = []
    original = PPOTrainer.train_episodes

    def spy(self, rows, metrics, *args, **kwargs):
        batch, env_metrics = original(self, rows, metrics, *args, **kwargs)
        seen.append(list(batch.non_tensor["uid"]))
        return batch, env_metrics

    monkeypatch.setattr(PPOTrainer, "train_episodes", spy)
    return seen


def test_dynamic_sampling_drops_flat_groups_and_refills_the_batch(tmp_path, monkeypatch, trained_uids):
    monkeypatch.chdir(ROOT)
    last = run(config(tmp_path, "env.factory=test_dapo:make_group_env", f"rollout.n={N}", "trainer.total_steps=2",
                      "algorithm.dynamic_sampling.enable=true", "algorithm.dynamic_sampling.max_gen_batches=8"))
    rows = {r["step"]: r for r in read_jsonl(tmp_path / "metrics.jsonl")}
    first = 1
    for step in (1, 2):
        n_batches, uids, n_varied = expected_draws(first, 8)
        assert first + n_batches - 1 <= N_ROWS // BATCH  # one epoch: no prompt is drawn twice
        assert n_batches > 1  # the first prompt batch alone never has enough varied rows here
        m = rows[step]
        assert m["dapo/gen_batches"] == n_batches
        assert m["dapo/groups_kept"] == n_varied
        assert m["dapo/groups_dropped"] == n_batches * BATCH - n_varied
        assert m["dapo/groups_trained"] == BATCH and m["dapo/short_batch"] == 0
        assert trained_uids[step - 1] == [u for u in uids for _ in range(N)]  # whole groups, data order
        # "reward" covers every episode played: varied groups score 0 and 1, flat ones 0
        assert m["reward/mean"] == pytest.approx(n_varied * 1 / (n_batches * BATCH * N))
        first += n_batches  # the next step continues the data order after the batches drawn
    assert "actor/pg_loss" in last


def test_dynamic_sampling_at_the_cap_trains_on_what_there_is(tmp_path, monkeypatch, trained_uids):
    monkeypatch.chdir(ROOT)
    _, uids, n_varied = expected_draws(1, 2)
    assert 0 < n_varied < BATCH  # the scenario: two batches cannot fill the target
    with pytest.warns(UserWarning, match="dynamic sampling"):
        last = run(config(tmp_path, "env.factory=test_dapo:make_group_env", f"rollout.n={N}",
                          "trainer.total_steps=1", "algorithm.dynamic_sampling.enable=true",
                          "algorithm.dynamic_sampling.max_gen_batches=2"))
    assert last["dapo/short_batch"] == 1 and last["dapo/gen_batches"] == 2
    assert last["dapo/groups_trained"] == n_varied
    assert trained_uids[0] == [u for u in uids for _ in range(N)]


def test_dynamic_sampling_needs_groups(tmp_path, monkeypatch):
    monkeypatch.chdir(ROOT)
    with pytest.raises(ValueError, match="rollout.n"):
        run(config(tmp_path, "algorithm.dynamic_sampling.enable=true", "rollout.n=1"))


def test_overlong_penalty_reaches_the_score(tmp_path, monkeypatch):
    # Reward 0 everywhere and the buffer spans the whole length: the score is -factor * length / max.
    monkeypatch.chdir(ROOT)
    last = run(config(tmp_path, "env.factory=test_dapo:make_zero_env", "rollout.n=2", "trainer.total_steps=1",
                      "algorithm.overlong_penalty.enable=true", "algorithm.overlong_penalty.max_length=12",
                      "algorithm.overlong_penalty.buffer=12", "algorithm.overlong_penalty.factor=0.5"))
    assert last["response_length/mean"] > 0
    for stat in ("mean", "min", "max"):
        other = {"mean": "mean", "min": "max", "max": "min"}[stat]  # longer response, lower score
        assert last[f"reward/{stat}"] == pytest.approx(-0.5 * last[f"response_length/{other}"] / 12, abs=1e-6)
