"""The actor's update against an independent computation of its objective (issue 43: rule out a defect in the update).

The worker's gradient on a fixed batch equals autograd of the clipped PPO surrogate written out here from the
paper's formula (Schulman et al. 2017, eq. 7; token-mean over policy tokens, KL loss k3 as GRPO's), for GAE-style
per-token advantages and GRPO's per-sequence ones; the importance ratio is exactly 1 on the first mini-batch of a
step; advantages reach the loss only on the tokens the policy wrote."""
import copy

import pytest
import torch

from test_fsdp_workers import actor_config, grads_of, make_batch, with_old_log_probs
from verl.algos.advantages import compute_grpo_advantages
from verl.protocol import DataProto
from verl.workers.actor import ActorWorker
from verl.workers.fsdp import full_state_dict

pytestmark = pytest.mark.usefixtures("one_thread")
PROMPT = 6  # make_batch's prompt length


def actor(**kw):
    w = ActorWorker(actor_config(**kw))
    w.init_model()
    return w


def independent_loss(model, data: DataProto, temperature: float, clip: float, kl_coef: float = 0.0,
                     kl_weights: torch.Tensor | None = None):
    """The clipped surrogate, token-mean over policy tokens, from a plain forward (no worker code); `kl_weights`
    (batch, resp) scale each token's KL term."""
    b = data.batch
    logits = model(input_ids=b["input_ids"], attention_mask=b["attention_mask"],
                   position_ids=b["position_ids"]).logits[:, PROMPT - 1:-1] / temperature  # (batch, resp, vocab)
    logp = torch.log_softmax(logits.float(), -1).gather(-1, b["responses"][..., None]).squeeze(-1)
    mask = b["response_mask"].bool()
    ratio = torch.exp(logp - b["old_log_probs"])
    adv = b["advantages"]
    surrogate = torch.minimum(ratio * adv, ratio.clamp(1 - clip, 1 + clip) * adv)  # (batch, resp)
    loss = -surrogate[mask].mean()
    if kl_coef:
        d = b["ref_log_prob"] - logp  # k3 = exp(d) - d - 1 (Schulman's unbiased, non-negative estimator)
        k3 = torch.exp(d) - d - 1
        loss = loss + kl_coef * (k3 if kl_weights is None else k3 * kl_weights)[mask].mean()
    return loss


def independent_entropy_bonus(model, data: DataProto, temperature: float):
    """sum over policy tokens of entropy_weights x the token's entropy, over the policy-token count (token-mean)."""
    b = data.batch
    logits = model(input_ids=b["input_ids"], attention_mask=b["attention_mask"],
                   position_ids=b["position_ids"]).logits[:, PROMPT - 1:-1].float() / temperature
    entropy = -(torch.softmax(logits, -1) * torch.log_softmax(logits, -1)).sum(-1)  # (batch, resp)
    mask = b["response_mask"].bool()
    return (entropy * b["entropy_weights"])[mask].sum() / mask.sum()


def reference_grads(worker_before, data, **kw):
    model = copy.deepcopy(worker_before)
    model.zero_grad(set_to_none=True)
    independent_loss(model, data, **kw).backward()
    return {n: p.grad.detach().clone() for n, p in model.named_parameters()}


def off_policy_batch(worker, seed, grpo: bool):
    """A batch whose old log-probs differ from the current ones, so some ratios leave [0.8, 1.2] and clip."""
    data = with_old_log_probs(worker, make_batch(n=8, seed=seed))
    g = torch.Generator().manual_seed(seed)
    mask = data.batch["response_mask"]
    data.batch["old_log_probs"] = (data.batch["old_log_probs"] + 0.4 * torch.randn(mask.shape, generator=g)) * mask
    data.batch["ref_log_prob"] = (data.batch["old_log_probs"] + 0.2 * torch.randn(mask.shape, generator=g)) * mask
    if grpo:  # one score per episode, groups of 4 (two prompts)
        scores = torch.tensor([1.0, 0.0, 0.0, 1.0, -1.0, 0.0, 1.0, 1.0])
        data.batch["advantages"], _ = compute_grpo_advantages(scores, ["a"] * 4 + ["b"] * 4, mask)
    return data


