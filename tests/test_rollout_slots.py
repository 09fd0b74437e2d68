"""hf_static's continuous batching (SlotRollout + SlotEngine) against its batch path, and the
three rollout schedules on a real tiny model against the real simulated pool server."""
import asyncio
from pathlib import Path

import pytest
import torch

from test_rollout_hf import prompts_of
from tiny import tiny_model
from router_r1.pool.client import PoolClient
from router_r1.pool.registry import ModelRegistry
from router_r1.pool.server import ServerThread
from sim.backend import SimBackend
from router_r1.router_env import RouterEnv, RouterEnvConfig
from verl.trainer.dataset import PromptRow
from verl.workers.rollout import build_rollout
from verl.workers.rollout.base import AsyncRolloutBackend, SamplingParams, as_async
from verl.workers.rollout.hf_rollout import HFRollout
from verl.workers.rollout.slot_rollout import SlotRollout
from verl.workers.rollout.static_rollout import StaticRollout

SIM = Path(__file__).resolve().parents[1] / "configs" / "pool" / "sim.yaml"


pytestmark = pytest.mark.usefixtures("one_thread")


def slots(model, tok, n_slots, **kw):
    roll = SlotRollout(model, tok, eos_token_ids=[], max_model_len=160, max_batch_size=n_slots, slot_chunk=3, **kw)
    roll.bucket = 16  # several attention spans within one request
    return roll


def gather(engine, prompts, sp):
    async def main():
        return await asyncio.gather(*(engine.generate_one(p, sp) for p in prompts))
    return asyncio.run(main())


@pytest.mark.parametrize("kind", ["llama", "gemma3"])  # gemma3: sliding-window layers (window 6)
def test_greedy_matches_the_batch_path_with_fewer_slots_than_requests(tok, kind):
    model = tiny_model(len(tok), kind=kind, seed=11)
    prompts = prompts_of(tok)
    sp = SamplingParams(greedy=True, max_new_tokens=20, return_logprobs=True)
    ref = StaticRollout(model, tok, eos_token_ids=[], max_model_len=160).generate(prompts, sp)
    roll = slots(model, tok, n_slots=2)
    assert isinstance(roll, AsyncRolloutBackend)
    outs = gather(roll, prompts, sp)
    for r, o in zip(ref, outs):
        assert o.token_ids == r.token_ids and o.finish_reason == "length"
        assert o.logprobs == pytest.approx(r.logprobs, abs=1e-4)
    st = roll.engine.stats
    assert st.requests == 5 and st.max_busy == 2  # five requests through two slots: freed and taken again


@pytest.mark.parametrize("kind", ["llama", "gemma3"])
def test_a_later_turn_prefills_only_what_its_slot_does_not_hold(tok, kind):
    model = tiny_model(len(tok), kind=kind, seed=5)
    a, obs = prompts_of(tok)[3], prompts_of(tok)[2]
    sp = SamplingParams(greedy=True, max_new_tokens=12, stop=(">",))
    roll = slots(model, tok, n_slots=2)
    first = gather(roll, [a], sp)[0]
    turn2 = a + first.token_ids + obs  # the episode's context: prompt, its turn, an observation
    held = max(roll.engine.held, key=len)
    assert turn2[:len(held)] == held and len(held) >= len(a) + len(first.token_ids) - 1
    before = roll.engine.stats.prefill_tokens
    second = gather(roll, [turn2], sp)[0]
    assert roll.engine.stats.prefill_tokens - before == len(turn2) - len(held)  # no re-prefill
    assert roll.engine.stats.reused_tokens == len(held)
    ref = StaticRollout(model, tok, eos_token_ids=[], max_model_len=160).generate([turn2], sp)[0]
    assert second.token_ids == ref.token_ids and second.finish_reason == ref.finish_reason
    # the episode ends: its slot is emptied; new weights empty every parked slot
    roll.release(turn2 + second.token_ids)
    assert sum(bool(h) for h in roll.engine.held) == 0
    gather(roll, [a], sp)
    assert sum(bool(h) for h in roll.engine.held) == 1
    roll.update_weights(model.state_dict())
    assert sum(bool(h) for h in roll.engine.held) == 0


def test_seeded_samples_do_not_depend_on_the_slot_count(tok):
    model = tiny_model(len(tok), seed=2)
    prompts = prompts_of(tok)
    sp = SamplingParams(temperature=1.0, max_new_tokens=10, seed=123, return_logprobs=True)
    one, four = gather(slots(model, tok, 1), prompts, sp), gather(slots(model, tok, 4), prompts, sp)
    assert [o.token_ids for o in one] == [o.token_ids for o in four]
    assert len({tuple(o.token_ids) for o in one}) > 1


def test_bad_requests_fail_clearly(tok):
    roll = slots(tiny_model(len(tok), seed=2), tok, 2)
    with pytest.raises(ValueError, match="max_model_len"):
        gather(roll, [[5] * 150], SamplingParams(max_new_tokens=20))
    with pytest.raises(ValueError, match="prompts\\[0\\]"):
        gather(roll, [[]], SamplingParams(max_new_tokens=2))
    assert isinstance(build_rollout({"name": "hf_static", "max_model_len": 64}, model=tiny_model(len(tok)),
                                    tokenizer=tok), SlotRollout)


# ---- the schedules on a real model ----------------------------------------------------------------


