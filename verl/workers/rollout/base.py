"""The rollout-backend interfaces: token ids in, token ids out, plus weight sync and sleep/wake.

Two shapes of the same engine:
- `RolloutBackend.generate(prompts, sampling)`: a batch in, a batch out (one call per turn);
- `AsyncRolloutBackend.generate_one(prompt_ids, sampling)`: one request, awaited; many run
  at once (one coroutine per episode) and the engine decides how to batch them (vLLM's
  async engine, hf_static's slots). `as_async(backend)` gives a batch backend that shape by
  gathering the requests waiting at the moment the engine is free into one batch call.
"""
from __future__ import annotations

import asyncio
import math
from dataclasses import dataclass
from typing import Callable, Iterable, Iterator, Mapping, Optional, Protocol, runtime_checkable

import torch

FINISH_REASONS = ("stop", "length", "eos")

# Wrapper prefixes that FSDP, activation checkpointing, torch.compile and DDP put into
# parameter names; the model being loaded knows none of them.
_WRAPPER_PARTS = ("_fsdp_wrapped_module.", "_checkpoint_wrapped_module.", "_orig_mod.")


@dataclass
class SamplingParams:
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = -1                 # <= 0 disables top-k
    max_new_tokens: int = 256
    greedy: bool = False            # argmax decoding; temperature/top_p/top_k are then ignored
    stop: tuple[str, ...] = ()      # stop strings; the output includes the stop string
    seed: int | None = None
    return_logprobs: bool = False   # each sampled token's log-prob at `logprob_temperature`
    # Choice points in a turn (`choices(generated ids) -> token sequences | None`): where a row opens one, the hf
    # engine writes one of the sequences in whole, the one the model scores highest (e.g.
    # router_r1.name_constraint). Sampling then leaves the policy's own distribution: evaluation and serving
    # only, never with log-probs.
    constraint: Optional["TokenConstraint"] = None

    def __post_init__(self):
        if isinstance(self.stop, str):  # a bare string would be read as a tuple of characters
            self.stop = (self.stop,)
        self.stop = tuple(self.stop)

    @property
    def is_greedy(self) -> bool:
        """Greedy when asked for, or at temperature 0 (vLLM's convention)."""
        return self.greedy or self.temperature == 0.0

    @property
    def logprob_temperature(self) -> float:
        """The T of the distribution a returned log-prob is scored under: log softmax(logits / T),
        before top-k/top-p, as the actor recomputes it; T = 1 for greedy decoding."""
        return 1.0 if self.is_greedy else float(self.temperature)

    def validate(self) -> None:
        """Raise ValueError naming the bad field."""
        if self.max_new_tokens < 1:
            raise ValueError(f"SamplingParams.max_new_tokens must be >= 1, got {self.max_new_tokens}")
        # the bounds vLLM 0.33's SamplingParams enforces (tests/test_rollout_vllm_real.py checks both agree)
        if not math.isfinite(self.temperature) or not 0.0 <= self.temperature <= 2.0:
            raise ValueError(f"SamplingParams.temperature must be a finite number in [0, 2], got {self.temperature}")
        if not 0.0 < self.top_p <= 1.0:
            raise ValueError(f"SamplingParams.top_p must be in (0, 1], got {self.top_p}")
        if not isinstance(self.top_k, int) or self.top_k < -1:
            raise ValueError(f"SamplingParams.top_k must be an int >= -1 (0 or -1: off), got {self.top_k!r}")
        for s in self.stop:
            if not isinstance(s, str) or not s:
                raise ValueError(f"SamplingParams.stop must hold non-empty strings, got {s!r}")
        if self.constraint is not None and self.return_logprobs:
            raise ValueError("SamplingParams.constraint changes the distribution tokens are sampled from, so their "
                             "log-probs are not the policy's: constrained decoding is for evaluation and serving")


@runtime_checkable
class TokenConstraint(Protocol):
    """Where a row's generated ids open a choice point, the token sequences that may come next (else None)."""

    def choices(self, generated: list[int]) -> list[list[int]] | None: ...


def refuse_constraint(sampling: "SamplingParams", engine: str) -> None:
    """Raise for an engine that cannot apply SamplingParams.constraint (its decode steps do not come back to Python
    one at a time: CUDA graphs with read-back in chunks, the slot engine, vLLM)."""
    if sampling.constraint is not None:
        raise ValueError(f"SamplingParams.constraint (constrained decoding, e.g. env.constrain_names) is applied by "
                         f"the hf engine only, not {engine}: use --rollout hf")


@dataclass
class GenOutput:
    token_ids: list[int]                 # generated tokens only, stop string / eos token included
    finish_reason: str                   # "stop" | "length" | "eos"
    logprobs: list[float] | None = None  # one per token in token_ids, log p under the raw model (T=1)


@runtime_checkable
class RolloutBackend(Protocol):
    def generate(self, prompts: list[list[int]], sampling: SamplingParams) -> list[GenOutput]: ...
    def update_weights(self, state_dict: dict[str, torch.Tensor]) -> None: ...
    def sleep(self) -> None: ...  # release KV cache / move weights off the accelerator where supported
    def wake(self) -> None: ...


