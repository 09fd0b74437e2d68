"""Constrained decoding of route names (router_r1/name_constraint.py, env.constrain_names, the hf engine).

Whatever the logits, a name decoded under the constraint is a listed name followed by its colon; outside an open
name the turn is free; the hf engine masks what a constraint forbids; training rollouts, log-probs and the engines
that cannot apply it refuse it.
"""
from pathlib import Path

import pytest
import torch

from router_r1.actions import parse_action
from router_r1.name_constraint import RouteNameConstraint
from router_r1.pool.registry import ModelRegistry
from router_r1.pool.client import PoolClient
from router_r1.router_env import RouterEnv, RouterEnvConfig
from router_r1.runtime import EvalError, load_policy
from tiny import tiny_model
from verl.workers.rollout import SamplingParams
from verl.workers.rollout.hf_rollout import HFRollout
from verl.workers.rollout.static_rollout import StaticRollout

ROOT = Path(__file__).resolve().parents[1]
UNSEEN = ModelRegistry.from_yaml(ROOT / "configs" / "pool" / "sim_unseen.yaml")
pytestmark = pytest.mark.usefixtures("one_thread")


def ids(tok, text):
    return tok(text, add_special_tokens=False)["input_ids"]


def test_whatever_the_logits_the_name_decoded_is_a_listed_one(tok):
    names = UNSEEN.names  # the unseen SciGLM-6B among them
    rule = RouteNameConstraint(tok, names)
    got = set()
    for seed in range(60):
        g = torch.Generator().manual_seed(seed)
        generated = ids(tok, "<think>A science fact.</think><search>")
        while (allowed := rule.allowed(generated)) is not None:
            assert len(generated) < 200
            logits = torch.randn(len(tok), generator=g)
            masked = torch.full_like(logits, float("-inf"))
            masked[allowed] = logits[allowed]
            generated.append(int(masked.argmax()))
        text = tok.decode(generated, skip_special_tokens=True)
        action = parse_action(text + " What is Sorium?</search>", UNSEEN)
        assert action.kind == "route" and action.model in names, text
        got.add(action.model)
    assert len(got) >= 3  # random logits reach several names: the constraint does not pick one


def test_a_name_is_constrained_only_while_it_is_open(tok):
    rule = RouteNameConstraint(tok, UNSEEN.names)
    assert rule.allowed(ids(tok, "<think>A science fact. Ask Sci")) is None  # not in a route
    assert rule.allowed(ids(tok, "<search>SciGLM-6B: What")) is None  # the name is done
    assert rule.allowed(ids(tok, "<search>Zzz")) is None  # already matches no name: the parser says invalid
    assert rule.allowed(ids(tok, "<search>SciGLM-6B: x</search><search>")) is not None  # a second route
    partial = rule.allowed(ids(tok, "<search>SciG"))
    for i in partial:  # each keeps "SciG" on the way to "SciGLM-6B:" or finishes it and runs on
        text = "SciG" + tok.decode([i])
        assert "SciGLM-6B:".startswith(text) or text.startswith("SciGLM-6B:"), text
    assert partial
    with pytest.raises(ValueError, match="at least one"):
        RouteNameConstraint(tok, [])


class FirstSteps:
    """A constraint that allows only `ids` for the first `n` tokens of a turn."""

    def __init__(self, ids, n):
        self.ids, self.n = list(ids), n

    def allowed(self, generated):
        return self.ids if len(generated) < self.n else None


