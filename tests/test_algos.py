import math

import numpy as np
import pytest
import torch

from verl.algos import (
    AdaptiveKLController,
    FixedKLController,
    agg_loss,
    apply_kl_penalty,
    compute_gae,
    compute_grpo_advantages,
    entropy_from_logits,
    kl_loss,
    kl_penalty,
    logprobs_from_logits,
    masked_mean,
    masked_sum,
    masked_var,
    masked_whiten,
    place_score_on_last_token,
    policy_loss,
    value_loss,
)

D = torch.float64


# ----------------------------------------------------------------- masked stats
def _poisoned(x, mask):
    """Copies of x whose masked-out entries hold garbage that must not matter."""
    out = []
    for bad in (float("nan"), float("inf"), -float("inf"), 1e30):
        y = x.clone()
        y[~mask.bool()] = bad
        out.append(y)
    return out


def test_masked_stats_match_selected_values_and_ignore_masked_garbage():
    g = torch.Generator().manual_seed(0)
    x = torch.randn(4, 7, generator=g, dtype=D)
    mask = (torch.rand(4, 7, generator=g) > 0.4).long()
    mask[0, 0] = 1
    sel = x[mask.bool()]
    assert torch.allclose(masked_sum(x, mask), sel.sum())
    assert torch.allclose(masked_mean(x, mask), sel.mean())
    assert torch.allclose(masked_var(x, mask), sel.var(unbiased=True))
    assert torch.allclose(masked_var(x, mask, unbiased=False), sel.var(unbiased=False))
    white = masked_whiten(x, mask)
    assert torch.allclose(white[mask.bool()].mean(), torch.tensor(0.0, dtype=D), atol=1e-9)
    assert torch.allclose(white[mask.bool()].var(), torch.tensor(1.0, dtype=D), atol=1e-6)
    assert (white[~mask.bool()] == 0).all()
    shifted = masked_whiten(x, mask, shift_mean=False)
    assert torch.allclose(shifted[mask.bool()].mean(), sel.mean())

    for y in _poisoned(x, mask):
        assert torch.equal(masked_sum(y, mask), masked_sum(x, mask))
        assert torch.equal(masked_mean(y, mask, dim=-1), masked_mean(x, mask, dim=-1))
        assert torch.equal(masked_var(y, mask, dim=0), masked_var(x, mask, dim=0))
        assert torch.equal(masked_whiten(y, mask), white)


def test_masked_mean_per_row_and_empty_rows_and_finite_grad():
    x = torch.tensor([[1.0, 2.0, float("nan")], [float("inf"), 5.0, 7.0], [float("nan")] * 3], requires_grad=True)
    mask = torch.tensor([[1, 1, 0], [0, 1, 1], [0, 0, 0]])
    m = masked_mean(x, mask, dim=-1)
    assert torch.equal(m.detach(), torch.tensor([1.5, 6.0, 0.0]))
    m.sum().backward()
    assert torch.isfinite(x.grad).all()
    assert torch.equal(x.grad, torch.tensor([[0.5, 0.5, 0.0], [0.0, 0.5, 0.5], [0.0, 0.0, 0.0]]))


# ------------------------------------------------------------------------ GAE
def test_gae_hand_computed_with_masked_gap():
    # Policy tokens at 0, 1, 3; token 2 is an <information> token, token 4 is padding.
    rewards = torch.tensor([[-0.1, 0.0, 0.0, 1.0, 0.0]], dtype=D)
    values = torch.tensor([[0.5, 0.2, 9.0, 0.4, 7.0]], dtype=D)
    mask = torch.tensor([[1, 1, 0, 1, 0]])
    gamma, lam = 0.9, 0.8
    # t=3 (last policy token, terminal): delta = 1 - 0.4 = 0.6, A3 = 0.6
    # t=1: next value is V3 = 0.4 (token 2 skipped): delta = 0.9*0.4 - 0.2 = 0.16, A1 = 0.16 + 0.72*0.6 = 0.592
    # t=0: delta = -0.1 + 0.9*0.2 - 0.5 = -0.42, A0 = -0.42 + 0.72*0.592 = 0.00624
    expected_adv = torch.tensor([[0.00624, 0.592, 0.0, 0.6, 0.0]], dtype=D)
    expected_ret = torch.tensor([[0.50624, 0.792, 0.0, 1.0, 0.0]], dtype=D)
    adv, ret = compute_gae(rewards, values, mask, gamma, lam, whiten=False)
    assert torch.allclose(adv, expected_adv, atol=1e-12)
    assert torch.allclose(ret, expected_ret, atol=1e-12)

    # Values at masked positions are neither steps nor bootstrap points.
    values2 = values.clone()
    values2[0, 2], values2[0, 4] = -123.0, float("nan")
    adv2, ret2 = compute_gae(rewards, values2, mask, gamma, lam, whiten=False)
    assert torch.equal(adv2, adv) and torch.equal(ret2, ret)

    # Whitening only changes advantages, over policy tokens; returns use the raw advantages.
    adv_w, ret_w = compute_gae(rewards, values, mask, gamma, lam, whiten=True)
    assert torch.allclose(adv_w, masked_whiten(expected_adv, mask))
    assert torch.allclose(ret_w, expected_ret)