def _env(tok, url, schedule):
    registry = ModelRegistry.from_yaml(SIM, base_url=url).seen()
    cfg = RouterEnvConfig(max_turns=2, max_obs_length=16, response_length=10, max_response_length=120,
                          schedule=schedule, invalid_hint=True)
    return RouterEnv(cfg, tok, registry, PoolClient(registry))


def test_greedy_episodes_are_identical_under_every_schedule_and_engine(tok):
    model = tiny_model(len(tok), seed=4)
    rows = [PromptRow(p, f"q{i}", {}) for i, p in enumerate(prompts_of(tok) * 2)]
    sp = SamplingParams(greedy=True, max_new_tokens=10, return_logprobs=True)
    hf = HFRollout(model, tok, eos_token_ids=[])
    static = StaticRollout(model, tok, eos_token_ids=[], max_model_len=160)
    runs = {"sync/static": ("sync", static.generate), "overlap/hf": ("overlap", hf.generate),
            "continuous/hf": ("continuous", as_async(hf)), "continuous/slots": ("continuous", slots(model, tok, len(rows)))}
    out = {}
    with ServerThread(SimBackend.from_pool_yaml(SIM, seed=0, latency_scale=0.0)) as srv:
        for name, (schedule, engine) in runs.items():
            env = _env(tok, srv.url, schedule)
            out[name] = env.rollout(rows, engine, sp, validate=False)
            env.client.close()
    ref = out["sync/static"]
    assert max(len(t) for t in ref.info["turns"]) >= 2  # multi-turn: turns with observations between
    for name, res in out.items():
        assert res.response_ids == ref.response_ids, name
        assert res.response_mask == ref.response_mask, name
    # rollout log-probs sit on the policy's tokens: equal to a teacher-forced forward, 0 elsewhere
    res = out["continuous/slots"]
    for i in (0, 7):
        ids, mask, lps = res.response_ids[i], res.response_mask[i], res.info["rollout_log_probs"][i]
        full = torch.tensor([res.prompt_ids[i] + ids])
        with torch.no_grad():
            logp = torch.log_softmax(model(full).logits[0, :-1].float(), -1)
        n = len(res.prompt_ids[i])
        want = [float(logp[n - 1 + j, t]) if m else 0.0 for j, (t, m) in enumerate(zip(ids, mask))]
        assert lps == pytest.approx(want, abs=1e-4)
    slot_engine = runs["continuous/slots"][1].engine
    assert slot_engine.stats.reused_tokens > 0  # later turns continued in their slots
    assert not any(slot_engine.held)  # every episode released its slot at its end


def test_a_later_turn_keeps_its_slot_before_a_waiting_episode_takes_one(tok):
    model = tiny_model(len(tok), seed=8)
    prompts = prompts_of(tok)[1:4]
    sp = SamplingParams(greedy=True, max_new_tokens=6)
    roll = slots(model, tok, n_slots=2)
    first = gather(roll, prompts, sp)  # three episodes through two slots: the last two stay parked
    held = sorted(len(h) for h in roll.engine.held)
    turn2 = [p + o.token_ids for p, o in zip(prompts, first)]
    reused, evictions = roll.engine.stats.reused_tokens, roll.engine.stats.evictions
    gather(roll, turn2, sp)  # episode 0 asks first but has no slot: the two that have theirs go first
    assert roll.engine.stats.reused_tokens - reused >= sum(held) - 2  # both parked contexts continued
    assert roll.engine.stats.evictions - evictions == 1  # only episode 0's turn took over a slot


def test_the_trainer_hands_the_env_its_local_slot_engine_and_checks_the_weights(tok):
    from types import SimpleNamespace

    from verl.trainer.ppo_trainer import PPOTrainer, _BatchEngine

    model = tiny_model(len(tok), seed=4)
    worker = SimpleNamespace(rollout=slots(model, tok, 4), _stale=False)
    trainer = PPOTrainer.__new__(PPOTrainer)  # only what engine() reads
    trainer.actor, trainer.off_policy_steps = SimpleNamespace(worker=worker), 0
    engine = trainer.engine()
    rows = [PromptRow(p, f"q{i}", {}) for i, p in enumerate(prompts_of(tok)[:4])]
    sp = SamplingParams(greedy=True, max_new_tokens=8)
    with ServerThread(SimBackend.from_pool_yaml(SIM, seed=0, latency_scale=0.0)) as srv:
        env = _env(tok, srv.url, "continuous")
        env.rollout(rows, engine, sp, validate=False)
        assert worker.rollout.engine.stats.requests >= len(rows)  # the slots decoded, not a batch adapter
        worker._stale = True  # an update happened and nobody synced: on-policy refuses to decode
        with pytest.raises(RuntimeError, match="stale"):
            env.rollout(rows, engine, sp, validate=False)
        trainer.off_policy_steps = 1  # ... while a rollout played ahead decodes with the weights it was synced with
        env.rollout(rows, engine, sp, validate=False)
        env.client.close()
    trainer.actor = SimpleNamespace(worker=SimpleNamespace(rollout=HFRollout(model, tok)))
    # a batch-only engine: the trainer's batch generate, carrying the engine's wish for whole batches (the hf loop on
    # the CPU has it: env.schedule=auto plays sync)
    batch = trainer.engine()
    assert isinstance(batch, _BatchEngine) and batch.trainer is trainer and not hasattr(batch, "generate_one")
    assert batch.lockstep_batches is True
