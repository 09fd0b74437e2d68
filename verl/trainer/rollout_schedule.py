"""How each PPO step gets its episodes, chosen once from the config (`make_schedule`):

- `SyncSchedule` (the default): the step plays its batch now, with the weights of the last update.
- `OffPolicySchedule` (trainer.off_policy_steps=1): step k+1's rollout plays in a background thread
  while step k updates, so its episodes are one update stale and the update weights them.
- `StreamingSchedule` (rollout.in_flight > 0): more prompt groups in play than one batch; a step
  trains on the first that finish (verl/trainer/streaming.py).

The trainer calls `next_batch(step)` once per update, `wait()` before it validates or saves,
`state_dict()` when it saves, `load_state_dict(state)` when it resumes, and `close()` at the end.
"""
from __future__ import annotations

import copy
import dataclasses
import time
from concurrent.futures import Future, ThreadPoolExecutor
from typing import TYPE_CHECKING

import numpy as np
import torch

from verl.protocol import DataProto
from verl.trainer.env_interface import pick_episodes
from verl.trainer.streaming import StreamingRollout
from verl.trainer.tracking import timer

if TYPE_CHECKING:
    from verl.trainer.ppo_trainer import PPOTrainer


@dataclasses.dataclass
class Collected:
    """One step's training episodes, ready for the update."""

    batch: DataProto
    env_metrics: dict[str, list]  # per episode played (dynamic sampling's dropped groups included)
    metrics: dict[str, float]   # timing/gen and friends
    version: int                # updates the sampling policy had seen (global_step when it was synced)
    gen_batches: int            # the data order's batch counter before this rollout drew its rows


def collect(trainer: PPOTrainer, rows, step: int | None = None, sync: bool = True,
            version: int | None = None) -> Collected:
    """Training episodes for `rows`, padded, with their timing. `version`: the updates the rollout
    weights have seen (default: now); a rollout played ahead gets it from the thread that synced
    them, since this one may start after that thread's update ended."""
    metrics: dict[str, float] = {}
    version = trainer.global_step if version is None else version
    gen_batches = trainer.gen_batches - 1  # next_rows() already drew `rows`; extra DAPO draws come after
    decode_before, sync_before = trainer.decode_s, trainer.sync_s
    with timer("gen", metrics):
        batch, env_metrics = trainer.train_episodes(rows, metrics, step, sync)  # DAPO may drop and refill groups
    # the rollout's wall time, split: decoding, the weight copy into the engine, and the rest (pool calls not
    # hidden by decoding)
    metrics["timing/decode"] = trainer.decode_s - decode_before
    metrics["timing/env_wait"] = metrics["timing/gen"] - metrics["timing/decode"] - (trainer.sync_s - sync_before)
    return Collected(batch, env_metrics, metrics, version, gen_batches)


class RolloutSchedule:
    """Where a step's episodes come from; the subclasses say when they are played."""

    off_policy = False       # episodes may be older than the update's weights: it weights them by importance
    overlaps_update = False  # the engine decodes while the actor updates

    def __init__(self, trainer: PPOTrainer):
        self.trainer = trainer

    def next_batch(self, step: int) -> Collected:
        """The episodes the update after `step` updates trains on, with timing/rollout_wait (what
        getting them took here), timing/weight_sync (the weight copy into the engine, part of it) and
        offpolicy/staleness (updates since their policy) in their metrics."""
        start, sync_before = time.perf_counter(), self.trainer.sync_s
        collected = self._take(step)
        collected.metrics["timing/rollout_wait"] = time.perf_counter() - start
        collected.metrics["timing/weight_sync"] = self.trainer.sync_s - sync_before
        collected.metrics["offpolicy/staleness"] = float(step - collected.version)
        return collected

    def _take(self, step: int) -> Collected:
        raise NotImplementedError

    def after_update(self) -> dict[str, float]:
        """Metrics read once the update ended."""
        return {}

    def wait(self) -> Collected | None:
        """Return once no rollout runs (validation and checkpoints need the engine and a quiet env)."""
        return None

    def state_dict(self) -> dict:
        """The rollout side of a checkpoint: the env's state and the data order's draw counter as of
        the trained episodes (a resumed run replays what was drawn but not trained)."""
        t = self.trainer
        return {"env": {} if t.env is None else t.env.state_dict(), "gen_batches": t.gen_batches}

    def load_state_dict(self, state: dict) -> None:
        """What the schedule keeps of a checkpoint besides the env and the counter (the trainer loads those)."""

    def close(self) -> None:
        """Stop what still plays in the background."""


