"""Continuous batching over a fixed set of KV-cache slots, behind the async `generate_one`.

The engine owns the schedule; a runner (the model: `SlotRollout` for hf_static, or an
emulated one in the schedule benchmark) owns the cache and the arithmetic:

- a request takes a slot at a step boundary. It prefers a slot whose cached tokens are a
  prefix of its prompt (the same episode's previous turn: only the observation and what
  follows are prefilled, not the prompt and the earlier turns), then an empty slot, then
  the least recently used slot that is parked (holds a finished turn, no request);
- all slots with a request decode together, `chunk` steps per trip to the worker thread;
  between trips finished requests leave (their futures resolve) and waiting ones join;
- a finished request leaves its slot parked with what it cached; `release(context)` (the
  manager calls it when the episode ends) empties the slot, and new weights empty all.

The runner's interface (all indices are slot numbers):
    n_slots, max_len                        capacity
    start(slot, ids, reuse, sampling, u)    prefill ids[reuse:] after the `reuse` tokens the slot
                                            holds, sample the first token with uniform u[0]
    start_many([(slot, ids, reuse, u)], s)  optional: the same for everyone joining at a boundary
    steps(n, sampling)                      n decode steps for every started slot
    read(slots, starts) -> [(tokens, lps)]  each slot's sampled tokens from index `starts[i]` on
    stop(slot)                              the slot stops decoding (keeps its cache)
"""
from __future__ import annotations

import asyncio
import contextlib
import time
import zlib
from dataclasses import dataclass, field
from typing import Protocol

import torch

from .base import GenOutput, SamplingParams, refuse_constraint, validate_prompts
from .hf_rollout import StopChecker


class SlotRunner(Protocol):
    n_slots: int
    max_len: int

    def start(self, slot: int, ids: list[int], reuse: int, sampling: SamplingParams, u: torch.Tensor) -> None: ...
    def steps(self, n: int, sampling: SamplingParams) -> None: ...
    def read(self, slots: list[int], starts: list[int]) -> list[tuple[list[int], list[float]]]: ...
    def stop(self, slot: int) -> None: ...


@dataclass
class _Request:
    prompt: list[int]
    sampling: SamplingParams
    future: asyncio.Future
    slot: int = -1
    reuse: int = 0      # prompt tokens the slot already held
    tokens: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    fed: int = 0        # sampled tokens fed back into the cache (one per decode step)
    reason: str | None = None


@dataclass
class SlotStats:
    requests: int = 0
    prefill_tokens: int = 0      # prompt tokens actually prefilled
    prompt_tokens: int = 0       # what a backend without reuse would have prefilled
    steps: int = 0               # decode steps run
    slot_steps: int = 0          # slot-steps with a live request (steps x occupancy)
    evictions: int = 0           # parked slots taken over by another episode
    max_busy: int = 0            # most slots with a request at once
    busy_s: float = 0.0          # seconds the runner worked (prefill + decode), the rest is waiting

    @property
    def reused_tokens(self) -> int:
        return self.prompt_tokens - self.prefill_tokens


def _common_prefix(a: list[int], b: list[int]) -> int:
    n = min(len(a), len(b))
    i = 0
    while i < n and a[i] == b[i]:
        i += 1
    return i


def _sampling_key(s: SamplingParams) -> tuple:
    """Requests decode in one step only when this matches (one sampling rule per compiled step)."""
    return (s.is_greedy, s.temperature, s.top_k, s.top_p, s.return_logprobs)


