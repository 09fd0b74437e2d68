"""Streaming rollouts: groups carried over between steps, the staleness bound, per-token behaviour
log-probs across a weight update, and the trainer (IS weights, identity with sync, resume)."""
import asyncio
import dataclasses
import threading
from pathlib import Path

import pytest
import torch

from test_rollout_manager import make_env, make_rows, scripted_policy
from test_trainer import by_step, config
from router_r1.pool.server import ServerThread
from sim.backend import SimBackend
from sim.world import SimWorld
from verl.trainer.dataset import train_batch_indices
from verl.trainer.main_ppo import run
from verl.trainer.ppo_trainer import PPOTrainer
from verl.trainer.streaming import StreamingRollout
from verl.trainer.tracking import read_jsonl
from verl.workers.rollout.base import GenOutput, SamplingParams

ROOT = Path(__file__).resolve().parents[1]
SIM = ROOT / "configs" / "pool" / "sim.yaml"


class VersionedEngine:
    """The scripted router policy behind generate_one; every token's log-prob is `lp` at decode time
    (a stand-in for "the weights the engine holds now")."""

    def __init__(self, generate):
        self.generate, self.lp = generate, -0.5

    async def generate_one(self, prompt_ids, sampling):
        out = self.generate([prompt_ids], sampling)[0]
        return GenOutput(out.token_ids, out.finish_reason, [self.lp] * len(out.token_ids))


def hold_pool_call(env, sub_question: str, times: int = 1) -> threading.Event:
    """Keep the first `times` pool calls asking `sub_question` waiting until the returned event is set."""
    release, route_one, held = threading.Event(), env.client.route_one, [0]

    async def held_route_one(req, deadline_at=None):
        if req.query == sub_question and held[0] < times:
            held[0] += 1
            while not release.is_set():
                await asyncio.sleep(0.01)
        return await route_one(req, deadline_at)

    env.client.route_one = held_route_one
    return release


@pytest.fixture(scope="module")
def two_hop():
    return [q for q in SimWorld(seed=0).questions(12, seed=3, split="test", two_hop_frac=1.0)][:2]


def stream_of(env, engine, rows, in_flight, max_staleness):
    order = iter(range(1000))
    return StreamingRollout(env, engine, draw=lambda: [next(order) % len(rows)], rows_of=lambda i: [rows[i]],
                            sampling=lambda v: SamplingParams(temperature=1.0, max_new_tokens=96, seed=v,
                                                              return_logprobs=True),
                            in_flight=in_flight, max_staleness=max_staleness)


def test_an_unfinished_group_carries_over_and_records_each_turns_behaviour_log_probs(tok, two_hop):
    with ServerThread(SimBackend.from_pool_yaml(SIM, seed=0, latency_scale=0.0)) as srv:
        env, registry = make_env(tok, srv.url)
        rows = make_rows(tok, registry, two_hop)
        engine = VersionedEngine(scripted_policy(tok, rows))
        release = hold_pool_call(env, two_hop[1].hops[0].sub_question)  # B waits at its first pool call
        stream = stream_of(env, engine, rows, in_flight=2, max_staleness=1)
        try:
            taken, m = stream.take(1, version=0)
            assert [g.index for g in taken] == [0] and m["stream/staleness_max"] == 0
            assert m["stream/carried"] == 1 and stream.pending()[0] == [1]  # B is in play, not lost
            engine.lp = -1.5  # an update: the engine now holds version 1
            release.set()
            taken, m = stream.take(2, version=1)  # B and the group admitted in A's place
        finally:
            stream.close()
            env.client.close()
    b = taken[0]  # in admission order
    assert [g.index for g in taken] == [1, 0] and taken[1].versions == [1, 1, 1]
    assert b.index == 1 and b.versions == [0, 1, 1]  # turn 1 before the update, turns 2-3 after
    assert m["stream/staleness_max"] == 1 and m["stream/partial_frac"] == 0.5 and m["stream/dropped"] == 0
    res = b.result
    lps, mask = res.info["rollout_log_probs"][0], res.response_mask[0]
    policy = [lp for lp, x in zip(lps, mask) if x == 1]
    first_turn = mask.index(0)  # the first <information> block ends turn 1
    assert set(lps[:first_turn]) == {-0.5}  # each token keeps the log-prob of the weights that sampled it
    assert set(policy[first_turn:]) == {-1.5} and all(lp == 0 for lp, x in zip(lps, mask) if x == 0)
    assert res.info["route_count"][0] == 2 and res.response_ids[0]


