"""Streaming rollouts: more prompts in play than one batch; each step trains on the first that finish.

`StreamingRollout` keeps `in_flight` prompt groups (rollout.n episodes each) untrained, playing on an
event loop (the env's own, where it has one) or finished, and hands `take(k, version)` the first k
groups that finished; the others carry over to later steps and `take` admits new ones in their
place. Decoding pauses while the trainer updates (`Gate`): the engine is drained before `take`
returns and reopened by the next `take`, after the weights were synced, so the update never shares
the interpreter with a decode loop, while pool calls (I/O, little Python) go on. An episode may therefore be sampled by several policy versions (a partial rollout:
each turn's log-probs are the engine's at that time). Staleness is the current version minus the
oldest that sampled a group; a group over `max_staleness` is dropped (finished or not) and counted.

The env needs `async rollout_async(rows, engine, sampling, validate) -> RolloutResult` (one group's
episodes on the running loop) and may offer `submit(coro) -> concurrent Future` (its own loop: a
pool client's connections live there); without it the stream runs a loop thread of its own.
"""
from __future__ import annotations

import asyncio
import concurrent.futures
import dataclasses
import threading
import time
from typing import Callable

from verl.trainer.env_interface import RolloutResult
from verl.workers.rollout.base import GenOutput, SamplingParams, as_async


class Gate:
    """The engine as the stream's episodes see it: `pause()` stops new decode calls and waits for the
    running ones, `resume(version)` lets them go on under policy `version`."""

    def __init__(self, engine, version: int):
        self.engine = as_async(engine)
        self.version = version
        self._open = asyncio.Event()
        self._idle = asyncio.Event()
        self._idle.set()
        self._active = 0

    async def generate_one(self, prompt_ids: list[int], sampling: SamplingParams) -> tuple[GenOutput, int]:
        """One decode call once the gate is open; returns the output and the version that decoded it."""
        while not self._open.is_set():  # woken by a resume that a pause has since undone: wait again
            await self._open.wait()
        self._active += 1
        self._idle.clear()
        version = self.version
        try:
            return await self.engine.generate_one(prompt_ids, sampling), version
        finally:
            self._active -= 1
            if self._active == 0:
                self._idle.set()

    async def pause(self) -> None:
        self._open.clear()
        await self._idle.wait()

    def resume(self, version: int) -> None:
        self.version = version
        self._open.set()


@dataclasses.dataclass
class Group:
    """One prompt's rollout.n episodes, played together and trained together."""

    seq: int                  # admission order
    index: int                # the prompt's row in the training set
    rows: list
    sampled_at: int           # policy version when admitted (seeds its sampling)
    versions: list[int] = dataclasses.field(default_factory=list)  # the version of each decode call
    future: concurrent.futures.Future | None = None
    task: asyncio.Task | None = None  # its task on the loop, once started
    result: RolloutResult | None = None

    def staleness(self, version: int) -> int:
        """Updates between the oldest policy that sampled this group and `version` (0 before any decoding)."""
        return version - min(self.versions) if self.versions else 0


class _GroupEngine:
    """The gate seen by one group's episodes: records which policy versions decoded them."""

    def __init__(self, gate: Gate, group: Group):
        self.gate, self.group = gate, group

    async def generate_one(self, prompt_ids: list[int], sampling: SamplingParams) -> GenOutput:
        out, version = await self.gate.generate_one(prompt_ids, sampling)
        self.group.versions.append(version)
        return out

    def release(self, context_ids: list[int]) -> None:
        release = getattr(self.gate.engine, "release", None)
        if release is not None:
            release(context_ids)