def _plain_gae(rewards, values, gamma, lam):
    """Textbook GAE treating every token as a step (environment tokens included)."""
    adv = torch.zeros_like(values)
    last, nxt = torch.zeros(values.shape[0], dtype=values.dtype), torch.zeros(values.shape[0], dtype=values.dtype)
    for t in reversed(range(values.shape[1])):
        delta = rewards[:, t] + gamma * nxt - values[:, t]
        last = delta + gamma * lam * last
        adv[:, t] = last
        nxt = values[:, t]
    return adv


def test_gae_gamma_lam_one_equals_plain_recursion_and_telescoped_sum():
    g = torch.Generator().manual_seed(1)
    mask = (torch.rand(6, 12, generator=g) > 0.3).long()
    mask[:, 0] = 1
    rewards = torch.randn(6, 12, generator=g, dtype=D) * mask
    values = torch.randn(6, 12, generator=g, dtype=D)
    adv, ret = compute_gae(rewards, values, mask, 1.0, 1.0, whiten=False)
    m = mask.bool()
    plain = _plain_gae(rewards, values, 1.0, 1.0)
    assert torch.allclose(adv[m], plain[m])
    reward_to_go = rewards.flip(-1).cumsum(-1).flip(-1)
    assert torch.allclose(adv[m], (reward_to_go - values)[m])
    assert torch.allclose(ret[m], reward_to_go[m])
    # Below 1 the two differ: the environment tokens would otherwise count as discount steps.
    adv_d, _ = compute_gae(rewards, values, mask, 0.9, 0.95, whiten=False)
    assert not torch.allclose(adv_d[m], _plain_gae(rewards, values, 0.9, 0.95)[m])


def test_gae_rejects_reward_on_masked_token():
    mask = torch.tensor([[1, 0, 1]])
    with pytest.raises(ValueError, match="row 0, token 1"):
        compute_gae(torch.tensor([[0.0, 1.0, 0.0]]), torch.zeros(1, 3), mask, 1.0, 1.0)


def test_place_score_on_last_policy_token():
    mask = torch.tensor([[1, 1, 0, 1, 0], [1, 0, 0, 0, 0], [0, 0, 1, 1, 1]])
    out = place_score_on_last_token(torch.tensor([2.0, -1.0, 0.5]), mask)
    expected = torch.zeros(3, 5)
    expected[0, 3], expected[1, 0], expected[2, 4] = 2.0, -1.0, 0.5
    assert torch.equal(out, expected)
    # a row masked out whole (AdaTurn's `mask` baseline) carries no score, and GAE over it stays finite
    mask = torch.tensor([[1, 0], [0, 0]])
    out = place_score_on_last_token(torch.tensor([1.0, 5.0]), mask)
    assert torch.equal(out, torch.tensor([[1.0, 0.0], [0.0, 0.0]]))
    adv, ret = compute_gae(out, torch.zeros(2, 2), mask, 1.0, 1.0)
    assert torch.isfinite(adv).all() and torch.isfinite(ret).all()
    assert torch.equal(adv[1], torch.zeros(2))


