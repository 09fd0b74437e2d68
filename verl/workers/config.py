"""Plain dataclasses for the FSDP actor / critic workers (the trainer's hydra config maps onto these)."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from verl.workers.lora import LoraConfig


@dataclass
class WorkerConfig:
    """What the actor, the reference policy and the critic share."""

    model: Any = None  # HF dir / hub id, a "*.gguf" file, or a dict config {"model_type": ..., ...}
    tokenizer: Any = None  # path or tokenizer object; export_hf saves it next to the weights
    device: str | None = None  # "cuda", "cpu", or None: CUDA when available
    dtype: str = "bfloat16"  # compute dtype on CUDA; CPU always computes in float32
    seed: int = 0  # seeds the random init of dict-config models and the torch RNG
    lr: float = 1e-6
    betas: tuple[float, float] = (0.9, 0.999)
    weight_decay: float = 0.01
    grad_clip: float = 1.0
    warmup_steps: int = 0  # linear lr warmup over this many update calls (training steps)
    ppo_epochs: int = 1
    ppo_mini_batch_size: int = 32  # rows of the GLOBAL batch per optimizer step
    micro_batch_size: int = 8  # rows per forward/backward when no token budget is set
    max_tokens_per_micro_batch: int | None = None  # dynamic micro-batching by real tokens
    # Budget for the no-grad passes (log-probs, ref, values): no activations kept, so it can be
    # several times the training budget. None: the training budget / micro_batch_size.
    log_prob_max_tokens_per_micro_batch: int | None = None
    # Pack each micro-batch's rows into one row without padding (loads the model with
    # model_loader.PACKED_ATTENTION, which keeps attention inside each sequence).
    use_remove_padding: bool = False
    loss_agg_mode: str = "token-mean"
    gradient_checkpointing: bool = False
    compile: bool = False  # torch.compile each decoder layer (model_loader.compile_decoder_layers)
    param_offload: bool = False  # FSDP2 CPUOffloadPolicy: params, grads and optimizer state on CPU
    reshard_after_forward: bool = True
    lora: LoraConfig = field(default_factory=LoraConfig)  # LoRA adapters (rank 0: full fine-tuning); verl.workers.lora


@dataclass
class ActorConfig(WorkerConfig):
    clip_low: float = 0.2
    clip_high: float = 0.2
    dual_clip_c: float | None = None  # None disables the dual clip
    entropy_coef: float = 0.0
    kl_loss_coef: float = 0.0  # > 0 adds a KL(policy || ref) term to the loss (GRPO style)
    kl_loss_kind: str = "k3"
    # Log-probs from hidden states, this many positions' float32 logits at a time (recomputed
    # in backward); None: the full (batch, len, vocab) float32 logits (the reference path).
    logprob_chunk_size: int | None = 2048


@dataclass
class CriticConfig(WorkerConfig):
    lr: float = 1e-5
    cliprange_value: float = 0.5
