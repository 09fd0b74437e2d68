"""LoRA adapters for the actor (and the critic): our own small module, no `peft`.

`apply_lora` swaps the chosen nn.Linear layers of each decoder layer for `LoraLinear`, an
nn.Linear subclass that keeps the base weight under its own name (`q_proj.weight`) and adds
two trainable factors beside it (`q_proj.lora_A` (rank, in), `q_proj.lora_B` (out, rank)):

    y = x W^T + b + (alpha / rank) * dropout(x) A^T B^T      (B starts at 0: the base model)

Everything else is frozen. Being a plain nn.Linear with two more parameters, the layer
shards with `fully_shard` (FSDP2 keeps frozen and trainable parameters in one unit),
compiles with the decoder layer, and leaves the attention (the packed path) alone.

- The reference policy is the same model with the adapters switched off (`adapters_disabled`),
  so a LoRA run holds one copy of the base weights.
- Rollout engines and the HF export get merged weights (`merge_state_dict`: W + s * B A, the
  lora keys dropped): the same names and shapes as the base model, so `hf`, `hf_static` (which
  copies into its fused q|k|v and gate|up matrices) and vLLM need no LoRA support.
- Checkpoints hold only the trainable parameters (fsdp.save_checkpoint(adapter_only=True)).
"""
from __future__ import annotations

import contextlib
import math
from dataclasses import dataclass, field
from typing import Iterator

import torch
import torch.nn.functional as F
from torch import nn

ALL_LINEAR = "all-linear"


@dataclass
class LoraConfig:
    """`actor.lora` (and `critic.lora`): low-rank adapters instead of full fine-tuning."""

    rank: int = 0  # adapter rank r; 0 = off (full fine-tuning)
    alpha: float = 16.0  # the adapter's output is scaled by alpha / rank
    target_modules: list[str] = field(default_factory=lambda: [ALL_LINEAR])  # Linear names in the decoder layers that get adapters (q_proj, v_proj, ...), or all-linear
    dropout: float = 0.0  # dropout on the adapter's input while training

    def __post_init__(self):
        if self.rank < 0:
            raise ValueError(f"lora.rank must be >= 0 (0 = off), got {self.rank}")
        if not 0.0 <= self.dropout < 1.0:
            raise ValueError(f"lora.dropout must be in [0, 1), got {self.dropout}")
        if isinstance(self.target_modules, str):
            self.target_modules = [self.target_modules]
        self.target_modules = list(self.target_modules)
        if not self.target_modules:
            raise ValueError("lora.target_modules is empty; name the Linear layers or use [all-linear]")

    @property
    def enabled(self) -> bool:
        return self.rank > 0


def as_lora_config(value) -> LoraConfig:
    """A LoraConfig from None, a mapping (yaml) or a LoraConfig."""
    if value is None:
        return LoraConfig()
    if isinstance(value, LoraConfig):
        return value
    if isinstance(value, dict):
        unknown = set(value) - set(LoraConfig.__dataclass_fields__)
        if unknown:
            raise ValueError(f"lora: unknown keys {sorted(unknown)}; known: {sorted(LoraConfig.__dataclass_fields__)}")
        return LoraConfig(**value)
    raise TypeError(f"lora config must be a mapping or LoraConfig, got {type(value).__name__}")


