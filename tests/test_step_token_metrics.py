"""The step metrics a throughput figure reads: the trained batch's real tokens (batch/tokens, batch/prompt_tokens)
and the weight copy into the rollout engine (timing/weight_sync), kept out of timing/env_wait (the pool's share)."""
import time
from pathlib import Path

import pytest

from test_trainer import by_step, config
from verl.single_controller.base import register
from verl.trainer.main_ppo import run
from verl.workers.actor_rollout import ActorRolloutWorker

ROOT = Path(__file__).resolve().parents[1]
SYNC_S = 0.3  # what each weight copy is made to take here
COMMON = ("trainer.total_steps=2", "trainer.test_freq=0", "trainer.val_before_train=false", "trainer.export_hf=false",
          "trainer.save_freq=0", "data.train_batch_size=4", "rollout.device=cpu", "data.val_files=[]")


@pytest.fixture
def slow_sync_and_trained_tokens(monkeypatch):
    """Every weight copy takes SYNC_S longer; each update records the real tokens of the batch it trains on."""
    seen = []
    sync, update = ActorRolloutWorker.sync_rollout, ActorRolloutWorker.update_actor

    @register("all")
    def slow_sync(self):
        time.sleep(SYNC_S)
        return sync(self)

    @register("dp")
    def recording_update(self, data):
        attention = data.batch["attention_mask"]
        seen.append((int(attention.sum()), int(attention[:, :data.batch["prompts"].shape[1]].sum())))
        return update(self, data)

    monkeypatch.setattr(ActorRolloutWorker, "sync_rollout", slow_sync)
    monkeypatch.setattr(ActorRolloutWorker, "update_actor", recording_update)
    return seen


@pytest.mark.parametrize("schedule", [(), ("rollout.in_flight=8",)], ids=["sync", "streaming"])
def test_tokens_and_weight_sync_are_logged_and_the_pool_wait_excludes_the_copy(
        tmp_path, monkeypatch, slow_sync_and_trained_tokens, schedule):
    monkeypatch.chdir(ROOT)
    run(config(tmp_path, *COMMON, *schedule))
    rows = by_step(tmp_path / "metrics.jsonl")
    assert sorted(rows) == [1, 2]
    for step, (tokens, prompt_tokens) in zip((1, 2), slow_sync_and_trained_tokens):
        r = rows[step]
        assert r["batch/tokens"] == tokens and r["batch/prompt_tokens"] == prompt_tokens
        assert 0 < prompt_tokens < tokens
        assert r["timing/tokens_per_s"] == pytest.approx(tokens / r["timing/step"])
        assert r["timing/weight_sync"] >= SYNC_S  # each step copies its weights once
        assert r["timing/weight_sync"] <= r["timing/rollout_wait"] <= r["timing/step"]
        # the pool's share of the rollout holds neither decoding nor the copy (toy env: no pool at all)
        assert 0 <= r["timing/env_wait"] < SYNC_S
        assert r["timing/decode"] + r["timing/env_wait"] <= r["timing/gen"] + 1e-6