class SlotEngine:
    """AsyncRolloutBackend: continuous batching over a runner's cache slots, with prefix reuse."""

    def __init__(self, runner: SlotRunner, tokenizer, eos_ids, chunk: int = 8, vocab_size: int | None = None):
        if chunk < 1:
            raise ValueError(f"SlotEngine: chunk must be >= 1, got {chunk}")
        self.runner, self.tokenizer, self.eos_ids = runner, tokenizer, set(eos_ids)
        self.chunk, self.vocab_size = chunk, vocab_size
        self.held: list[list[int]] = [[] for _ in range(runner.n_slots)]  # tokens each slot's cache holds
        self.busy: list[_Request | None] = [None] * runner.n_slots
        self.last_used = [0] * runner.n_slots
        self._clock = 0
        self._waiting: list[_Request] = []
        self._loop_task: asyncio.Task | None = None
        self._stoppers: dict[tuple, StopChecker | None] = {}
        self.stats = SlotStats()

    # ---- the async interface ----------------------------------------------------------------

    async def generate_one(self, prompt_ids: list[int], sampling: SamplingParams) -> GenOutput:
        sampling.validate()
        refuse_constraint(sampling, "the slot engine")
        validate_prompts([prompt_ids], self.vocab_size)
        if len(prompt_ids) + sampling.max_new_tokens > self.runner.max_len:
            raise ValueError(f"SlotEngine: prompt of {len(prompt_ids)} tokens + max_new_tokens "
                             f"{sampling.max_new_tokens} exceeds max_model_len={self.runner.max_len} "
                             "(raise rollout.max_model_len)")
        req = _Request(list(prompt_ids), sampling, asyncio.get_running_loop().create_future())
        self._waiting.append(req)
        if self._loop_task is None or self._loop_task.done():
            self._loop_task = asyncio.create_task(self._run())
        return await req.future

    def release(self, context_ids: list[int]) -> None:
        """The episode whose context is `context_ids` ended: empty the parked slot that holds its prefix."""
        for s, held in enumerate(self.held):
            if self.busy[s] is None and held and len(held) <= len(context_ids) and \
                    context_ids[:len(held)] == held:
                self.held[s] = []
                return

    def forget(self) -> None:
        """Drop every parked cache (new weights make them stale). Slots with a request are kept."""
        for s in range(self.runner.n_slots):
            if self.busy[s] is None:
                self.held[s] = []

    # ---- scheduling ---------------------------------------------------------------------------

    def _own_slot(self, prompt: list[int]) -> int:
        """A parked slot whose every cached token is a prefix of `prompt` (the episode's own), or -1."""
        best = -1
        for s, held in enumerate(self.held):
            n = len(held)
            # cheap tests first; the list comparison runs at C speed
            if self.busy[s] is None and 0 < n <= len(prompt) and held[-1] == prompt[n - 1] \
                    and held[0] == prompt[0] and prompt[:n] == held and (best < 0 or n > len(self.held[best])):
                best = s
        return best

    def _pick_slot(self, prompt: list[int]) -> tuple[int, int]:
        """(slot, tokens of the prompt it already holds), or (-1, 0) when every slot has a request."""
        free = [s for s in range(self.runner.n_slots) if self.busy[s] is None]
        if not free:
            return -1, 0
        # at least one token is prefilled: its logits give the first sampled token
        s = self._own_slot(prompt)
        if s >= 0:
            return s, min(len(self.held[s]), len(prompt) - 1)
        empty = [s for s in free if not self.held[s]]
        if empty:
            s = empty[0]
        else:  # take over the parked slot used longest ago (what it shares with the prompt is kept)
            s = min(free, key=lambda s: self.last_used[s])
            self.stats.evictions += 1
        return s, min(_common_prefix(self.held[s], prompt), len(prompt) - 1)

    def _admit(self) -> list[_Request]:
        """Give waiting requests slots (FIFO; those with another sampling rule wait for the running ones)."""
        running = [r for r in self.busy if r is not None]
        key = _sampling_key(running[0].sampling) if running else None
        admitted, still = [], []
        # a later turn whose slot still holds its context goes first: a first turn taking that slot
        # would throw the context away and make both prefill in full
        waiting = sorted(self._waiting, key=lambda r: self._own_slot(r.prompt) < 0)
        for req in waiting:
            if req.future.done():  # cancelled while waiting
                continue
            if key is None:
                key = _sampling_key(req.sampling)
            slot = -1
            if _sampling_key(req.sampling) == key:
                slot, reuse = self._pick_slot(req.prompt)
            if slot < 0:
                still.append(req)
                continue
            req.slot, req.reuse = slot, reuse
            self.busy[slot] = req
            self.held[slot] = req.prompt  # what the cache will hold once prefilled
            self._clock += 1
            self.last_used[slot] = self._clock
            admitted.append(req)
        self._waiting = still
        return admitted

    def _uniforms(self, req: _Request) -> torch.Tensor:
        """One uniform per token: a seeded request draws from (seed, prompt), so its sample does not
        depend on which requests it shared steps with."""
        n = req.sampling.max_new_tokens
        if req.sampling.seed is None:
            return torch.rand(n)
        g = torch.Generator().manual_seed(req.sampling.seed * 1_000_003 + zlib.crc32(str(req.prompt).encode()))
        return torch.rand(n, generator=g)

    def _work(self, admitted: list[_Request], running: list[_Request], n: int):
        """Worker thread: prefill the new requests, run n decode steps, read the tokens back (on the
        runner's own CUDA stream, if it has one)."""
        with getattr(self.runner, "on_own_stream", contextlib.nullcontext)():
            start_many = getattr(self.runner, "start_many", None)
            if start_many is not None and admitted:  # one batched prefill for everyone joining now
                start_many([(r.slot, r.prompt, r.reuse, self._uniforms(r)) for r in admitted], admitted[0].sampling)
            else:
                for req in admitted:
                    self.runner.start(req.slot, req.prompt, req.reuse, req.sampling, self._uniforms(req))
            if n:
                self.runner.steps(n, running[0].sampling)
            return self.runner.read([r.slot for r in running], [len(r.tokens) for r in running])

    def _stopper(self, sampling: SamplingParams) -> StopChecker | None:
        if sampling.stop not in self._stoppers:
            self._stoppers[sampling.stop] = StopChecker(self.tokenizer, sampling.stop) if sampling.stop else None
        return self._stoppers[sampling.stop]

    def _finish_check(self, req: _Request, tokens: list[int], logprobs: list[float]) -> None:
        """Append the newly read tokens up to the first eos / stop string / length."""
        stopper, n_new = self._stopper(req.sampling), req.sampling.max_new_tokens
        for j, t in enumerate(tokens):
            req.tokens.append(t)
            if req.sampling.return_logprobs:
                req.logprobs.append(logprobs[j])
            if t in self.eos_ids:
                req.reason = "eos"
            elif stopper is not None and stopper.hit(req.tokens):
                req.reason = "stop"
            elif len(req.tokens) == n_new:
                req.reason = "length"
            if req.reason is not None:
                return

    async def _run(self) -> None:
        try:
            while self._waiting or any(r is not None for r in self.busy):
                admitted = self._admit()
                running = [r for r in self.busy if r is not None]
                if not running:  # waiting requests that no slot can take: cannot happen with free slots
                    raise RuntimeError("SlotEngine: requests wait but no slot can take them")
                # no more steps than the shortest remaining budget needs (the rest join at the next boundary)
                n = min(self.chunk, min(r.sampling.max_new_tokens - max(len(r.tokens), 1) for r in running))
                n = max(n, 0)
                for req in admitted:
                    self.stats.requests += 1
                    self.stats.prefill_tokens += len(req.prompt) - req.reuse
                    self.stats.prompt_tokens += len(req.prompt)
                t0 = time.perf_counter()
                outs = await asyncio.to_thread(self._work, admitted, running, n)
                self.stats.busy_s += time.perf_counter() - t0
                self.stats.steps += n
                self.stats.max_busy = max(self.stats.max_busy, len(running))
                self.stats.slot_steps += n * len(running)
                for req, (tokens, logprobs) in zip(running, outs):
                    req.fed += n
                    self._finish_check(req, tokens, logprobs)
                    if req.reason is None and len(req.tokens) >= req.sampling.max_new_tokens:
                        req.reason = "length"
                    if req.reason is not None:
                        self._leave(req)
        except BaseException as e:  # every waiting request hears of it, none hangs
            for req in [*self._waiting, *[r for r in self.busy if r is not None]]:
                if not req.future.done():
                    req.future.set_exception(e)
                if req.slot >= 0:
                    self.runner.stop(req.slot)
                    self.busy[req.slot], self.held[req.slot] = None, []
            self._waiting = []
            if not isinstance(e, Exception):
                raise

    def _leave(self, req: _Request) -> None:
        """The request is done: its slot parks holding the prompt and the tokens fed back into it."""
        self.runner.stop(req.slot)
        self.busy[req.slot] = None
        self.held[req.slot] = req.prompt + req.tokens[:min(len(req.tokens), req.fed)]
        if not req.future.done():
            req.future.set_result(GenOutput(req.tokens, req.reason,
                                            req.logprobs if req.sampling.return_logprobs else None))
