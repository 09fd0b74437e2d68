"""Advantages compared within the same cost weight (issue 31): GAE whitening per alpha
(algorithm.whiten_by), and GRPO groups, whose samples share their prompt and so its alpha."""
import numpy as np
import pytest
import torch

from router_r1.router_env import RouterEnv
from test_alpha_conditioning import alpha_reader, env_for, questions, rows_of, server  # noqa: F401 (fixtures)
from test_trainer import ROOT, config
from verl.algos.advantages import compute_gae
from verl.algos.masked import masked_mean, masked_var, masked_whiten
from verl.trainer import ppo_trainer
from verl.trainer.main_ppo import run
from verl.workers.rollout.base import SamplingParams


def mixed_alpha_batch():
    """8 episodes, 4 at alpha 0 (right answers pay 1) and 4 at alpha 0.9 (they pay about 0.3, spread less), with
    environment tokens masked out inside the responses."""
    g = torch.Generator().manual_seed(0)
    alphas = np.array([0.0, 0.9] * 4, dtype=object)
    mask = torch.ones(8, 10)
    mask[:, 3:5] = 0  # an <information> block
    mask[::3, 8:] = 0  # padding
    last = torch.tensor([7, 9, 9, 7, 9, 9, 7, 9])  # each row's last policy token
    scores = torch.where(torch.tensor([a == 0.0 for a in alphas]), torch.tensor([1.0, 0, 1, 1, 0, 1, 0, 1]),
                         0.3 + 0.05 * torch.rand(8, generator=g))
    rewards = torch.zeros(8, 10)
    rewards[torch.arange(8), last] = scores
    values = 0.1 * torch.randn(8, 10, generator=g) * mask
    return rewards, values, mask, alphas


def per_alpha(adv, mask, alphas):
    out = {}
    for a in sorted(set(alphas)):
        sel = torch.tensor([x == a for x in alphas])
        out[a] = (float(masked_mean(adv[sel], mask[sel])), float(masked_var(adv[sel], mask[sel])))
    return out


def test_whitening_within_each_alpha():
    rewards, values, mask, alphas = mixed_alpha_batch()
    raw, ret = compute_gae(rewards, values, mask, 1.0, 1.0, whiten=False)
    mixed, ret_mixed = compute_gae(rewards, values, mask, 1.0, 1.0)
    grouped, ret_grouped = compute_gae(rewards, values, mask, 1.0, 1.0, whiten_groups=alphas)
    assert torch.equal(ret_mixed, ret) and torch.equal(ret_grouped, ret)  # the critic's targets stay raw
    # over the whole batch, the alpha-0.9 episodes (small, similar rewards) all sit below zero: mixing moves them
    stats = per_alpha(mixed, mask, alphas)
    assert stats[0.9][0] < -0.1 and stats[0.0][0] > 0.1
    assert stats[0.9][1] < 0.5  # and their spread, small next to alpha 0's, stays small
    # within each alpha: zero mean and unit variance over its policy tokens
    for a, (mean, var) in per_alpha(grouped, mask, alphas).items():
        assert mean == pytest.approx(0.0, abs=1e-5) and var == pytest.approx(1.0, rel=1e-4), a
    for a in (0.0, 0.9):
        sel = torch.tensor([x == a for x in alphas])
        assert torch.allclose(grouped[sel], masked_whiten(raw[sel], mask[sel]), atol=1e-6)
    assert (grouped[~mask.bool()] == 0).all()
    with pytest.raises(ValueError, match="3 entries, the batch has 8"):
        compute_gae(rewards, values, mask, 1.0, 1.0, whiten_groups=[0, 1, 2])


def test_trainer_passes_the_rollout_field_as_the_whitening_groups(tmp_path, monkeypatch):
    """algorithm.whiten_by names a per-episode field of the env's rollout info; the single-turn env has
    finish_reason, so the toy run exercises the whole path (rollout -> batch -> compute_gae)."""
    monkeypatch.chdir(ROOT)
    seen = []

    def spy(*args, **kwargs):
        seen.append(kwargs.get("whiten_groups"))
        return compute_gae(*args, **kwargs)

    monkeypatch.setattr(ppo_trainer, "compute_gae", spy)
    run(config(tmp_path, "algorithm.whiten_by=finish_reason", "trainer.total_steps=1", "trainer.export_hf=false",
               "trainer.val_before_train=false", "trainer.test_freq=0", "trainer.save_freq=0"))
    assert len(seen) == 1 and seen[0] is not None and len(seen[0]) > 0
    assert set(seen[0]) <= {"eos", "stop", "length"}
    seen.clear()
    run(config(tmp_path / "off", "trainer.total_steps=1", "trainer.export_hf=false", "trainer.val_before_train=false",
               "trainer.test_freq=0", "trainer.save_freq=0"))
    assert seen == [None]  # off by default: the whole batch


def test_whiten_by_names_a_missing_field_or_a_wrong_estimator(tmp_path, monkeypatch):
    monkeypatch.chdir(ROOT)
    common = ("trainer.total_steps=1", "trainer.export_hf=false", "trainer.val_before_train=false")
    with pytest.raises(ValueError, match="whiten_by='alpha'.*no such field.*finish_reason"):
        run(config(tmp_path / "a", "algorithm.whiten_by=alpha", *common))
    with pytest.raises(ValueError, match="adv_estimator=gae"):
        run(config(tmp_path / "b", "algorithm.whiten_by=alpha", "algorithm.adv_estimator=grpo", "rollout.n=2",
                   *common))


def test_grpo_group_shares_its_alpha(tok, server, questions):  # noqa: F811
    """A GRPO group is one row repeated rollout.n times (one uid, one step's seed): its alpha is drawn from both,
    so all its samples are judged at the same cost weight; different prompts, and the same prompt at another
    step, draw afresh."""
    env: RouterEnv = env_for(tok, server.url, alphas=(0.0, 0.3, 0.6, 0.9), alpha_seed=4)
    base, n = rows_of(questions), 3
    rows = [r for r in base for _ in range(n)]  # PPOTrainer.next_rows' layout
    result = env.rollout(rows, alpha_reader(tok, questions, {}), SamplingParams(seed=11), validate=False)
    alphas = result.info["alpha"]
    groups = [alphas[i * n:(i + 1) * n] for i in range(len(base))]
    assert all(len(set(g)) == 1 for g in groups)
    assert len({g[0] for g in groups}) > 1  # the prompts of one batch do not all share one alpha
    later = [env.alpha_of(r.uid, SamplingParams(seed=12), False) for r in base]
    assert later != [g[0] for g in groups]  # a prompt seen at another step gets a fresh draw
    env.client.close()
