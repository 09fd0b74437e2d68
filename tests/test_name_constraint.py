"""Constrained decoding of route names (router_r1/name_constraint.py, env.constrain_names, the hf engine).

A name decoded under the constraint is the listed "name:" the model scores highest as a whole; outside an open
name the turn is free; the hf engine scores a choice point's options and writes the one picked; training rollouts,
log-probs and the engines that cannot apply it refuse it.
"""
from collections import Counter
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
from verl.workers.rollout.hf_rollout import HFRollout, pick
from verl.workers.rollout.static_rollout import StaticRollout

ROOT = Path(__file__).resolve().parents[1]
UNSEEN = ModelRegistry.from_yaml(ROOT / "configs" / "pool" / "sim_unseen.yaml")
pytestmark = pytest.mark.usefixtures("one_thread")


def ids(tok, text):
    return tok(text, add_special_tokens=False)["input_ids"]


def logprob(model, context, option):
    """The option's log-prob after context: one plain forward, no padding, no cache (the engine's check)."""
    with torch.no_grad():
        logp = model(input_ids=torch.tensor([context + option])).logits[0].float().log_softmax(-1)
    return sum(float(logp[len(context) + j - 1, t]) for j, t in enumerate(option))


class Opened:
    """The route-name rule for a turn that began with `head` (a random tiny model never writes `<search>` itself)."""

    def __init__(self, rule, head):
        self.rule, self.head = rule, list(head)

    def choices(self, generated):
        return self.rule.choices(self.head + generated)


def test_the_name_written_is_the_listed_one_the_model_scores_highest(tok):
    rule = RouteNameConstraint(tok, UNSEEN.names)  # the unseen SciGLM-6B among them
    head = ids(tok, "<think>A science fact.</think><search>")
    prompt = ids(tok, "Question: What is Sorium?")
    for seed in range(6):
        model = tiny_model(len(tok), seed=seed)
        out = HFRollout(model, tok, eos_token_ids=[]).generate(
            [prompt + head], SamplingParams(greedy=True, max_new_tokens=16, constraint=Opened(rule, head)))[0]
        text = tok.decode(head + out.token_ids, skip_special_tokens=True)
        text = text[:text.index(":", text.index("<search>")) + 1]  # a random model runs on after the name
        action = parse_action(text + " What is Sorium?</search>", UNSEEN)
        assert action.kind == "route" and action.model in UNSEEN.names, text
        options = rule.choices(head)
        best = max(options, key=lambda o: logprob(model, prompt + head, o))
        # the whole name the model finds likeliest (the string's probability: a random model's is the fewest
        # tokens), not the first option and not a token-by-token prefix
        assert out.token_ids[:len(best)] == best


def test_a_name_is_a_choice_only_while_it_is_open(tok):
    rule = RouteNameConstraint(tok, UNSEEN.names)
    assert rule.choices(ids(tok, "<think>A science fact. Ask Sci")) is None  # not in a route
    assert rule.choices(ids(tok, "<search>SciGLM-6B: What")) is None  # the name is done
    assert rule.choices(ids(tok, "<search>Zzz")) is None  # already matches no name: the parser says invalid
    assert len(rule.choices(ids(tok, "<search>SciGLM-6B: x</search><search>"))) == len(UNSEEN.names)  # a second route
    rests = [tok.decode(o) for o in rule.choices(ids(tok, "<search>SciG"))]
    assert rests == ["LM-6B:"]  # what completes "SciG"
    with pytest.raises(ValueError, match="at least one"):
        RouteNameConstraint(tok, [])


class Fixed:
    """A choice point at the start of every turn between fixed token sequences."""

    def __init__(self, *options):
        self.options = [list(o) for o in options]

    def choices(self, generated):
        return self.options if not generated else None