@runtime_checkable
class AsyncRolloutBackend(Protocol):
    """One request at a time, many in flight; token_ids exactly as sampled (never re-tokenised),
    logprobs (the sampling engine's own, one per token) when sampling.return_logprobs.

    Optional: `release(context_ids)`, called when an episode whose last context was
    `context_ids` ends, lets an engine that keeps an episode's cache between turns free it.
    """

    async def generate_one(self, prompt_ids: list[int], sampling: SamplingParams) -> GenOutput: ...


BatchGenerate = Callable[[list[list[int]], SamplingParams], list[GenOutput]]


class BatchedAsync:
    """`generate_one` over a batch `generate`: the requests waiting when the engine is free
    (with equal SamplingParams) go out as one batch call, run in a worker thread so the event
    loop (pool calls) keeps going while the model decodes. No waiting for a batch to fill."""

    def __init__(self, generate: BatchGenerate, max_batch: int | None = None):
        if max_batch is not None and max_batch < 1:
            raise ValueError(f"max_batch must be >= 1 or None, got {max_batch}")
        self._generate = generate
        self.max_batch = max_batch
        self._pending: list[tuple[list[int], SamplingParams, asyncio.Future]] = []
        self._worker: asyncio.Task | None = None
        self.batch_sizes: list[int] = []  # rows of each batch call, for benchmarks and tests

    async def generate_one(self, prompt_ids: list[int], sampling: SamplingParams) -> GenOutput:
        fut = asyncio.get_running_loop().create_future()
        self._pending.append((list(prompt_ids), sampling, fut))
        if self._worker is None or self._worker.done():
            self._worker = asyncio.create_task(self._drain())
        return await fut

    async def _drain(self) -> None:
        while self._pending:
            await asyncio.sleep(0)  # let every coroutine made ready in this loop pass submit first
            first = self._pending[0][1]
            batch = [r for r in self._pending if r[1] == first][: self.max_batch]
            taken = {id(r) for r in batch}
            self._pending = [r for r in self._pending if id(r) not in taken]
            self.batch_sizes.append(len(batch))
            try:
                outs = await asyncio.to_thread(self._generate, [r[0] for r in batch], first)
                if len(outs) != len(batch):
                    raise RuntimeError(f"generate returned {len(outs)} outputs for {len(batch)} prompts")
            except BaseException as e:  # every waiting episode hears of it, none hangs
                for _, _, fut in batch:
                    if not fut.done():
                        fut.set_exception(e)
                if not isinstance(e, Exception):
                    raise
                continue
            for (_, _, fut), out in zip(batch, outs):
                if not fut.done():  # its episode was cancelled meanwhile
                    fut.set_result(out)


def as_async(backend: RolloutBackend | AsyncRolloutBackend | BatchGenerate,
             max_batch: int | None = None) -> AsyncRolloutBackend:
    """An async view of a backend: itself if it already has generate_one, else a BatchedAsync over
    its batch `generate` (or over a plain generate function)."""
    if isinstance(backend, AsyncRolloutBackend):
        return backend
    generate = getattr(backend, "generate", backend)
    if not callable(generate):
        raise TypeError(f"as_async needs a backend with generate/generate_one or a function, "
                        f"got {type(backend).__name__}")
    return BatchedAsync(generate, max_batch)


def validate_prompts(prompts: list[list[int]], vocab_size: int | None = None) -> None:
    """Raise ValueError naming the first bad prompt row."""
    if not isinstance(prompts, (list, tuple)):
        raise ValueError(f"prompts must be a list of token-id lists, got {type(prompts).__name__}")
    for i, p in enumerate(prompts):
        if not isinstance(p, (list, tuple)) or len(p) == 0:
            raise ValueError(f"prompts[{i}] must be a non-empty list of token ids, got {p!r:.80}")
        if not all(isinstance(t, int) for t in p):
            raise ValueError(f"prompts[{i}] holds a non-integer token id")
        lo, hi = min(p), max(p)
        if lo < 0 or (vocab_size is not None and hi >= vocab_size):
            bad = lo if lo < 0 else hi
            raise ValueError(f"prompts[{i}] holds token id {bad} outside the vocabulary (size {vocab_size})")


def clean_param_name(name: str) -> str:
    """Drop FSDP / checkpoint / torch.compile / DDP wrapper prefixes from a parameter name."""
    for part in _WRAPPER_PARTS:
        name = name.replace(part, "")
    if name.startswith("module."):  # DDP
        name = name[len("module."):]
    return name


def full_tensor(t: torch.Tensor) -> torch.Tensor:
    """Materialise a sharded DTensor (anything with .full_tensor()) into a plain tensor."""
    if hasattr(t, "full_tensor"):
        t = t.full_tensor()
    return t.detach()


def clean_names(names: Iterable[str]) -> dict[str, str]:
    """{clean name: state_dict key}; two keys that clean to one name are an error."""
    seen: dict[str, str] = {}
    for name in names:
        clean = clean_param_name(name)
        if clean in seen:
            raise ValueError(f"state_dict keys {seen[clean]!r} and {name!r} both map to {clean!r}")
        seen[clean] = name
    return seen


def clean_state_dict_items(state_dict: Mapping[str, torch.Tensor]) -> Iterator[tuple[str, torch.Tensor]]:
    """Yield (clean name, plain tensor) pairs, one at a time so a big model is never copied whole; the names
    are checked first, so a clash raises before any tensor is gathered."""
    for clean, name in clean_names(state_dict.keys()).items():
        yield clean, full_tensor(state_dict[name])
