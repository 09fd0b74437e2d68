"""The rollout temperature reaches every log-prob: the engines report log softmax(logits / T), the
trainer's batch carries T, and the actor and the reference recompute at T (issue 27)."""
import functools
from pathlib import Path

import pytest

from test_trainer import by_step, config
from verl.protocol import DataProto
from verl.trainer.main_ppo import run
from verl.trainer.ppo_trainer import PPOTrainer
from verl.workers.actor import ActorWorker

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.parametrize("engine", ["hf", "hf_static"])
def test_old_log_probs_equal_the_samplers_at_temperature_0_7(tmp_path, monkeypatch, engine):
    """At T=0.7 the actor's recomputed old log-probs equal the engine's returned ones (the step that
    trains on its own weights' sample: staleness 0); the reference is scored at the same T."""
    monkeypatch.chdir(ROOT)
    seen = []
    compute = ActorWorker.compute_log_prob

    @functools.wraps(compute)  # keeps the @register dispatch mode
    def spy(self, data: DataProto):
        seen.append((self.role, data.meta.get("temperature")))
        return compute(self, data)

    monkeypatch.setattr(ActorWorker, "compute_log_prob", spy)
    run(config(tmp_path, "trainer.total_steps=2", "trainer.test_freq=0", "trainer.save_freq=0",
               "trainer.val_before_train=false", "trainer.export_hf=false", "trainer.off_policy_steps=1",
               "rollout.temperature=0.7", f"rollout.name={engine}", "rollout.device=cpu",
               "actor.use_kl_loss=true"))
    row = by_step(tmp_path / "metrics.jsonl")[1]
    assert row["offpolicy/staleness"] == 0
    # a log-prob scored at T=1 instead differs by ~0.1-1 nats a token on this model
    assert row["rollout/logprob_diff_max"] < 2e-3, row["rollout/logprob_diff_max"]
    assert row["offpolicy/is_weight_min"] == pytest.approx(1.0, abs=2e-3)
    assert {t for _, t in seen} == {0.7} and {"actor", "ref"} <= {r for r, _ in seen}


def test_a_batch_sampled_at_another_temperature_is_refused(tmp_path, monkeypatch):
    monkeypatch.chdir(ROOT)
    sampling = PPOTrainer.sampling

    def drifted(self, validate, step=None):  # the rollout samples at a T the config does not say
        s = sampling(self, validate, step)
        s.temperature = 0.5 if not validate else s.temperature
        return s

    monkeypatch.setattr(PPOTrainer, "sampling", drifted)
    with pytest.raises(ValueError, match="temperature 0.5 but rollout.temperature is 0.7"):
        run(config(tmp_path, "trainer.total_steps=1", "trainer.test_freq=0", "trainer.save_freq=0",
                   "trainer.val_before_train=false", "trainer.export_hf=false", "rollout.temperature=0.7"))


def test_the_actor_refuses_a_batch_without_its_temperature():
    from test_fsdp_workers import make_actor, make_batch
    data = make_batch()
    data.meta.pop("temperature")
    with pytest.raises(ValueError, match="no 'temperature'"):
        make_actor().compute_log_prob(data)


def test_greedy_training_rollouts_are_scored_at_temperature_1(tmp_path, monkeypatch):
    """rollout.temperature=0 decodes greedily; its log-probs are the T=1 policy's, and the check accepts it."""
    monkeypatch.chdir(ROOT)
    run(config(tmp_path, "trainer.total_steps=1", "trainer.test_freq=0", "trainer.save_freq=0",
               "trainer.val_before_train=false", "trainer.export_hf=false", "rollout.temperature=0"))
    assert 1 in by_step(tmp_path / "metrics.jsonl")
