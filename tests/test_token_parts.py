"""Per-part metrics: the protocol's labels of each response token (router_r1/token_parts.py) and the trainer's
advantage / value / surprisal per part (verl/trainer/part_metrics.py), policy tokens only."""
import types

import numpy as np
import pytest
import torch
from omegaconf import OmegaConf

from router_r1.token_parts import PART_NAMES, char_parts, names_pattern, response_parts, token_parts
from verl.trainer.env_interface import RolloutResult
from verl.trainer.part_metrics import part_metrics, part_tensor
from verl.trainer.ppo_trainer import PPOTrainer
from verl.workers.rollout.base import SamplingParams

THINK, MODEL, QUERY, ANSWER, THINK_MODEL = 1, 2, 3, 4, 5


def test_each_token_takes_the_part_of_its_first_visible_character():
    toks = ["<think>", "A", " science", " fact", ".", "</think>", "\n", "<search>", "Qwen", "-7B", ":", " who",
            " found", " X", "?", "</search>", "\n\n", "<information>", "Bo", ".", "</information>", "<answer>",
            " Bo", "</answer>"]
    want = [0, THINK, THINK, THINK, THINK, 0, 0, 0, MODEL, MODEL, 0, QUERY, QUERY, QUERY, QUERY, 0, 0, 0, 0, 0, 0,
            0, ANSWER, 0]
    assert token_parts(toks) == want
    assert char_parts("<search>no colon</search>") == [0] * 25  # not a route: nothing labelled
    names = names_pattern(["Qwen", "Qwen-7B"])  # the longer name wins where both match
    assert token_parts(toks, names) == want  # "Qwen" outside the think stays the route's
    think = ["<think>", "Ask", " Qwen", "-7B", ".", "</think>", "<search>", "Qwen", "-7B", ":", " q", "</search>"]
    assert token_parts(think, names) == [0, THINK, THINK_MODEL, THINK_MODEL, THINK, 0, 0, MODEL, MODEL, 0, QUERY, 0]
    assert PART_NAMES[MODEL - 1] == "route_model" and PART_NAMES[ANSWER - 1] == "answer"


def test_a_real_tokenizer_labels_the_route_and_answer_tokens(tok):
    text = ("<think>Ask LLaMA-3.1-70B-Instruct.</think>\n<search>LLaMA-3.1-70B-Instruct: capital of Veloria?</search>"
            "<answer>Orlan</answer>")
    ids = tok(text, add_special_tokens=False)["input_ids"]
    parts = response_parts(tok, ids, names_pattern(["LLaMA-3.1-70B-Instruct", "LLaMA-3.1-70B"]))
    assert len(parts) == len(ids)
    by_part = {k: tok.decode([i for i, p in zip(ids, parts) if p == k]).replace(" ", "") for k in (1, 2, 3, 4, 5)}
    assert by_part == {THINK: "Ask.", MODEL: "LLaMA-3.1-70B-Instruct", QUERY: "capitalofVeloria?", ANSWER: "Orlan",
                       THINK_MODEL: "LLaMA-3.1-70B-Instruct"}