def test_the_hf_engine_scores_options_in_whole_and_the_others_refuse_a_constraint(tok):
    model = tiny_model(len(tok), seed=3)
    prompts = [ids(tok, "The router asks"), ids(tok, "Who founded")]
    options = ([7, 11, 7, 11], [11, 11], [9])  # of different lengths: padded side by side when scored
    engine = HFRollout(model, tok, eos_token_ids=[])
    for p in prompts:
        want = torch.tensor([logprob(model, p, o) for o in options])
        assert torch.allclose(engine.sequence_logprobs(p, list(options)), want, atol=1e-4)
    free = engine.generate(prompts, SamplingParams(greedy=True, max_new_tokens=8))
    out = engine.generate(prompts, SamplingParams(greedy=True, max_new_tokens=8, constraint=Fixed(*options)))
    for p, f, o in zip(prompts, free, out):
        best = max(options, key=lambda x: logprob(model, p, x))
        assert o.token_ids[:len(best)] == best and len(o.token_ids) == 8
        assert f.token_ids[:len(best)] != best  # the model's own tokens were others
    sampled = engine.generate(prompts, SamplingParams(temperature=1.0, seed=5, max_new_tokens=6,
                                                      constraint=Fixed(*options)))
    assert all(any(o.token_ids[:len(x)] == x for x in options) for o in sampled)
    with pytest.raises(ValueError, match="log-probs"):
        SamplingParams(greedy=True, return_logprobs=True, constraint=Fixed(*options)).validate()
    with pytest.raises(ValueError, match="hf engine only"):
        StaticRollout(model, tok, eos_token_ids=[], max_model_len=64).generate(
            prompts, SamplingParams(greedy=True, max_new_tokens=4, constraint=Fixed(*options)))


def test_sampling_draws_options_in_proportion_to_their_probability():
    scores = torch.tensor([-1.0, -2.0, -0.5])
    assert pick(scores, SamplingParams(greedy=True), None) == 2
    g = torch.Generator().manual_seed(0)
    draws = Counter(pick(scores, SamplingParams(temperature=2.0), g) for _ in range(4000))
    want = (scores / 2.0).softmax(-1)
    for i in range(3):
        assert abs(draws[i] / 4000 - float(want[i])) < 0.03


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

    from router_r1.eval.evaluate import EvalConfig, evaluate
    from sim_split import sim_test_split, tiny_checkpoint

    sim_test_split(tmp_path, test_size=3)
    ckpt = tiny_checkpoint(tmp_path / "ckpt", tok)
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


def test_the_cli_decodes_a_run_saved_with_constrain_names_on_the_hf_engine(tmp_path, tok, monkeypatch):
    """No flag: the checkpoint's run_config.yaml says env.constrain_names, and the CLI's loader reads the resolved
    settings (not the unset flag), so the policy is built for the constraint."""
    from router_r1.eval import evaluate as evaluate_module
    from sim_split import sim_test_split, tiny_checkpoint
    from verl.trainer.main_ppo import load_config
    from verl.trainer.config import save_run_config

    sim_test_split(tmp_path, test_size=2)
    ckpt = tiny_checkpoint(tmp_path / "ckpt", tok)
    save_run_config(load_config("embedded", ["env.constrain_names=true"]), ckpt)
    asked = []

    def recording(*args, **kwargs):
        policy = load_policy(*args, **kwargs)
        asked.append((args, kwargs, type(policy.generate.__self__)))
        return policy
    monkeypatch.setattr(evaluate_module, "load_policy", recording)
    rc = evaluate_module.main(["--data", str(tmp_path / "test.parquet"), "--checkpoint", str(ckpt), "--sim",
                               "--device", "cpu", "--max-turns", "1", "--response-length", "8",
                               "--out", str(tmp_path / "eval")])
    assert rc == 0 and len(asked) == 1
    args, kwargs, engine = asked[0]
    assert kwargs.get("constrain_names", args[5] if len(args) > 5 else False) is True and engine is HFRollout
    import json
    assert json.loads((tmp_path / "eval" / "summary.json").read_text())["config"]["constrain_names"] is True