class LoraLinear(nn.Linear):
    """nn.Linear + a low-rank update; `lora_enabled = False` gives the base layer exactly."""

    lora_A: nn.Parameter  # (rank, in_features)
    lora_B: nn.Parameter  # (out_features, rank)

    @classmethod
    def wrap(cls, base: nn.Linear, rank: int, alpha: float, dropout: float) -> "LoraLinear":
        """A LoraLinear that takes over `base`'s weight and bias objects (no copy)."""
        layer = cls.__new__(cls)
        nn.Module.__init__(layer)
        layer.in_features, layer.out_features = base.in_features, base.out_features
        layer.weight, layer.bias = base.weight, base.bias
        kw = dict(device=base.weight.device, dtype=base.weight.dtype)
        layer.lora_A = nn.Parameter(torch.empty(rank, base.in_features, **kw))
        layer.lora_B = nn.Parameter(torch.zeros(base.out_features, rank, **kw))
        nn.init.kaiming_uniform_(layer.lora_A, a=math.sqrt(5))  # as nn.Linear inits its weight
        layer.lora_scaling = alpha / rank
        layer.lora_dropout = nn.Dropout(dropout) if dropout else nn.Identity()
        layer.lora_enabled = True
        return layer

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = F.linear(x, self.weight, self.bias)
        if not self.lora_enabled:
            return out
        return out + F.linear(F.linear(self.lora_dropout(x), self.lora_A), self.lora_B) * self.lora_scaling

    def extra_repr(self) -> str:
        return f"{super().extra_repr()}, lora_rank={self.lora_A.shape[0]}, lora_scaling={self.lora_scaling:g}"


def _decoder_layers(model: nn.Module) -> list[nn.Module]:
    from verl.workers.fsdp import decoder_layers  # the same units FSDP2 shards

    return decoder_layers(model)


def apply_lora(model: nn.Module, cfg: LoraConfig, trainable: tuple[str, ...] = ()) -> list[str]:
    """Put adapters on the target Linear layers of every decoder layer and freeze all else, in place.

    `trainable`: parameter-name prefixes that stay fully trainable (the critic's value head).
    Returns the adapted module names. Call before compile and fully_shard."""
    targets = set(cfg.target_modules)
    every = ALL_LINEAR in targets
    for p in model.parameters():
        p.requires_grad_(False)
    adapted, seen = [], set()
    for layer in _decoder_layers(model):
        for name, child in list(layer.named_modules()):
            leaf = name.rsplit(".", 1)[-1]
            if type(child) is nn.Linear:
                seen.add(leaf)
            if type(child) is not nn.Linear or not (every or leaf in targets):
                continue
            parent = layer.get_submodule(name.rsplit(".", 1)[0]) if "." in name else layer
            setattr(parent, leaf, LoraLinear.wrap(child, cfg.rank, cfg.alpha, cfg.dropout))
            adapted.append(name)
    missing = targets - seen - {ALL_LINEAR}
    if missing or not adapted:
        raise ValueError(f"lora.target_modules {sorted(missing or targets)} match no nn.Linear in the decoder "
                         f"layers of {type(model).__name__}; those are named {sorted(seen)}")
    for name, p in model.named_parameters():
        if any(name.startswith(t) for t in trainable):
            p.requires_grad_(True)
    return adapted


def lora_layers(model: nn.Module) -> Iterator[tuple[str, LoraLinear]]:
    for name, m in model.named_modules():
        if isinstance(m, LoraLinear):
            yield name, m


@contextlib.contextmanager
def adapters_disabled(model: nn.Module):
    """The base model for the duration (the reference policy of a LoRA run)."""
    layers = [m for _, m in lora_layers(model)]
    for m in layers:
        m.lora_enabled = False
    try:
        yield model
    finally:
        for m in layers:
            m.lora_enabled = True


def merge_state_dict(model: nn.Module, state: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """The base model's state dict from a gathered LoRA one: W + s * B A in float32, cast back to W's
    dtype; the lora_A / lora_B keys dropped. `state` is modified in place and returned."""
    for name, m in lora_layers(model):
        a, b = state.pop(f"{name}.lora_A", None), state.pop(f"{name}.lora_B", None)
        w = state.get(f"{name}.weight")
        if a is None or b is None or w is None:  # rank0_only gathers leave the other ranks empty
            continue
        delta = (b.float() @ a.float()) * m.lora_scaling  # (out, in)
        state[f"{name}.weight"] = (w.float() + delta).to(w.dtype)
    return state


def trainable_parameters(model: nn.Module) -> list[nn.Parameter]:
    return [p for p in model.parameters() if p.requires_grad]