class StreamingRollout:
    """`in_flight` groups in play over `env`; `take` the first finished ones (see the module docstring).

    draw() -> prompt indices of the next batch of the data order; rows_of(index) -> that prompt's
    rollout.n rows; sampling(version) -> the SamplingParams a group admitted at `version` plays with;
    pending: prompt indices to play first (a checkpoint's groups that were in play, in order)."""

    def __init__(self, env, engine, draw: Callable[[], list[int]], rows_of: Callable[[int], list],
                 sampling: Callable[[int], SamplingParams], in_flight: int, max_staleness: int,
                 version: int = 0, pending: list[int] = ()):
        if not callable(getattr(env, "rollout_async", None)):
            raise ValueError(f"rollout.in_flight (streaming) needs an env with rollout_async; "
                             f"{type(env).__name__} has none")
        if in_flight < 1 or max_staleness < 0:
            raise ValueError(f"streaming needs in_flight >= 1 and max_staleness >= 0, got {in_flight}, {max_staleness}")
        self.env, self.draw, self.rows_of, self.sampling = env, draw, rows_of, sampling
        self.in_flight, self.max_staleness = in_flight, max_staleness
        self.queue: list[int] = list(pending)  # prompt indices drawn but not yet admitted
        self.playing: dict[int, Group] = {}    # seq -> group still playing
        self.finished: list[Group] = []        # in completion order, not yet trained
        self.dropped_total = 0                 # episodes dropped over the staleness bound, whole run
        self._seq = 0
        self._error: BaseException | None = None
        self._lock = threading.Condition()
        submit = getattr(env, "submit", None)
        self._thread = None
        if submit is None:  # no loop of the env's own: one for the stream
            loop = asyncio.new_event_loop()
            self._thread = threading.Thread(target=loop.run_forever, name="streaming-rollout", daemon=True)
            self._thread.start()
            self._loop = loop
            submit = lambda coro: asyncio.run_coroutine_threadsafe(coro, loop)  # noqa: E731
        self._submit = submit
        self.gate = Gate(engine, version)

    def _call(self, coro):
        return self._submit(coro).result()

    # ---- admission and completion (under the lock) ------------------------------------------

    def _admit(self, version: int) -> None:
        """Start groups until `in_flight` are untrained (playing or finished): a bound on the work ahead."""
        while len(self.playing) + len(self.finished) < self.in_flight:
            if not self.queue:
                self.queue = list(self.draw())
            index = self.queue.pop(0)
            g = Group(self._seq, index, self.rows_of(index), version)
            self._seq += 1
            self.playing[g.seq] = g
            g.future = self._submit(self._play(g))
            g.future.add_done_callback(lambda f, g=g: self._done(g, f))

    async def _play(self, g: Group) -> RolloutResult:
        g.task = asyncio.current_task()
        return await self.env.rollout_async(g.rows, _GroupEngine(self.gate, g), self.sampling(g.sampled_at), False)

    def _done(self, g: Group, fut: concurrent.futures.Future) -> None:
        with self._lock:
            if self.playing.pop(g.seq, None) is None or fut.cancelled():  # dropped meanwhile
                return
            if fut.exception() is not None:  # a bug in the env or the engine: the trainer raises it
                self._error = fut.exception()
            else:
                g.result = fut.result()
                self.finished.append(g)  # still counts against in_flight until trained: take admits
            self._lock.notify_all()

    # ---- the trainer's side -------------------------------------------------------------------

    def take(self, k: int, version: int) -> tuple[list[Group], dict[str, float]]:
        """Resume decoding under `version` (the caller synced the engine's weights), wait for k finished
        groups within the staleness bound, pause decoding again; the groups in admission order."""
        metrics: dict[str, float] = {}
        with self._lock:
            dropped = self._drop_stale(version)
            self._admit(version)
        self._call(self._resume(version))
        start = time.perf_counter()
        with self._lock:
            while len(self.finished) < k and self._error is None:
                self._lock.wait()
            if self._error is not None:
                raise self._error
        metrics["timing/stream_wait"] = time.perf_counter() - start
        start = time.perf_counter()
        self._call(self.gate.pause())  # decode calls running now finish their turn; no new ones start
        metrics["timing/stream_drain"] = time.perf_counter() - start
        with self._lock:
            taken, self.finished = self.finished[:k], self.finished[k:]
            taken.sort(key=lambda g: g.seq)
            stale = [g.staleness(version) for g in taken]
            metrics.update({
                "stream/staleness_mean": sum(stale) / len(stale), "stream/staleness_max": float(max(stale)),
                "stream/partial_frac": sum(len(set(g.versions)) > 1 for g in taken) / len(taken),
                "stream/dropped": float(dropped), "stream/dropped_total": float(self.dropped_total),
                "stream/carried": float(len(self.playing) + len(self.finished))})
        return taken, metrics

    async def _resume(self, version: int) -> None:
        self.gate.resume(version)

    def _drop_stale(self, version: int) -> int:
        """Drop the groups (playing or finished) that can no longer train within the bound; episodes dropped."""
        n = 0
        for g in [g for g in self.finished if g.staleness(version) > self.max_staleness]:
            self.finished.remove(g)
            n += len(g.rows)
        for g in [g for g in self.playing.values() if g.staleness(version) > self.max_staleness]:
            del self.playing[g.seq]
            g.future.cancel()
            n += len(g.rows)
        self.dropped_total += n
        return n

    def pending(self, also: Callable[[], object] = lambda: None) -> tuple[list[int], object]:
        """Prompt indices drawn but not trained, in admission order (what a resumed run plays first),
        and `also()` read under the same lock (the caller's draw counter: admission may draw meanwhile)."""
        with self._lock:
            groups = sorted([*self.playing.values(), *self.finished], key=lambda g: g.seq)
            return [g.index for g in groups] + list(self.queue), also()

    @staticmethod
    async def _settle(tasks: list[asyncio.Task]) -> None:
        """Let cancelled tasks run their cleanup (an engine's release) before the loop may stop."""
        for t in tasks:
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        await asyncio.sleep(0)  # tasks cancelled before they started end here

    def close(self) -> None:
        """Cancel the groups still playing and stop the stream's own loop, if it has one."""
        with self._lock:
            playing, self.playing = list(self.playing.values()), {}
        for g in playing:
            g.future.cancel()
        self._call(self._settle([g.task for g in playing if g.task is not None]))
        if self._thread is not None:
            self._loop.call_soon_threadsafe(self._loop.stop)
            self._thread.join()
            self._loop.close()
