"""The `model`, `actor`, `critic` and `ref` sections of the run config, and what a worker is built with.

Each section dataclass is the one home of its keys: the field name is the yaml key, the default is
the default, the comment beside it is its documentation (tests/test_config_schema.py checks that every
field has one). verl/trainer/config.py gathers the sections into the root config that Hydra checks.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Optional

from verl.workers.lora import LoraConfig

TINY_MODEL = {"model_type": "llama", "vocab_size": None, "hidden_size": 64, "intermediate_size": 128,
              "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 4,
              "max_position_embeddings": 1024}


@dataclass
class ModelConfig:
    """`model`: what the actor, critic and reference load."""

    path: Any = field(default_factory=lambda: dict(TINY_MODEL))  # an HF directory / hub id, a GGUF file, or a config mapping or *.json file of one (random init; vocab_size null = the tokenizer's)
    tokenizer: str = "tiny"  # an HF directory / hub id, a GGUF file, or "tiny" (a small BPE trained on the spot)
    critic_path: Any = None  # the critic's starting weights; null = model.path
    dtype: str = "auto"  # compute dtype: auto (bf16 on CUDA, fp32 on CPU) | bf16 | fp32; trained weights stay fp32
    gradient_checkpointing: bool = False  # recompute activations in backward (actor and critic)
    compile: bool = False  # torch.compile each decoder layer of actor, critic and reference (GPU: fuses elementwise work; the first steps pay the compile)
    seed: int = 0  # init seed of config-built models


@dataclass
class ActorConfig:
    """`actor`: the policy's optimizer and PPO loss. The batching, padding-free and offload keys apply to the
    critic and the reference too."""

    lr: float = 1.0e-6  # AdamW learning rate
    weight_decay: float = 0.01  # AdamW weight decay
    betas: list[float] = field(default_factory=lambda: [0.9, 0.999])  # AdamW betas
    warmup_steps: int = 0  # linear lr warmup over this many training steps
    warmup_ratio: float = 0.0  # linear lr warmup over this share of trainer.total_steps, when warmup_steps is 0 (veRL's lr_warmup_steps_ratio)
    lr_schedule: str = "constant"  # after the warmup: constant | cosine (down to lr x min_lr_ratio at the last step)
    min_lr_ratio: float = 0.0  # cosine: the last step's lr as a share of lr
    weight_decay_1d: bool = True  # weight decay on 1-d parameters (norms, biases) too; false: on matrices only (the SFT recipe, configs/sft.yaml)
    fused_optimizer: Optional[bool] = None  # AdamW's one-kernel implementation, with one process (sharded parameters always use the default); null: on a GPU only; true: on CPU too, ~50x faster for a small model (configs/sft.yaml), last bits differ from the default
    grad_clip: float = 1.0  # max gradient norm (a non-finite norm skips the optimizer step)
    ppo_epochs: int = 1  # passes over each step's batch
    ppo_mini_batch_size: int = 4  # trajectories per optimizer step (after rollout.n samples each), over all ranks
    ppo_micro_batch_size: int = 2  # trajectories per forward/backward, when no token budget is set
    max_tokens_per_micro_batch: Optional[int] = None  # dynamic micro-batches by a token budget instead of ppo_micro_batch_size (the critic uses the same budget)
    log_prob_max_tokens_per_micro_batch: Optional[int] = None  # token budget of the no-grad passes (old/ref log-probs, values); null = the training budget. No autograd state there: it can be larger
    use_remove_padding: bool = False  # pack each micro-batch's rows into one row without padding (flash varlen attention on CUDA, per-sequence sdpa on CPU); actor, ref and critic
    share_prompt_prefix: Any = "auto"  # run the prompt prefix a micro-batch's rows share (an instruction and pool listing) once, batch 1, and each row's rest against its KV cache: the same log-probs, values and gradients for a fraction of the prompt's compute (tools/bench/bench_shared_prefix.py); actor, ref and critic. Needs one process, padded rows, full-attention layers, chunked log-probs, no gradient_checkpointing or compile. auto: on the CPU where those hold (on an H100 it was slower, at 0.5B too) | true: on (an error where they do not) | false
    logprob_chunk_size: Optional[int] = 2048  # response positions per fp32 logits chunk (log-probs never materialise (batch, len, vocab) fp32); null = full logits (the reference path)
    clip_ratio_low: float = 0.2  # PPO epsilon below 1 (DAPO decouples low and high)
    clip_ratio_high: float = 0.2  # PPO epsilon above 1 (DAPO's clip-higher: 0.28)
    dual_clip_c: Optional[float] = None  # dual-clip constant for negative advantages (e.g. 3.0); null = off
    entropy_coef: float = 0.0  # entropy bonus in the loss
    use_kl_loss: bool = False  # GRPO-style KL(policy || ref) in the loss (instead of, or besides, KL in the reward)
    kl_loss_coef: float = 0.001  # weight of that KL term (used only with use_kl_loss)
    kl_loss_type: str = "k3"  # KL estimator of the loss term: k1 | abs | k2 | k3 | low_var_kl
    loss_agg_mode: str = "token-mean"  # how the loss averages (verl/algos/losses.py agg_loss): token-mean (over every policy token, DAPO) | seq-mean-token-sum (each sequence's token sum, mean over sequences) | seq-mean-token-mean (each sequence's token mean, mean over sequences) | seq-mean-token-sum-norm (token sums / response length, mean over all sequences: Dr. GRPO)
    sft_context_loss_weight: float = 0.0  # trainer.mode=sft: add W x the next-token loss on prompt and environment tokens (0: policy tokens only). A model trained from scratch needs it (W=1) to learn to copy names; RL never trains those tokens
    param_offload: bool = False  # FSDP2 CPUOffloadPolicy (world size > 1): params, grads and optimizer state live on CPU
    lora: LoraConfig = field(default_factory=LoraConfig)  # LoRA adapters instead of full fine-tuning (verl/workers/lora.py); the reference is then the actor with its adapters off (no second copy)


@dataclass
class CriticConfig:
    """`critic`: the value model (GAE)."""

    enable: Any = "auto"  # auto (on for gae, off for grpo) | true | false
    lr: float = 1.0e-5  # AdamW learning rate
    weight_decay: float = 0.01  # AdamW weight decay
    betas: list[float] = field(default_factory=lambda: [0.9, 0.999])  # AdamW betas
    grad_clip: float = 1.0  # max gradient norm
    ppo_epochs: int = 1  # passes over each step's batch
    ppo_mini_batch_size: int = 4  # trajectories per optimizer step, over all ranks
    ppo_micro_batch_size: int = 2  # trajectories per forward/backward (actor.max_tokens_per_micro_batch overrides)
    cliprange_value: float = 0.5  # value clipping around the old values
    loss_agg_mode: str = "token-mean"  # how the value loss averages: token-mean | seq-mean-token-sum | seq-mean-token-mean | seq-mean-token-sum-norm (actor.loss_agg_mode says what each does)
    warmup_steps: int = 0  # critic-only steps: actor updates start after this many steps (not an lr warmup)
    lora: LoraConfig = field(default_factory=LoraConfig)  # as actor.lora; the value head trains in full beside the adapters


@dataclass
class RefConfig:
    """`ref`: the frozen reference policy (for KL)."""

    enable: Any = "auto"  # auto (on when KL is used, in the reward or the loss) | true | false


@dataclass
class WorkerConfig:
    """What one worker is built with: the resolved model (not a yaml section; main_ppo.worker_config makes it)
    and the sections it trains with. The reference uses `actor`, the critic `critic` plus actor's batching keys."""

    model: Any = None  # HF dir / hub id, a "*.gguf" file, or a dict config {"model_type": ..., ...} with vocab_size set
    tokenizer: Any = None  # path or tokenizer object; export_hf saves it next to the weights
    device: Optional[str] = None  # "cuda", "cpu", or None: CUDA when available
    dtype: str = "bfloat16"  # compute dtype on CUDA; CPU always computes in float32
    seed: int = 0  # seeds the random init of dict-config models and the torch RNG
    gradient_checkpointing: bool = False  # recompute activations in backward
    compile: bool = False  # torch.compile each decoder layer (model_loader.compile_decoder_layers)
    reshard_after_forward: bool = True  # FSDP2: free gathered weights after forward (ZeRO-3 style)
    total_steps: Optional[int] = None  # the run's training steps (trainer.total_steps, resolved): the length of actor.warmup_ratio and of the cosine schedule
    actor: ActorConfig = field(default_factory=ActorConfig)  # the actor section
    critic: CriticConfig = field(default_factory=CriticConfig)  # the critic section


def worker_config(role: str = "actor", **kw) -> WorkerConfig:
    """A WorkerConfig from flat keys (tests, benchmarks): WorkerConfig's own fields, then the `role` section's
    (actor for actor/ref, critic for critic), then the actor's (batching keys the critic shares)."""
    import dataclasses

    names = lambda cls: {f.name for f in dataclasses.fields(cls)}  # noqa: E731
    section_cls = CriticConfig if role == "critic" else ActorConfig
    top, section, actor = {}, {}, {}
    for k, v in kw.items():
        if k in names(WorkerConfig) - {"actor", "critic"}:
            top[k] = v
        elif k in names(section_cls):
            section[k] = v
        elif k in names(ActorConfig):
            actor[k] = v
        else:
            raise TypeError(f"worker_config: unknown key {k!r} for role {role!r}")
    if role == "critic":
        return WorkerConfig(**top, actor=ActorConfig(**actor), critic=CriticConfig(**section))
    return WorkerConfig(**top, actor=ActorConfig(**section))