def test_part_metrics_read_policy_tokens_only():
    parts = torch.tensor([[MODEL, QUERY, QUERY, ANSWER, MODEL], [MODEL, THINK, 0, ANSWER, 0]])
    mask = torch.tensor([[1, 1, 1, 1, 0], [1, 1, 0, 1, 0]])  # the last MODEL token of row 0 is the env's
    adv = torch.tensor([[1.0, 2.0, 4.0, 3.0, 100.0], [-1.0, 5.0, 7.0, -3.0, 0.0]])
    logp = torch.log(torch.tensor([[0.5, 1.0, 1.0, 0.25, 1e-9], [0.25, 1.0, 1.0, 1.0, 1.0]]))
    values = torch.tensor([[0.2, 0.0, 0.0, 0.4, 9.0], [0.6, 0.0, 0.0, 0.8, 0.0]])
    m = part_metrics(parts, PART_NAMES, mask, adv, logp, values, scores=torch.tensor([1.0, 0.0]))
    assert m["part/route_model/share"] == pytest.approx(2 / 7)
    assert m["part/route_model/adv"] == pytest.approx(0.0) and m["part/route_model/adv_abs"] == pytest.approx(1.0)
    assert m["part/route_model/adv_won"] == pytest.approx(1.0) and m["part/route_model/adv_lost"] == pytest.approx(-1.0)
    assert m["part/route_model/surprisal"] == pytest.approx((np.log(2) + np.log(4)) / 2)
    assert m["part/route_model/value"] == pytest.approx(0.4)
    assert m["part/route_query/adv"] == pytest.approx(3.0) and "part/route_query/adv_lost" not in m
    assert m["part/answer/value"] == pytest.approx(0.6)
    assert m["part/answer/value_won"] == pytest.approx(0.4) and m["part/answer/value_lost"] == pytest.approx(0.8)
    with pytest.raises(ValueError, match="token_part row 0 has 6 labels for a response of 5 tokens"):
        part_tensor([[0] * 6], (1, 5))


def test_the_trainer_carries_the_envs_labels_into_its_step_metrics(tok):
    """to_batch asks the env to label the batch's response tokens; _episode_metrics reports part/* when the env
    names parts."""
    env = types.SimpleNamespace(part_names=PART_NAMES, token_parts=lambda rows: [response_parts(tok, r) for r in rows])
    cfg = OmegaConf.create({"algorithm": {}})
    trainer = types.SimpleNamespace(tokenizer=tok, cfg=cfg, env=env, rollout_imbalance=None)
    ids = tok("<search>Gemma-2-27B-Instruct: who?</search>", add_special_tokens=False)["input_ids"]
    parts = response_parts(tok, ids)
    result = RolloutResult([[5, 6]], [ids], [[1] * len(ids)])
    rows = [types.SimpleNamespace(uid="u0")]
    batch = PPOTrainer.to_batch(trainer, result, rows, np.array([1.0]), SamplingParams(temperature=1.0))
    mask = batch.batch["response_mask"].float()
    batch.batch["advantages"] = torch.where(torch.tensor([[p == MODEL for p in parts]]), 2.0, 0.5) * mask
    batch.batch["old_log_probs"] = torch.zeros_like(mask)
    m = PPOTrainer._episode_metrics(trainer, batch, {}, mask, 1.0)
    assert m["part/route_model/adv"] == pytest.approx(2.0) and m["part/route_query/adv"] == pytest.approx(0.5)
    trainer.env = types.SimpleNamespace()  # an env without part names: no part metrics
    assert not any(k.startswith("part/") for k in PPOTrainer._episode_metrics(trainer, batch, {}, mask, 1.0))