def test_the_hf_engine_applies_a_constraint_and_the_others_refuse_it(tok):
    model = tiny_model(len(tok), seed=3)
    prompts = [ids(tok, "The router asks"), ids(tok, "Who founded")]
    rule = FirstSteps([7, 11], n=4)
    free = HFRollout(model, tok, eos_token_ids=[]).generate(prompts, SamplingParams(greedy=True, max_new_tokens=8))
    out = HFRollout(model, tok, eos_token_ids=[]).generate(
        prompts, SamplingParams(greedy=True, max_new_tokens=8, constraint=rule))
    for f, o in zip(free, out):
        assert set(o.token_ids[:4]) <= {7, 11} and len(o.token_ids) == 8
        assert f.token_ids[:4] != o.token_ids[:4]  # the model's own picks were other tokens
    sampled = HFRollout(model, tok, eos_token_ids=[]).generate(
        prompts, SamplingParams(temperature=1.0, seed=5, max_new_tokens=6, constraint=rule))
    assert all(set(o.token_ids[:4]) <= {7, 11} for o in sampled)
    with pytest.raises(ValueError, match="log-probs"):
        SamplingParams(greedy=True, return_logprobs=True, constraint=rule).validate()
    with pytest.raises(ValueError, match="hf engine only"):
        StaticRollout(model, tok, eos_token_ids=[], max_model_len=64).generate(
            prompts, SamplingParams(greedy=True, max_new_tokens=4, constraint=rule))


def test_the_env_constrains_evaluation_turns_and_refuses_training_ones(tok):
    registry = UNSEEN.seen()
    cfg = RouterEnvConfig(max_turns=3, max_obs_length=64, response_length=96, max_response_length=1024,
                          constrain_names=True)
    env = RouterEnv(cfg, tok, registry, PoolClient(registry))
    try:
        turn = env.turn_sampling(SamplingParams(greedy=True))
        assert isinstance(turn.constraint, RouteNameConstraint)
        assert turn.constraint.targets == sorted(f"{n}:" for n in registry.names)
        assert env.turn_sampling(SamplingParams(greedy=True)).constraint is turn.constraint  # built once
        with pytest.raises(ValueError, match="not training"):
            env.turn_sampling(SamplingParams(temperature=1.0), validate=False)
        plain = RouterEnv(RouterEnvConfig(max_turns=3, max_obs_length=64, response_length=96,
                                          max_response_length=1024), tok, registry, PoolClient(registry))
        assert plain.turn_sampling(SamplingParams(greedy=True)).constraint is None
        plain.client.close()
    finally:
        env.client.close()


def test_a_policy_asked_to_constrain_names_on_another_engine_is_an_error(tmp_path):
    with pytest.raises(EvalError, match="hf engine only"):
        load_policy(tmp_path, rollout="hf_static", constrain_names=True)


def test_an_evaluation_with_constrain_names_runs_the_constraint_through_the_hf_engine(tmp_path, tok):
    """The flag reaches the episodes' env and the engine: every turn's sampling carries the name constraint, and a
    tiny policy that never opens a route decodes exactly as without it."""
    import json
    from dataclasses import replace

    from data_process.sim_qa import SimConfig, build_sim
    from router_r1.eval.evaluate import EvalConfig, evaluate

    (tmp_path / "template.txt").write_text("Route or answer.\n{budget}Question: {question}\n")
    build_sim(SimConfig(out_dir=tmp_path, prompt_template=tmp_path / "template.txt", train_size=1, val_size=1,
                        test_size=3))
    ckpt = tmp_path / "ckpt"
    tok.save_pretrained(ckpt)
    tiny_model(len(tok), seed=0).save_pretrained(ckpt)
    texts = {}
    for constrain in (False, True):
        loaded, seen = load_policy(ckpt, "cpu", constrain_names=constrain), []
        assert isinstance(loaded.generate.__self__, HFRollout)

        def generate(prompts, sampling, engine=loaded.generate):  # the real engine, its samplings recorded
            seen.append(sampling.constraint)
            return engine(prompts, sampling)
        policy = replace(loaded, generate=generate)
        out = tmp_path / f"eval{int(constrain)}"
        cfg = EvalConfig(data=[str(tmp_path / "test.parquet")], checkpoints=["tiny"], sim=True, max_turns=1,
                         response_length=8, out=str(out), constrain_names=constrain)
        evaluate(cfg, load=lambda c: policy, log=lambda msg: None)
        assert seen and all(isinstance(c, RouteNameConstraint) == constrain for c in seen)
        assert json.loads((out / "summary.json").read_text())["config"]["constrain_names"] is constrain
        texts[constrain] = [json.loads(x)["text"] for x in (out / "trajectories.jsonl").read_text().splitlines()]
    assert texts[True] == texts[False] and len(texts[True]) == 3