@pytest.mark.parametrize("grpo,kl_coef,temperature", [(False, 0.0, 1.0), (False, 0.1, 0.7), (True, 0.1, 1.0)])
def test_actor_gradient_equals_the_clipped_objective_computed_independently(grpo, kl_coef, temperature):
    worker = actor(ppo_epochs=1, use_kl_loss=kl_coef > 0, kl_loss_coef=kl_coef, kl_loss_type="k3",
                   ppo_micro_batch_size=3)  # micro-batches of 3, 3, 2 rows: the loop must reweight them
    data = off_policy_batch(worker, seed=11, grpo=grpo)
    data.meta["temperature"] = temperature
    before = copy.deepcopy(worker.model)
    want = reference_grads(before, data, temperature=temperature, clip=0.2, kl_coef=kl_coef)
    metrics = worker.update_actor(data)
    assert metrics["actor/pg_clipfrac"] > 0  # the clipped branch is exercised
    got = grads_of(worker)
    for name in want:
        torch.testing.assert_close(got[name], want[name], atol=1e-6, rtol=1e-4, msg=lambda m: f"{name}: {m}")


@pytest.mark.parametrize("kw", [dict(), dict(logprob_chunk_size=None), dict(use_remove_padding=True, logprob_chunk_size=5),
                                dict(max_tokens_per_micro_batch=20, log_prob_max_tokens_per_micro_batch=33)])
@pytest.mark.parametrize("temperature", [1.0, 0.6])
def test_ratio_is_one_on_the_first_mini_batch(kw, temperature):
    """Old log-probs (no-grad pass, eval mode) and the update's (grad pass, train mode) are the same numbers."""
    worker = actor(ppo_epochs=1, ppo_mini_batch_size=4, **kw)
    data = make_batch(n=8, seed=12)
    data.meta["temperature"] = temperature
    data = with_old_log_probs(worker, data)
    first = data[list(range(4))]
    first.meta.update(data.meta)
    metrics = worker.update_actor(first)
    assert abs(metrics["actor/ppo_kl"]) < 1e-6 and metrics["actor/pg_clipfrac"] == 0.0, metrics


def test_advantages_reach_the_loss_only_on_policy_tokens():
    """An advantage on an environment or padding token changes nothing; one on a policy token does."""
    base = with_old_log_probs(actor(), make_batch(seed=13))
    env_tokens = ~base.batch["response_mask"].bool()

    def update(advantages):
        w = actor()
        d = DataProto.from_dict({**{k: v.clone() for k, v in base.batch.items()}, "advantages": advantages},
                                meta=base.meta)
        w.update_actor(d)
        return full_state_dict(w.model)

    plain = update(base.batch["advantages"])
    on_env = base.batch["advantages"].clone()
    on_env[env_tokens] = 100.0
    moved = base.batch["advantages"].clone()
    moved[~env_tokens] += 1.0
    same, other = update(on_env), update(moved)
    assert all(torch.equal(plain[k], same[k]) for k in plain)
    assert any(not torch.allclose(plain[k], other[k]) for k in plain)


def test_gap_diagnosis_labels_each_policy_token_by_where_it_stands():
    from experiments.rl_warm_start.diagnose_gap import segment_at

    text = "<think>geo</think>\n<search>GeoMind-3B: capital of Aploria?</search>\n<information>x</information><answer>"
    cuts = {"<think>ge": "think", "<think>geo</think>\n": "glue", "<think>geo</think>\n<search>Geo": "name",
            "<think>geo</think>\n<search>GeoMind-3B: cap": "query", text: "answer",
            text.replace("<answer>", ""): "glue"}
    assert {t: segment_at(t) for t in cuts} == cuts


