"""The rollout-backend interface: token ids in, token ids out, plus weight sync and sleep/wake."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Iterator, Mapping, Protocol, runtime_checkable

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
    return_logprobs: bool = False

    def __post_init__(self):
        if isinstance(self.stop, str):  # a bare string would be read as a tuple of characters
            self.stop = (self.stop,)
        self.stop = tuple(self.stop)

    @property
    def is_greedy(self) -> bool:
        """Greedy when asked for, or at temperature 0 (vLLM's convention)."""
        return self.greedy or self.temperature == 0.0

    def validate(self) -> None:
        """Raise ValueError naming the bad field."""
        if self.max_new_tokens < 1:
            raise ValueError(f"SamplingParams.max_new_tokens must be >= 1, got {self.max_new_tokens}")
        if self.temperature < 0:
            raise ValueError(f"SamplingParams.temperature must be >= 0, got {self.temperature}")
        if not 0.0 < self.top_p <= 1.0:
            raise ValueError(f"SamplingParams.top_p must be in (0, 1], got {self.top_p}")
        if not isinstance(self.top_k, int):
            raise ValueError(f"SamplingParams.top_k must be an int, got {self.top_k!r}")
        for s in self.stop:
            if not isinstance(s, str) or not s:
                raise ValueError(f"SamplingParams.stop must hold non-empty strings, got {s!r}")


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


def clean_state_dict_items(state_dict: Mapping[str, torch.Tensor]) -> Iterator[tuple[str, torch.Tensor]]:
    """Yield (clean name, plain tensor) pairs, one at a time so a big model is never copied whole."""
    seen: dict[str, str] = {}
    for name, tensor in state_dict.items():
        clean = clean_param_name(name)
        if clean in seen:
            raise ValueError(f"state_dict keys {seen[clean]!r} and {name!r} both map to {clean!r}")
        seen[clean] = name
        yield clean, full_tensor(tensor)