class SyncSchedule(RolloutSchedule):
    """Each step plays its batch now, with the weights of the last update."""

    def _take(self, step: int) -> Collected:
        return collect(self.trainer, self.trainer.next_rows())


class OffPolicySchedule(RolloutSchedule):
    """trainer.off_policy_steps=1: step k+1's rollout (generation and pool calls) plays in a thread
    with step k's weights while step k updates (the last step plays nothing ahead)."""

    off_policy = overlaps_update = True

    def __init__(self, trainer: PPOTrainer):
        super().__init__(trainer)
        self._pool = ThreadPoolExecutor(1, thread_name_prefix="rollout-ahead")
        self._ahead: Future | None = None  # the next step's rollout
        self._env_state_before_ahead: dict = {}  # env.state_dict() taken as that rollout started

    def next_batch(self, step: int) -> Collected:
        collected = super().next_batch(step)
        if step < self.trainer.cfg.trainer.total_steps - 1:
            self._play_ahead(step)
        return collected

    def _take(self, step: int) -> Collected:
        if self._ahead is None:  # the first step of a run: nothing was played ahead
            return collect(self.trainer, self.trainer.next_rows())
        collected, self._ahead = self._ahead.result(), None
        return collected

    def _play_ahead(self, step: int) -> None:
        t = self.trainer
        t.sync_rollout()  # here, in this thread: the update that follows must not race the copy
        # the env's state before the rollout played ahead scores into it (cost window): what a checkpoint
        # saved while it is untrained must hold, since a resumed run plays its rows again
        self._env_state_before_ahead = copy.deepcopy(t.env.state_dict())
        self._ahead = self._pool.submit(collect, t, t.next_rows(), step + 1, False, step)

    def after_update(self) -> dict[str, float]:
        return {} if self._ahead is None else {"timing/ahead_done_at_update_end": float(self._ahead.done())}

    def wait(self) -> Collected | None:
        return None if self._ahead is None else self._ahead.result()

    def state_dict(self) -> dict:
        ahead = self.wait()
        if ahead is None:
            return super().state_dict()
        return {"env": self._env_state_before_ahead, "gen_batches": ahead.gen_batches}

    def close(self) -> None:
        self._pool.shutdown(wait=False)


