"""One-step off-policy training: truncated importance weights, and the trainer playing ahead."""
from pathlib import Path

import pytest
import torch

from test_trainer import by_step, config
from verl.algos.losses import policy_loss
from verl.trainer.main_ppo import run
from verl.trainer.ppo_trainer import off_policy_weights

ROOT = Path(__file__).resolve().parents[1]


def test_weights_are_one_when_the_sampler_is_the_trained_policy_and_truncated_otherwise():
    g = torch.Generator().manual_seed(0)
    old = -torch.rand(3, 5, generator=g) * 3  # (batch, response_len)
    mask = torch.tensor([[1, 1, 1, 0, 0], [1, 0, 1, 1, 1], [0, 0, 0, 0, 0]])
    w, stats = off_policy_weights(old, old.clone(), mask, cap=2.0)
    assert torch.equal(w, mask.float())  # 1 on policy tokens, 0 elsewhere
    assert stats["offpolicy/is_weight_mean"] == pytest.approx(1.0) and stats["offpolicy/is_truncated_frac"] == 0
    rollout = old.clone()
    rollout[0, 0] -= 3.0  # the sampler thought this token far less likely: ratio e^3 > cap
    rollout[1, 2] += 0.5  # ... and this one more likely: ratio e^-0.5
    w, stats = off_policy_weights(old, rollout, mask, cap=2.0)
    assert w[0, 0] == pytest.approx(2.0) and w[1, 2] == pytest.approx(torch.exp(torch.tensor(-0.5)).item())
    assert stats["offpolicy/is_weight_max"] == pytest.approx(torch.exp(torch.tensor(3.0)).item(), rel=1e-5)
    assert stats["offpolicy/is_truncated_frac"] == pytest.approx(1 / 7)
    # the weights multiply the clipped surrogate per token; weights of 1 change nothing
    logp = old + 0.1 * torch.randn(3, 5, generator=g)
    adv = torch.randn(3, 5, generator=g)
    plain, _ = policy_loss(logp, old, adv, mask)
    ones, _ = policy_loss(logp, old, adv, mask, is_weights=mask.float())
    weighted, _ = policy_loss(logp, old, adv, mask, is_weights=w)
    assert ones == pytest.approx(plain.item()) and weighted != pytest.approx(plain.item())


def test_trainer_plays_the_next_rollout_ahead_and_weights_the_stale_batch(tmp_path, monkeypatch):
    monkeypatch.chdir(ROOT)
    run(config(tmp_path, "trainer.total_steps=3", "trainer.test_freq=0", "trainer.save_freq=0",
               "trainer.val_before_train=false", "trainer.export_hf=false", "trainer.off_policy_steps=1",
               "actor.lr=1e-2", "rollout.device=cpu"))  # rollout.device: the engine placed by name
    rows = by_step(tmp_path / "metrics.jsonl")
    # step 1 trains on a batch its own weights sampled: the importance ratio is 1 (engine vs actor numerics)
    assert rows[1]["offpolicy/staleness"] == 0
    assert rows[1]["offpolicy/is_weight_min"] == pytest.approx(1.0, abs=1e-3)
    assert rows[1]["offpolicy/is_weight_max"] == pytest.approx(1.0, abs=1e-3)
    # steps 2 and 3 train on batches sampled before the previous update: one update stale, weights move
    for k in (2, 3):
        assert rows[k]["offpolicy/staleness"] == 1
        assert rows[k]["offpolicy/is_weight_max"] - rows[k]["offpolicy/is_weight_min"] > 1e-2
        assert rows[k]["timing/rollout_wait"] <= rows[k]["timing/step"]


def test_off_policy_steps_is_checked(tmp_path, monkeypatch):
    monkeypatch.chdir(ROOT)
    with pytest.raises(ValueError, match="off_policy_steps"):
        run(config(tmp_path, "trainer.total_steps=1", "trainer.off_policy_steps=2"))


def test_a_checkpoint_saved_while_a_rollout_plays_ahead_holds_the_env_state_before_it(tmp_path, monkeypatch):
    """The rollout played ahead is not trained when step k saves; a resumed run plays its rows again, so
    the saved env state (the router's cost window) must not already hold them, else they count twice.
    The single-turn env is given the router env's kind of state: a count of the training episodes scored."""
    monkeypatch.chdir(ROOT)
    from verl.trainer.single_turn import SingleTurnEnv
    score = SingleTurnEnv.score

    def counting_score(self, result, rows, validate):
        if not validate:
            self.scored = getattr(self, "scored", 0) + len(rows)
        return score(self, result, rows, validate)

    monkeypatch.setattr(SingleTurnEnv, "score", counting_score)
    monkeypatch.setattr(SingleTurnEnv, "state_dict", lambda self: {"scored": getattr(self, "scored", 0)})
    seen = {}
    for k in (0, 1):
        out = tmp_path / f"off{k}"
        run(config(out, "trainer.total_steps=2", "trainer.test_freq=0", "trainer.save_freq=1",
                   "trainer.val_before_train=false", "trainer.export_hf=false", f"trainer.off_policy_steps={k}",
                   "trainer.max_checkpoints=0", "rollout.device=cpu"))
        state = torch.load(out / "checkpoints" / "step_000001" / "trainer_state.pt", weights_only=False)
        seen[k] = state["env"]["scored"]
    assert seen[0] > 0  # step 1's own batch was scored
    assert seen[1] == seen[0]  # ... and the batch played ahead for step 2 is not in the saved state