# ----------------------------------------------------------------------- GRPO
def test_grpo_two_groups_interleaved_and_singleton():
    scores = torch.tensor([1.0, 2.0, 0.0, 4.0, 1.0, 0.0, 7.0], dtype=D)
    ids = np.array(["a", "b", "a", "b", "a", "a", "c"], dtype=object)
    mask = torch.ones(7, 3, dtype=torch.long)
    mask[0, 2] = 0
    adv, ret = compute_grpo_advantages(scores, ids, mask, eps=0.0)
    # group a = [1, 0, 1, 0]: mean 0.5, unbiased std sqrt(1/3) -> +-0.5*sqrt(3)
    # group b = [2, 4]: mean 3, unbiased std sqrt(2) -> -+1/sqrt(2); group c is a singleton -> 0
    a, b = 0.5 * math.sqrt(3), 1 / math.sqrt(2)
    per_seq = torch.tensor([a, -b, -a, b, a, -a, 0.0], dtype=D)
    assert torch.allclose(adv, per_seq[:, None] * mask)
    assert adv[0, 2] == 0
    assert torch.equal(adv, ret)
    adv_raw, _ = compute_grpo_advantages(scores, ids, mask, norm_by_std=False)
    assert torch.allclose(adv_raw[:, 0], torch.tensor([0.5, -1, -0.5, 1, 0.5, -0.5, 0], dtype=D))


def test_grpo_groups_by_uid_so_equal_local_indices_do_not_collide():
    # Two data sources whose per-source row index both restart at 0.
    scores = torch.tensor([1.0, 0.0, 5.0, 3.0])
    local_index = np.array([0, 0, 0, 0])
    uids = np.array(["nq-0", "nq-0", "hotpot-0", "hotpot-0"], dtype=object)
    mask = torch.ones(4, 2)
    adv, _ = compute_grpo_advantages(scores, uids, mask)
    nq, _ = compute_grpo_advantages(scores[:2], uids[:2], mask[:2])
    hp, _ = compute_grpo_advantages(scores[2:], uids[2:], mask[2:])
    assert torch.allclose(adv, torch.cat([nq, hp]))
    collided, _ = compute_grpo_advantages(scores, local_index, mask)
    assert not torch.allclose(adv, collided)


# ------------------------------------------------------------------------- KL
def test_kl_estimators_against_closed_form_on_categorical():
    p = torch.tensor([0.5, 0.3, 0.15, 0.05], dtype=D)  # policy
    q = torch.tensor([0.25, 0.25, 0.25, 0.25], dtype=D)  # reference
    logp, logq = p.log(), q.log()
    true_kl = (p * (logp - logq)).sum()
    # Exact expectations under the policy: k1 and k3 are unbiased, k2 is not.
    for kind in ("k1", "k3", "low_var_kl", "kl"):
        assert torch.allclose((p * kl_penalty(logp, logq, kind)).sum(), true_kl)
    k2 = (p * kl_penalty(logp, logq, "k2")).sum()
    assert torch.allclose(k2, (p * 0.5 * (logp - logq) ** 2).sum())
    assert not torch.allclose(k2, true_kl, atol=1e-3)
    assert torch.equal(kl_penalty(logp, logq, "mse"), kl_penalty(logp, logq, "k2"))
    assert torch.equal(kl_penalty(logp, logq, "abs"), (logp - logq).abs())
    assert (kl_penalty(logp, logq, "k3") >= 0).all()

    # Monte Carlo: the sample mean of k3 over policy samples converges to the true KL.
    g = torch.Generator().manual_seed(0)
    samples = torch.multinomial(p, 200_000, replacement=True, generator=g)
    mc = kl_penalty(logp[samples], logq[samples], "k3").mean()
    assert abs(mc.item() - true_kl.item()) < 0.005

    with pytest.raises(ValueError, match="unknown KL kind"):
        kl_penalty(logp, logq, "k4")


def test_k3_is_clamped_and_finite():
    logp = torch.tensor([0.0, -100.0, -1e4], requires_grad=True)
    ref = torch.tensor([-100.0, 0.0, 0.0])
    k3 = kl_penalty(logp, ref, "k3")
    assert torch.isfinite(k3).all() and (k3 <= 10).all() and k3.max() == 10
    k3.sum().backward()
    assert torch.isfinite(logp.grad).all()