def test_a_group_past_the_staleness_bound_is_dropped_and_counted(tok, two_hop):
    with ServerThread(SimBackend.from_pool_yaml(SIM, seed=0, latency_scale=0.0)) as srv:
        env, registry = make_env(tok, srv.url)
        rows = make_rows(tok, registry, two_hop)
        engine = VersionedEngine(scripted_policy(tok, rows))
        release = hold_pool_call(env, two_hop[1].hops[0].sub_question)
        stream = stream_of(env, engine, rows, in_flight=2, max_staleness=0)
        try:
            first, _ = stream.take(1, version=0)
            release.set()  # B goes on, but it was sampled by version 0 and can no longer train at 0 staleness
            taken, m = stream.take(1, version=1)
            pending = stream.pending()[0]
        finally:
            stream.close()
            env.client.close()
    assert m["stream/dropped"] == 1 and m["stream/dropped_total"] == 1
    assert m["stream/staleness_max"] == 0 and all(set(g.versions) == {1} for g in taken)
    assert taken[0].seq > 1  # a group admitted after the drop, not B's
    assert 1 not in [g.index for g in first] and len(pending) == 1


def _uids(path, steps):
    return [d["uid"] for d in read_jsonl(path) if d["step"] in steps]


COMMON = ("trainer.test_freq=0", "trainer.val_before_train=false", "trainer.export_hf=false", "actor.lr=1e-2",
          "data.train_batch_size=4", "trainer.dump_rollouts=100", "rollout.device=cpu")


def test_at_staleness_zero_streaming_is_on_policy_greedy_episodes_match_sync_and_weights_are_one(tmp_path, monkeypatch):
    """Greedy training rollouts (the sampling patched to argmax at T=1, which the temperature check accepts;
    seeded sampling would depend on how requests batch): with the batch in play and no staleness allowed,
    streaming trains on exactly sync's episodes."""
    monkeypatch.chdir(ROOT)
    sampling = PPOTrainer.sampling
    monkeypatch.setattr(PPOTrainer, "sampling", lambda self, validate, step=None: dataclasses.replace(
        sampling(self, validate, step), greedy=True))
    texts = {}
    for mode, extra in (("sync", []), ("stream", ["rollout.in_flight=4", "trainer.max_staleness=0"])):
        run(config(tmp_path / mode, "trainer.total_steps=3", "trainer.save_freq=0",
                   *COMMON, *extra))
        texts[mode] = [(d["step"], d["uid"], d["text"]) for d in read_jsonl(tmp_path / mode / "rollouts.jsonl")]
        rows = by_step(tmp_path / mode / "metrics.jsonl")
    assert texts["stream"] == texts["sync"] and len(texts["sync"]) == 12
    for k in (1, 2, 3):
        assert rows[k]["stream/staleness_max"] == 0 and rows[k]["stream/dropped"] == 0
        assert rows[k]["offpolicy/is_weight_min"] == pytest.approx(1.0, abs=1e-3)
        assert rows[k]["offpolicy/is_weight_max"] == pytest.approx(1.0, abs=1e-3)


def test_a_checkpoint_with_groups_in_play_resumes_without_replaying_or_losing_rows(tmp_path, monkeypatch):
    monkeypatch.chdir(ROOT)
    stream = ("rollout.in_flight=8", "trainer.max_staleness=8", "trainer.save_freq=1", "trainer.max_checkpoints=0")
    run(config(tmp_path, "trainer.total_steps=2", *COMMON, *stream))
    saved = torch.load(tmp_path / "checkpoints" / "step_000002" / "trainer_state.pt", weights_only=False)
    assert saved["stream_pending"]  # groups were in play when step 2 saved
    run(config(tmp_path, "trainer.total_steps=4", *COMMON, *stream))  # resume=auto: from step 2
    trained = _uids(tmp_path / "rollouts.jsonl", {1, 2, 3, 4})
    assert len(trained) == 16 and len(set(trained)) == 16  # no row trained twice (one epoch holds 32)
    end = torch.load(tmp_path / "checkpoints" / "step_000004" / "trainer_state.pt", weights_only=False)
    # every row drawn from the data order is trained or still pending at the end: none lost
    drawn = [i for b in range(1, end["gen_batches"] + 1) for i in train_batch_indices(32, 4, b, 42)]
    assert sorted(trained + [f"toy-{i}" for i in end["stream_pending"]]) == sorted(f"toy-{i}" for i in drawn)
    assert {f"toy-{i}" for i in saved["stream_pending"]} <= set(_uids(tmp_path / "rollouts.jsonl", {3, 4})) | {
        f"toy-{i}" for i in end["stream_pending"]}


def test_streaming_settings_are_checked(tmp_path, monkeypatch):
    monkeypatch.chdir(ROOT)
    with pytest.raises(ValueError, match="in_flight=2 must be >= data.train_batch_size=4"):
        run(config(tmp_path, "trainer.total_steps=1", "data.train_batch_size=4", "rollout.in_flight=2"))
    with pytest.raises(ValueError, match="pick one"):
        run(config(tmp_path, "trainer.total_steps=1", "rollout.in_flight=8", "trainer.off_policy_steps=1"))