def test_decision_entropy_bonus_is_the_weighted_entropy_of_the_named_tokens_only():
    """algorithm.decision_entropy_coef: the trainer's entropy_weights (coef on decision tokens, 0 elsewhere) add
    -token-mean(w x entropy) to the clipped objective, and nothing else changes."""
    worker = actor(ppo_epochs=1, ppo_micro_batch_size=3)
    data = off_policy_batch(worker, seed=5, grpo=False)
    data.meta["temperature"] = 0.7
    mask = data.batch["response_mask"].bool()
    chosen = torch.zeros_like(mask)
    chosen[:, 2:4] = True  # two "name" tokens a row
    data.batch["entropy_weights"] = (chosen & mask).float() * 0.5
    before = copy.deepcopy(worker.model)
    model = copy.deepcopy(before)
    model.zero_grad(set_to_none=True)
    (independent_loss(model, data, temperature=0.7, clip=0.2)
     - independent_entropy_bonus(model, data, temperature=0.7)).backward()
    want = {n: p.grad.detach().clone() for n, p in model.named_parameters()}
    without = reference_grads(before, data, temperature=0.7, clip=0.2)
    metrics = worker.update_actor(data)
    assert metrics["actor/entropy_bonus"] > 0
    got = grads_of(worker)
    assert any(not torch.allclose(want[n], without[n], atol=1e-6) for n in want)  # the bonus moves the gradient
    for name in want:
        torch.testing.assert_close(got[name], want[name], atol=1e-6, rtol=1e-4, msg=lambda m: f"{name}: {m}")


@pytest.mark.parametrize("kw", [dict(), dict(logprob_chunk_size=None), dict(use_remove_padding=True, logprob_chunk_size=5)])
def test_name_floor_is_a_hinge_on_each_names_mean_probability_over_the_choices(kw):
    """algorithm.name_floor: coef x sum over the choice tokens of relu(log floor - log mean_p), mean_p the token's
    probability averaged over the choice positions (the trainer's choice_mask) of each micro-batch, is added to the
    clipped objective, on the chunked and full-vocab paths; tokens no row sampled get the gradient too."""
    worker = actor(ppo_epochs=1, ppo_micro_batch_size=4, **kw)  # two micro-batches of 4 rows, a floor each
    data = off_policy_batch(worker, seed=7, grpo=False)
    temperature, coef = 0.7, 2.0
    mask = data.batch["response_mask"].bool()
    at = torch.zeros_like(mask)
    at[:, 2] = at[:, 4] = True  # two choice positions a row
    at &= mask
    ids = [4, 9, 17]
    before = copy.deepcopy(worker.model)
    b = data.batch

    def mean_logp(model):  # (2 micro-batches, 3 names)
        logits = model(input_ids=b["input_ids"], attention_mask=b["attention_mask"],
                       position_ids=b["position_ids"]).logits[:, PROMPT - 1:-1].float() / temperature
        lp = torch.log_softmax(logits, -1)[..., ids]  # (batch, resp, 3)
        return torch.stack([lp[r][at[r]].exp().mean(0).log() for r in (slice(0, 4), slice(4, 8))])

    with torch.no_grad():
        start = mean_logp(before)
    floor = float(start.median().exp())  # some (micro-batch, name) pairs under it: the hinge bites
    data.meta.update(temperature=temperature, name_ids=ids, name_floor=floor, name_floor_coef=coef)
    data.batch["choice_mask"] = at.float()
    model = copy.deepcopy(before)
    model.zero_grad(set_to_none=True)
    units = [mask[:4].sum() / mask.sum(), mask[4:].sum() / mask.sum()]  # the loop's micro-batch weights (token-mean)
    hinge = torch.relu(torch.log(torch.tensor(floor)) - mean_logp(model)).sum(-1)  # (2,)
    (independent_loss(model, data, temperature=temperature, clip=0.2) + coef * (hinge[0] * units[0]
                                                                                 + hinge[1] * units[1])).backward()
    want = {n: p.grad.detach().clone() for n, p in model.named_parameters()}
    without = reference_grads(before, data, temperature=temperature, clip=0.2)
    metrics = worker.update_actor(data)
    assert metrics["actor/name_floor_loss"] > 0 and metrics["actor/name_floor_mean_p_min"] < floor
    got = grads_of(worker)
    assert any(not torch.allclose(want[n], without[n], atol=1e-6) for n in want)  # the floor moves the gradient
    for name in want:
        torch.testing.assert_close(got[name], want[name], atol=1e-6, rtol=1e-4, msg=lambda m: f"{name}: {m}")