def test_adaptive_kl_controller_moves_towards_target():
    ctl = AdaptiveKLController(init_coef=0.1, target=1.0, horizon=100)
    ctl.update(current_kl=1.1, n_steps=10)  # above target -> stronger penalty
    assert ctl.value == pytest.approx(0.1 * (1 + 0.1 * 10 / 100))
    before = ctl.value
    ctl.update(current_kl=0.5, n_steps=10)  # below target -> weaker, error clipped to -0.2
    assert ctl.value == pytest.approx(before * (1 - 0.2 * 10 / 100))
    ctl2 = AdaptiveKLController(0.1, 1.0, 100)
    ctl2.update(current_kl=50.0, n_steps=100)  # error clipped to +0.2
    assert ctl2.value == pytest.approx(0.12)
    fixed = FixedKLController(0.001)
    fixed.update(5.0, 10)
    assert fixed.value == 0.001


def test_apply_kl_penalty_only_on_policy_tokens():
    mask = torch.tensor([[1, 0, 1, 0], [1, 1, 1, 1]])
    scores = torch.tensor([[0.0, 0.0, 1.0, 0.0], [0.0, 0.0, 0.0, -1.0]])
    logp = torch.tensor([[-1.0, float("nan"), -2.0, float("inf")], [-1.0, -1.0, -1.0, -1.0]])
    ref = torch.tensor([[-1.5, -3.0, -2.0, 0.0], [-1.0, -0.5, -1.0, -1.5]])
    rewards, mean_kl = apply_kl_penalty(scores, logp, ref, mask, kl_coef=0.1, kind="k1")
    kl = torch.tensor([[0.5, 0.0, 0.0, 0.0], [0.0, -0.5, 0.0, 0.5]])
    assert torch.allclose(rewards, scores - 0.1 * kl)
    # per-sequence means: 0.25 and 0.0
    assert mean_kl == pytest.approx(0.125)


# --------------------------------------------------------------------- losses
def test_agg_loss_modes():
    loss = torch.tensor([[1.0, 2.0, float("nan")], [4.0, float("inf"), 0.0], [9.0, 9.0, 9.0]])
    mask = torch.tensor([[1, 1, 0], [1, 0, 0], [0, 0, 0]])
    assert agg_loss(loss, mask, "token-mean").item() == pytest.approx(7 / 3)
    assert agg_loss(loss, mask, "seq-mean-token-sum").item() == pytest.approx(3.5)
    assert agg_loss(loss, mask, "seq-mean-token-mean").item() == pytest.approx(2.75)
    assert agg_loss(loss, mask, "seq-mean-token-sum-norm").item() == pytest.approx(7 / 3 / 3)
    assert agg_loss(loss, mask, "seq-mean-token-sum-norm", norm_const=7).item() == pytest.approx(1 / 3)
    with pytest.raises(ValueError, match="unknown loss aggregation"):
        agg_loss(loss, mask, "mean")


def test_policy_loss_positive_advantage_raises_logp_after_sgd_step():
    for sign in (1.0, -1.0):
        theta = torch.zeros(3, requires_grad=True)
        action = torch.tensor([[1]])
        logp0 = torch.log_softmax(theta, -1)[action]  # (1, 1)
        old = logp0.detach()
        loss, _ = policy_loss(logp0, old, torch.full((1, 1), sign), torch.ones(1, 1))
        loss.backward()
        with torch.no_grad():
            theta -= 0.5 * theta.grad
            new = torch.log_softmax(theta, -1)[action]
        assert (new - old).item() * sign > 0


def test_policy_loss_clip_fractions_and_value():
    ratio = torch.tensor([[1.5, 0.5, 1.0, 1.1, 3.0]])
    adv = torch.tensor([[1.0, -1.0, 1.0, -1.0, 1.0]])
    mask = torch.tensor([[1, 1, 1, 1, 0]])  # the last token (huge ratio) is not the policy's
    old = torch.full((1, 5), -2.0)
    logp = (old + ratio.log()).requires_grad_()
    loss, metrics = policy_loss(logp, old, adv, mask)
    # per-token losses: max(-A r, -A clip(r)) = [-1.2, 0.8, -1.0, 1.1]
    assert loss.item() == pytest.approx((-1.2 + 0.8 - 1.0 + 1.1) / 4)
    assert metrics["pg_clipfrac"] == pytest.approx(0.5)  # tokens 0 and 1
    assert metrics["ppo_kl"] == pytest.approx(-(math.log(1.5) + math.log(0.5) + 0 + math.log(1.1)) / 4)
    assert metrics["pg_clipfrac_lower"] == 0.0
    loss.backward()
    # clipped tokens and masked tokens get no gradient
    assert logp.grad[0, 0] == 0 and logp.grad[0, 1] == 0 and logp.grad[0, 4] == 0
    assert logp.grad[0, 2] != 0 and logp.grad[0, 3] != 0


