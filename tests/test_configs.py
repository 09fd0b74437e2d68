"""The shipped configs compose and carry the paper's settings (the Router-R1 paper and its code)."""
import pytest

from verl.trainer.main_ppo import load_config, uses


def load(name, *overrides):
    return load_config(name, overrides)


def test_paper_config_matches_the_reference_facts():
    c = load("router_r1")
    assert c.model.path == "Qwen/Qwen2.5-3B-Instruct" and c.model.critic_path == c.model.path
    assert (c.actor.lr, c.critic.lr) == (1e-6, 1e-5)
    assert (c.data.train_batch_size, c.actor.ppo_mini_batch_size, c.actor.ppo_micro_batch_size) == (64, 32, 8)
    assert (c.trainer.total_steps, c.trainer.save_freq, c.trainer.test_freq) == (225, 15, 15)
    assert (c.rollout.response_length, c.env.max_obs_length, c.env.max_turns) == (1024, 600, 4)
    assert (c.algorithm.gamma, c.algorithm.lam, c.algorithm.kl_ctrl.kl_coef) == (1.0, 1.0, 0.001)
    assert c.algorithm.use_kl_in_reward and c.algorithm.kl_ctrl.type == "fixed"
    assert (c.actor.clip_ratio_low, c.actor.clip_ratio_high, c.rollout.temperature) == (0.2, 0.2, 1.0)
    assert c.env.pool == "configs/pool/paper.yaml" and c.rollout.name == "vllm"
    assert uses(c) == (True, True)  # critic and reference


def test_grpo_variant_drops_the_critic():
    c = load("router_r1_grpo")
    assert c.algorithm.adv_estimator == "grpo" and c.rollout.n > 1
    assert uses(c) == (False, True)


@pytest.mark.parametrize("override", ["trainer.total_steps=10", "actor.lr=2e-6", "env.alpha=0.9"])
def test_cli_overrides_work_as_in_verl(override):
    key, value = override.split("=")
    c = load("router_r1", override)
    node = c
    for part in key.split("."):
        node = node[part]
    assert float(node) == float(value)


def test_embedded_default_trains_on_a_gpu_where_there_is_one(monkeypatch):
    """Session 14 lost a device call to a pinned `trainer.device: cpu`: six runs trained on a GPU machine's CPUs."""
    import torch

    from verl.trainer.main_ppo import _want_cuda

    c = load("embedded")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    assert _want_cuda(c)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert not _want_cuda(c)