def test_decision_parts_scale_the_advantage_on_the_named_parts_only(tok):
    """algorithm.decision_parts=[route_model] decision_adv_weight=4: the route name's advantage is 4x the one the
    estimator gave, every other token's unchanged; a part the env does not label is refused at start."""
    from verl.trainer.config import AlgorithmConfig
    from verl.trainer.ppo_trainer import check_decision_parts

    env = types.SimpleNamespace(part_names=PART_NAMES, token_parts=lambda rows: [response_parts(tok, r) for r in rows])
    ids = tok("<think>Ask.</think><search>Gemma-2-27B-Instruct: who?</search>", add_special_tokens=False)["input_ids"]
    parts = response_parts(tok, ids)
    assert MODEL in parts and THINK in parts
    result = RolloutResult([[5, 6], [5, 6]], [ids, ids], [[1] * len(ids)] * 2)
    rows = [types.SimpleNamespace(uid="u0"), types.SimpleNamespace(uid="u1")]

    def advantages(**alg):
        cfg = OmegaConf.create({"algorithm": OmegaConf.structured(AlgorithmConfig(use_kl_in_reward=False, **alg))})
        trainer = types.SimpleNamespace(tokenizer=tok, cfg=cfg, env=env, ref=None, floor_ids=[])
        trainer._decision_tokens = types.MethodType(PPOTrainer._decision_tokens, trainer)
        batch = PPOTrainer.to_batch(trainer, result, rows, np.array([1.0, 0.0]), SamplingParams(temperature=1.0))
        mask = batch.batch["response_mask"].float()
        batch.batch["values"] = torch.zeros_like(mask)
        out = PPOTrainer._advantages(trainer, batch, mask, {})
        return out["advantages"], mask, out.get("entropy_weights"), out.get("kl_weights")

    plain, mask, no_bonus, no_kl_weights = advantages()
    scaled, _, _, _ = advantages(decision_parts=["route_model"], decision_adv_weight=4.0)
    route = torch.tensor([[p == MODEL for p in parts]] * 2)
    assert plain.abs().sum() > 0
    assert torch.allclose(scaled[route], 4.0 * plain[route])
    assert torch.equal(scaled[~route], plain[~route])
    # decision_entropy_coef: a bonus weight on the same tokens (the actor multiplies it by each token's entropy)
    same, _, bonus, _ = advantages(decision_parts=["route_model"], decision_entropy_coef=0.3)
    assert no_bonus is None and torch.equal(same, plain)
    assert torch.equal(bonus, torch.where(route, 0.3, 0.0))
    # decision_kl_weight: the KL loss's per-token weight, w on the same tokens and 1 on every other
    same, _, _, kl_weights = advantages(decision_parts=["route_model"], decision_kl_weight=0.0)
    assert no_kl_weights is None and torch.equal(same, plain)
    assert torch.equal(kl_weights, torch.where(route, 0.0, 1.0))
    kl_free = AlgorithmConfig(decision_parts=["route_model"], decision_kl_weight=0.0)
    check_decision_parts(OmegaConf.structured(kl_free), env, use_kl_loss=True)
    with pytest.raises(ValueError, match="no KL loss to weigh"):
        check_decision_parts(OmegaConf.structured(kl_free), env, use_kl_loss=False)
    with pytest.raises(ValueError, match="decision_kl_weight acts on .* none are named"):
        check_decision_parts(OmegaConf.structured(AlgorithmConfig(decision_kl_weight=0.0)), env, use_kl_loss=True)
    with pytest.raises(ValueError, match="decision_kl_weight must be >= 0"):
        check_decision_parts(OmegaConf.structured(AlgorithmConfig(decision_parts=["route_model"],
                                                                  decision_kl_weight=-1.0)), env, use_kl_loss=True)
    with pytest.raises(ValueError, match="none are named"):
        check_decision_parts(OmegaConf.structured(AlgorithmConfig(decision_entropy_coef=0.1)), env)
    with pytest.raises(ValueError, match=r"\['route'\] not among the env's token parts"):
        check_decision_parts(OmegaConf.structured(AlgorithmConfig(decision_parts=["route"], decision_adv_weight=2.0)), env)
    with pytest.raises(ValueError, match="it labels none"):
        check_decision_parts(OmegaConf.structured(AlgorithmConfig(decision_parts=["route_model"])), types.SimpleNamespace())
    with pytest.raises(ValueError, match="must be > 0"):
        check_decision_parts(OmegaConf.structured(AlgorithmConfig(decision_parts=["route_model"], decision_adv_weight=0)), env)