def test_dual_clip_caps_negative_advantage_loss():
    ratio = torch.tensor([[5.0, 5.0, 2.0]])
    adv = torch.tensor([[-1.0, 1.0, -1.0]])
    old = torch.zeros(1, 3)
    logp = ratio.log().requires_grad_()
    loss, metrics = policy_loss(logp, old, adv, torch.ones(1, 3), dual_clip_c=3.0)
    # token 0: max(5, 1.2) = 5 capped to 3; token 1: max(-5, -1.2) = -1.2; token 2: 2 < 3, kept
    assert loss.item() == pytest.approx((3.0 - 1.2 + 2.0) / 3)
    assert metrics["pg_clipfrac_lower"] == pytest.approx(1 / 3)
    loss.backward()
    assert logp.grad[0, 0] == 0 and logp.grad[0, 2] != 0
    plain, _ = policy_loss(logp, old, adv, torch.ones(1, 3))
    assert plain.item() == pytest.approx((5.0 - 1.2 + 2.0) / 3)
    with pytest.raises(ValueError, match="dual_clip_c"):
        policy_loss(logp, old, adv, torch.ones(1, 3), dual_clip_c=1.0)


def test_decoupled_clip_is_asymmetric():
    ratio = torch.tensor([[1.25, 0.75]])
    adv = torch.tensor([[1.0, -1.0]])
    old = torch.zeros(1, 2)
    mask = torch.ones(1, 2)
    _, sym = policy_loss(ratio.log(), old, adv, mask, clip_low=0.2, clip_high=0.2)
    assert sym["pg_clipfrac"] == pytest.approx(1.0)
    logp = ratio.log().requires_grad_()
    loss, dec = policy_loss(logp, old, adv, mask, clip_low=0.2, clip_high=0.28)
    assert dec["pg_clipfrac"] == pytest.approx(0.5)  # 1.25 is inside [0.8, 1.28], 0.75 is not
    loss.backward()
    assert logp.grad[0, 0] != 0 and logp.grad[0, 1] == 0


def test_value_loss_clipping():
    values = torch.tensor([[2.0, 0.2, 2.0, 100.0]], requires_grad=True)
    old = torch.zeros(1, 4)
    returns = torch.tensor([[3.0, 1.0, 0.0, 0.0]])
    mask = torch.tensor([[1, 1, 1, 0]])
    loss, metrics = value_loss(values, old, returns, mask, clip_range=0.5)
    # token 0: unclipped (2-3)^2 = 1 < clipped (0.5-3)^2 = 6.25 -> 6.25 (clipped, no gradient)
    # token 1: inside the range, both 0.64; token 2: unclipped (2-0)^2 = 4 > clipped 0.25 -> 4
    assert loss.item() == pytest.approx(0.5 * (6.25 + 0.64 + 4.0) / 3)
    assert metrics["vf_clipfrac"] == pytest.approx(1 / 3)
    loss.backward()
    assert values.grad[0, 0] == 0 and values.grad[0, 3] == 0
    assert values.grad[0, 1] != 0 and values.grad[0, 2] != 0
    unclipped, m2 = value_loss(values, old, returns, mask, clip_range=None)
    assert unclipped.item() == pytest.approx(0.5 * (1 + 0.64 + 4.0) / 3) and m2["vf_clipfrac"] == 0.0


def test_kl_loss_is_masked_mean_of_estimator():
    logp = torch.tensor([[-1.0, -2.0, float("nan")]])
    ref = torch.tensor([[-1.5, -1.0, -1.0]])
    mask = torch.tensor([[1, 1, 0]])
    k3 = kl_penalty(logp[:, :2], ref[:, :2], "k3")
    assert kl_loss(logp, ref, mask, "k3").item() == pytest.approx(k3.mean().item())