class StreamingSchedule(RolloutSchedule):
    """rollout.in_flight > 0: `in_flight` prompt groups in play; each step syncs the engine, lets
    them decode again and trains on the first data.train_batch_size that finish, scored then (the
    env's state holds trained episodes only)."""

    off_policy = True

    def __init__(self, trainer: PPOTrainer, in_flight: int, max_staleness: int):
        super().__init__(trainer)
        self.in_flight, self.max_staleness = in_flight, max_staleness
        self._stream: StreamingRollout | None = None
        self._pending: list[int] = []  # a checkpoint's groups that were in play: played first on resume

    def _take(self, step: int) -> Collected:
        t = self.trainer
        t.sync_rollout()
        if self._stream is None:
            self._stream = StreamingRollout(
                t.env, t.engine(), t.next_indices, t.group_rows,
                lambda version: t.sampling(validate=False, step=version), self.in_flight, self.max_staleness,
                version=step, pending=self._pending)
        metrics: dict[str, float] = {}
        engine, decode_before = self._stream.gate.engine, t.decode_s
        busy_before = _busy_s(engine)
        with timer("gen", metrics):
            groups, stream_metrics = self._stream.take(t.cfg.data.train_batch_size, step)
        rows = [r for g in groups for r in g.rows]
        result = pick_episodes([g.result for g in groups], list(range(len(rows))))
        scores, env_metrics = t.env.score(result, rows, False)
        played = t.scored(rows, result, np.asarray(scores, dtype=np.float32), env_metrics, 0, None)
        metrics.update(stream_metrics)
        metrics["timing/decode"] = _busy_s(engine) - busy_before + t.decode_s - decode_before
        metrics["timing/env_wait"] = metrics["timing/gen"] - metrics["timing/decode"]  # the weights synced before
        version = step - int(stream_metrics["stream/staleness_max"])
        batch = t.to_batch(result, rows, played.scores, t.sampling(validate=False))  # every group's temperature
        batch.batch["staleness"] = torch.tensor([float(g.staleness(step)) for g in groups
                                                 for _ in g.rows])  # (batch,)
        return Collected(batch, played.metrics, metrics, version, t.gen_batches)

    def state_dict(self) -> dict:
        state = super().state_dict()
        if self._stream is not None:  # groups in play are not trained: a resumed run plays them first
            state["stream_pending"], state["gen_batches"] = self._stream.pending(lambda: self.trainer.gen_batches)
        return state

    def load_state_dict(self, state: dict) -> None:
        self._pending = [int(i) for i in state.get("stream_pending", [])]

    def close(self) -> None:
        """Stop the groups still in play (their rows are in the last checkpoint's pending list)."""
        if self._stream is not None:
            self._stream.close()
            self._stream = None


def _busy_s(engine) -> float:
    """Seconds the trainer's own async engine decoded so far (a batch generate counts into trainer.decode_s)."""
    busy = getattr(engine, "busy_s", None)
    return busy() if busy is not None else 0.0


def make_schedule(trainer: PPOTrainer, cfg, dist=None) -> RolloutSchedule:
    """The schedule trainer.off_policy_steps and rollout.in_flight ask for; ValueError for settings that do not fit."""
    off_policy_steps = int(cfg.trainer.off_policy_steps)
    in_flight = int(cfg.rollout.get("in_flight", 0))  # prompt groups in play; 0: no streaming
    max_staleness = int(cfg.trainer.get("max_staleness", 1))
    ranks = 1 if dist is None else dist.world_size
    if off_policy_steps not in (0, 1):
        raise ValueError(f"trainer.off_policy_steps must be 0 or 1, got {off_policy_steps}")
    if off_policy_steps and ranks > 1:
        # the rollout's gather is a collective: in a thread beside the update's collectives it could interleave
        raise ValueError("trainer.off_policy_steps=1 runs with one process (or Ray), not under torchrun with "
                         f"{ranks} processes")
    if not in_flight:
        return OffPolicySchedule(trainer) if off_policy_steps else SyncSchedule(trainer)
    why = None
    if in_flight < cfg.data.train_batch_size:
        why = f"rollout.in_flight={in_flight} must be >= data.train_batch_size={cfg.data.train_batch_size}"
    elif max_staleness < 0:
        why = f"trainer.max_staleness must be >= 0, got {max_staleness}"
    elif off_policy_steps:
        why = "rollout.in_flight (streaming) and trainer.off_policy_steps=1 are two ways to the same end: pick one"
    elif cfg.algorithm.dynamic_sampling.enable:
        why = "rollout.in_flight (streaming) with algorithm.dynamic_sampling is not built"
    elif ranks > 1:
        why = f"rollout.in_flight (streaming) runs with one process (or Ray), not {ranks} torchrun ranks"
    if why:
        raise ValueError(why)
    return StreamingSchedule(trainer, in_flight, max_staleness)