def test_name_floor_weights_the_first_token_of_each_named_model_in_the_think(tok):
    """algorithm.name_floor: choice_mask is 1 at the first token of each think_model span (the choice; the route's
    name only copies it) and 0 elsewhere; the trainer's ids are the env's choice tokens."""
    from verl.trainer.config import AlgorithmConfig
    from verl.trainer.ppo_trainer import name_floor_ids, span_starts

    names = names_pattern(["Qwen2.5-7B-Instruct", "LLaMA-3.1-8B-Instruct"])
    env = types.SimpleNamespace(part_names=PART_NAMES, choice_token_ids=lambda: [7, 11],
                                token_parts=lambda rows: [response_parts(tok, r, names) for r in rows])
    text = ("<think>Ask Qwen2.5-7B-Instruct.</think><search>Qwen2.5-7B-Instruct: who?</search>"
            "<think>No answer. Ask LLaMA-3.1-8B-Instruct.</think><search>LLaMA-3.1-8B-Instruct: who?</search>")
    ids = tok(text, add_special_tokens=False)["input_ids"]
    parts = response_parts(tok, ids, names)
    result = RolloutResult([[5, 6]], [ids], [[1] * len(ids)])
    cfg = OmegaConf.create({"algorithm": OmegaConf.structured(
        AlgorithmConfig(use_kl_in_reward=False, name_floor=0.05, name_floor_coef=3.0))})
    trainer = types.SimpleNamespace(tokenizer=tok, cfg=cfg, env=env, ref=None,
                                    floor_ids=name_floor_ids(cfg.algorithm, env))
    batch = PPOTrainer.to_batch(trainer, result, [types.SimpleNamespace(uid="u0")], np.array([1.0]),
                                SamplingParams(temperature=1.0))
    mask = batch.batch["response_mask"].float()
    batch.batch["values"] = torch.zeros_like(mask)
    metrics = {}
    weights = PPOTrainer._advantages(trainer, batch, mask, metrics)["choice_mask"][0]
    starts = [i for i, p in enumerate(parts) if p == THINK_MODEL and (i == 0 or parts[i - 1] != THINK_MODEL)]
    assert len(starts) == 2 and sum(p == THINK_MODEL for p in parts) > 2  # multi-token names: only the first counts
    assert weights.nonzero().flatten().tolist() == starts and set(weights[starts].tolist()) == {1.0}
    assert tok.decode([ids[starts[1]]]).strip().startswith("LL") and metrics["actor/name_floor_positions"] == 2
    assert span_starts(torch.tensor([[5, 5, 0, 5, 2, 5]]), 5).tolist() == [[True, False, False, True, False, True]]
    assert trainer.floor_ids == [7, 11] and name_floor_ids(OmegaConf.structured(AlgorithmConfig()), env) == []
    for bad, match in [(dict(name_floor=0.6), "more than all the probability"),
                       (dict(name_floor=1.5), r"must be in \(0, 1\)"),
                       (dict(name_floor=0.05, name_floor_coef=0.0), "name_floor_coef > 0"),
                       (dict(name_floor=0.05, name_floor_part="route"), "'route' not among")]:
        with pytest.raises(ValueError, match=match):
            name_floor_ids(OmegaConf.structured(AlgorithmConfig(**bad)), env)
    with pytest.raises(ValueError, match="names no choice tokens"):
        name_floor_ids(OmegaConf.structured(AlgorithmConfig(name_floor=0.05)), types.SimpleNamespace(part_names=PART_NAMES))


def test_the_routers_choice_tokens_are_each_pool_names_first_token_after_ask(tok):
    """RouterEnv.choice_token_ids: one id per distinct first token of the pool's names as "Ask X" writes them."""
    from router_r1.pool.registry import ModelRegistry
    from router_r1.router_env import RouterEnv

    registry = ModelRegistry.from_yaml("configs/pool/sim.yaml")
    env = types.SimpleNamespace(tok=tok, registry=registry)
    ids = RouterEnv.choice_token_ids(env)
    firsts = {}
    for m in registry.models.values():
        full = tok(f"<think>Ask {m.name}.</think>", add_special_tokens=False)["input_ids"]
        parts = response_parts(tok, full, names_pattern([m.name]))
        firsts[m.name] = full[parts.index(THINK_MODEL)]  # the token the trainer's floor position holds
    assert ids == sorted(set(firsts.values())) and len(ids) >= 2