# ---------------------------------------------------------------- from logits
def test_logprobs_and_entropy_from_logits_match_reference():
    g = torch.Generator().manual_seed(0)
    logits = torch.randn(3, 5, 11, generator=g) * 4
    labels = torch.randint(0, 11, (3, 5), generator=g)
    ref = torch.log_softmax(logits, -1).gather(-1, labels[..., None]).squeeze(-1)
    for chunk in (1, 4, 1024):
        assert torch.allclose(logprobs_from_logits(logits, labels, chunk_rows=chunk), ref, atol=1e-5)
        ent = entropy_from_logits(logits, chunk_rows=chunk)
        assert ent.shape == (3, 5)
        assert torch.allclose(ent, torch.distributions.Categorical(logits=logits).entropy(), atol=1e-5)
    # bf16 logits are upcast before the reduction
    lp16 = logprobs_from_logits(logits.bfloat16(), labels)
    assert lp16.dtype == torch.float32
    ref16 = torch.log_softmax(logits.bfloat16().float(), -1).gather(-1, labels[..., None]).squeeze(-1)
    assert torch.allclose(lp16, ref16, atol=1e-5)
    # gradients flow through the chunked form
    x = logits.clone().requires_grad_()
    logprobs_from_logits(x, labels, chunk_rows=4).sum().backward()
    y = logits.clone().requires_grad_()
    torch.log_softmax(y, -1).gather(-1, labels[..., None]).sum().backward()
    assert torch.allclose(x.grad, y.grad, atol=1e-5)


# ------------------------------------------------- token-level normalisation (DAPO)
def test_token_mean_weighs_every_token_of_the_mini_batch_equally_however_split():
    """The actor's weighting: micro-batch loss x units(micro) / units(mini-batch) x world, gradients
    averaged over ranks. With token-mean each policy token's gradient is 1 / (policy tokens in the
    mini-batch), whichever rank and micro-batch holds it and however long its sequence is."""
    from verl.workers.micro_batch import loss_units

    torch.manual_seed(0)
    mask = torch.zeros(6, 5)
    for row, n in enumerate([5, 1, 3, 2, 5, 4]):  # 20 policy tokens, sequences of very different length
        mask[row, :n] = 1
    loss_mat = torch.randn(6, 5, dtype=D, requires_grad=True)
    world, ranks = 2, [[[0, 1], [2]], [[3], [4, 5]]]  # rank -> micro-batches (row indices)
    total = loss_units(mask, "token-mean")
    assert total == 20
    grad = torch.zeros(6, 5, dtype=D)
    value = 0.0
    for micro_batches in ranks:
        for idx in micro_batches:
            part = agg_loss(loss_mat[idx], mask[idx], "token-mean")
            weight = loss_units(mask[idx], "token-mean") / total * world
            (g,) = torch.autograd.grad(part * weight, loss_mat)
            grad += g / world  # the data-parallel all-reduce averages gradients over ranks
            value += part.item() * weight / world
    assert torch.allclose(grad, mask.to(D) / 20)
    assert value == pytest.approx(agg_loss(loss_mat, mask, "token-mean").item())
    # seq-mean-token-mean would weigh the lone token of row 1 five times as much as a token of row 0
    (g_seq,) = torch.autograd.grad(agg_loss(loss_mat, mask, "seq-mean-token-mean"), loss_mat)
    assert g_seq[1, 0] == pytest.approx(5 * g_seq[0, 0].item())


def test_grpo_leaves_rows_masked_out_whole_out_of_the_group():
    """AdaTurn's mask baseline: a row without policy tokens must not shift its group's mean or std."""
    mask = torch.tensor([[1, 1], [0, 0], [1, 0], [1, 1]])
    adv, _ = compute_grpo_advantages(torch.tensor([1.0, -1.0, 0.0, 0.0]), ["a"] * 4, mask)
    ref, _ = compute_grpo_advantages(torch.tensor([1.0, 0.0, 0.0]), ["a"] * 3, mask[[0, 2, 3]])
    assert torch.allclose(adv[[0, 2, 3]], ref)
    assert torch.equal(adv[1], torch.zeros(2))
    assert adv[0, 0] == pytest.approx(2 / 3 / (1 / 3) ** 0.5, rel=1e-4)  # (1 - 1/3) / std of [1, 0, 0]