def test_name_floor_mean_p_min_reports_only_micro_batches_with_choices():
    """The logged minimum is the lowest micro-batch's mean probability, not weighted by token share, and a
    micro-batch without choice positions (no mean) leaves it alone."""
    worker = actor(ppo_epochs=1, ppo_micro_batch_size=4)  # one mini-batch of two micro-batches
    data = off_policy_batch(worker, seed=7, grpo=False)
    mask = data.batch["response_mask"].bool()
    at = torch.zeros_like(mask)
    at[:4, 2] = True  # choices in the first micro-batch only
    at &= mask
    ids = [4, 9, 17]
    with torch.no_grad():
        _, _, names = worker._log_prob(data, 1.0, False, torch.tensor(ids))
    want = float(names[:4][at[:4]].exp().mean(0).min())
    data.meta.update(temperature=1.0, name_ids=ids, name_floor=0.5, name_floor_coef=1.0)
    data.batch["choice_mask"] = at.float()
    assert worker.update_actor(data)["actor/name_floor_mean_p_min"] == pytest.approx(want, rel=1e-5)


def test_name_floor_lifts_a_name_no_episode_sampled():
    """Zero advantages, no sampled token is a choice: updates with the floor raise the rarest choice's mean
    probability over the choice positions toward the floor; without the choice mask nothing moves it."""
    data = with_old_log_probs(actor(), make_batch(seed=14))
    data.meta["temperature"] = 1.0
    data.batch["advantages"] = torch.zeros_like(data.batch["old_log_probs"])
    mask = data.batch["response_mask"].bool()
    at = torch.zeros_like(mask)
    at[:, 1] = True
    at &= mask
    ids = [v for v in range(5, 40) if not (data.batch["responses"][at] == v).any()][:4]  # never sampled there

    def lowest(worker):
        with torch.no_grad():
            _, _, names = worker._log_prob(data, 1.0, False, torch.tensor(ids))
        return float(names[at].exp().mean(0).min())

    floor = 0.05
    data.meta.update(name_ids=ids, name_floor=floor, name_floor_coef=1.0)
    held, plain = actor(lr=1e-2, weight_decay=0.0), actor(lr=1e-2, weight_decay=0.0)
    start = lowest(held)
    assert start < floor and lowest(plain) == start
    for _ in range(10):
        held.update_actor(DataProto.from_dict({**data.batch, "choice_mask": at.float()}, meta=data.meta))
        plain.update_actor(data)
    assert lowest(held) > start + 0.5 * (floor - start)
    assert lowest(plain) == pytest.approx(start, abs=1e-6)


def test_decision_kl_weight_scales_the_kl_of_the_named_tokens_only():
    """algorithm.decision_kl_weight: the trainer's kl_weights (w on decision tokens, 1 elsewhere) scale each token's
    k3 term inside the token-mean; at w=0 the named tokens leave the KL and the others keep theirs."""
    worker = actor(ppo_epochs=1, use_kl_loss=True, kl_loss_coef=0.5, kl_loss_type="k3", ppo_micro_batch_size=3)
    data = off_policy_batch(worker, seed=6, grpo=False)
    data.meta["temperature"] = 0.7
    mask = data.batch["response_mask"].bool()
    chosen = torch.zeros_like(mask)
    chosen[:, 2:4] = True  # two "name" tokens a row
    weights = torch.where(chosen, 0.0, 1.0)
    data.batch["kl_weights"] = weights
    before = copy.deepcopy(worker.model)
    want = reference_grads(before, data, temperature=0.7, clip=0.2, kl_coef=0.5, kl_weights=weights)
    everywhere = reference_grads(before, data, temperature=0.7, clip=0.2, kl_coef=0.5)
    worker.update_actor(data)
    got = grads_of(worker)
    assert any(not torch.allclose(want[n], everywhere[n], atol=1e-6) for n in want)  # the weights move the gradient
    for name in want:
        torch.testing.assert_close(got[name], want[name], atol=1e-6, rtol=1e-4, msg=lambda m: f"{name}: {m}")
