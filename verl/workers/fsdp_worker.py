"""The FSDP worker base that the actor, the reference and the critic share: model loading and sharding,
optimizer and lr schedule, the micro-batch plan, the PPO update loop, checkpoints.

Data-parallel: each rank holds 1/world_size of every batch; under world_size > 1 the
model is sharded with FSDP2, with one process it is the plain module. Losses are
weighted so that any split over ranks and micro-batches gives the gradient of the whole
mini-batch loss (see micro_batch.loss_units).
"""
from __future__ import annotations

import math
import warnings
from collections import defaultdict

import numpy as np
import torch
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.tensor import DTensor

from verl.protocol import DataProto
from verl.single_controller.base import Worker, reduce_metric, register
from verl.workers import fsdp
from verl.workers.config import WorkerConfig
from verl.workers.lora import apply_lora, as_lora_config, merge_state_dict, trainable_parameters
from verl.workers.micro_batch import (SEQ_KEYS, loss_units, make_micro_batches, pack_rows, response_logit_index,
                                      split_rows, split_shared_prefix)
from verl.workers.model_loader import (PACKED_ATTENTION, attention_layer_types, broadcast_cache, cache_keyword,
                                      compile_decoder_layers, load_model, to_dtype)


def lr_schedule(actor, total_steps: int | None):
    """The actor's lr factor per training step (0-based): linear warmup (actor.warmup_steps, or
    actor.warmup_ratio x total_steps), then constant or cosine down to min_lr_ratio at the last step.
    The critic's lr is constant: critic.warmup_steps holds the actor back instead."""
    if actor.lr_schedule not in ("constant", "cosine"):
        raise ValueError(f"actor.lr_schedule must be constant | cosine, got {actor.lr_schedule!r}")
    needs_total = actor.lr_schedule == "cosine" or (actor.warmup_ratio and not actor.warmup_steps)
    if needs_total and not total_steps:
        raise ValueError("actor.lr_schedule=cosine and actor.warmup_ratio need the run's total steps")
    warmup = actor.warmup_steps or int(actor.warmup_ratio * (total_steps or 0))
    min_ratio = actor.min_lr_ratio

    def factor(step: int) -> float:
        if step < warmup:
            return (step + 1) / warmup
        if actor.lr_schedule == "constant":
            return 1.0
        progress = (step - warmup) / max(1, total_steps - warmup - 1)
        return min_ratio + (1 - min_ratio) * 0.5 * (1 + math.cos(math.pi * min(1.0, progress)))

    return factor


def freeze_token_rows(model) -> tuple[torch.Tensor, torch.Tensor] | None:
    """Hold the input-embedding rows of `model.config.frozen_token_ids` at their values: no gradient (so
    clipping ignores them) and restored after each step. A tied head shares them. With every name's
    row a fixed random vector, a small policy learns one copy circuit that also copies names its
    training data never showed (a trained row of an unseen name only ever learned to be unlikely).
    Returns (ids, saved rows) or None when the config names no ids."""
    ids = getattr(model.config, "frozen_token_ids", None)
    if not ids:
        return None
    weight = model.get_input_embeddings().weight
    index = torch.as_tensor(sorted(set(ids)), dtype=torch.long)
    if int(index.min()) < 0 or int(index.max()) >= weight.shape[0]:
        raise ValueError(f"model.config.frozen_token_ids: ids must be in [0, {weight.shape[0]}), got "
                         f"{int(index.min())}..{int(index.max())}")
    mask = torch.zeros(weight.shape[0], 1, dtype=torch.bool)
    mask[index] = True
    weight.register_hook(lambda g: g.masked_fill(mask.to(g.device), 0.0))
    print(f"frozen: {len(index)} embedding rows (model.config.frozen_token_ids)")
    return index, weight.detach()[index.to(weight.device)].clone()


class FSDPWorker(Worker):
    """Model, optimizer, micro-batch plan and checkpoints; shared by the actor and the critic."""

    def __init__(self, config: WorkerConfig, role: str):
        super().__init__(config.device)
        self.config, self.role = config, role
        # The section this worker trains with; batching, padding-free and offload keys are the actor's for all.
        self.train_cfg = config.critic if role == "critic" else config.actor
        self.trainable = role in ("actor", "critic")
        self.model = self.optimizer = self.scheduler = None
        lora = as_lora_config(self.train_cfg.lora)
        # The reference of a LoRA run is the actor with its adapters off; a "ref" worker is the base model.
        self.lora = lora if lora.enabled and self.trainable else None

    @register("all")
    def init_model(self) -> None:
        cfg = self.config
        torch.manual_seed(cfg.seed)
        compute_dtype = to_dtype(cfg.dtype) if self.device.type == "cuda" else torch.float32
        # Trained weights stay fp32 (the optimizer's master copy); the reference only runs forwards.
        load_dtype = torch.float32 if self.trainable else compute_dtype
        model = load_model(cfg.model, load_dtype, role="critic" if self.role == "critic" else "actor",
                           seed=cfg.seed, gradient_checkpointing=cfg.gradient_checkpointing and self.trainable,
                           attn_implementation=PACKED_ATTENTION if cfg.actor.use_remove_padding else None)
        self._frozen_rows = freeze_token_rows(model) if self.trainable else None  # before sharding: plain params
        if self._frozen_rows is not None and self.world_size > 1:
            raise NotImplementedError("model.config.frozen_token_ids with several ranks: the rows are kept on the "
                                      "unsharded weight only; train such a model on one rank")
        if self.lora is not None:  # before compile and sharding: they see the adapted layers
            # the critic's value head is new: it trains in full beside the adapters
            apply_lora(model, self.lora, trainable=("score.", "classifier.") if self.role == "critic" else ())
        if cfg.compile:  # before sharding: FSDP2 wraps the compiled layers
            compile_decoder_layers(model)
        self.autocast_dtype = None
        if self.world_size > 1:
            if not cfg.actor.param_offload:
                model.to(self.device)
            mesh = init_device_mesh(self.device.type, (self.world_size,))
            fsdp.apply_fsdp2(model, mesh, param_dtype=compute_dtype, reduce_dtype=torch.float32,
                             reshard_after_forward=cfg.reshard_after_forward, cpu_offload=cfg.actor.param_offload)
        else:
            model.to(self.device)
            if compute_dtype != load_dtype:  # one GPU: mixed precision by autocast instead of FSDP's policy
                self.autocast_dtype = compute_dtype
        self.model = model
        self.share_prefix = self._share_prefix(model)
        self.cache_key = cache_keyword(model)
        if self.trainable:
            t = self.train_cfg
            params = list(trainable_parameters(model))
            if getattr(t, "weight_decay_1d", True):
                groups = [{"params": params, "weight_decay": t.weight_decay}]
            else:  # norms and biases keep their scale: no decay pulling them to 0
                groups = [{"params": [p for p in params if p.ndim >= 2], "weight_decay": t.weight_decay},
                          {"params": [p for p in params if p.ndim < 2], "weight_decay": 0.0}]
            # The fused (one-kernel) AdamW on one GPU; sharded DTensor parameters keep the default
            # multi-tensor path, the one that the multi-process tests exercise.
            fused = getattr(t, "fused_optimizer", None)  # the critic section has no such key: null
            fused = self.world_size == 1 and (self.device.type == "cuda" if fused is None else fused)
            self.optimizer = torch.optim.AdamW(groups, lr=t.lr, betas=tuple(t.betas), weight_decay=t.weight_decay,
                                               fused=fused or None)
            factor = lr_schedule(t, cfg.total_steps) if self.role == "actor" else (lambda step: 1.0)
            self.scheduler = torch.optim.lr_scheduler.LambdaLR(self.optimizer, factor)

    # ------------------------------------------------------------------ helpers
    def _micro_batches(self, data: DataProto, no_grad: bool = False) -> list[np.ndarray]:
        """Row indices per micro-batch; every rank gets the same count (FSDP's collectives pair up).
        `no_grad` passes use log_prob_max_tokens_per_micro_batch when it is set."""
        cfg = self.config.actor
        budget = cfg.max_tokens_per_micro_batch
        if no_grad and cfg.log_prob_max_tokens_per_micro_batch:
            budget = cfg.log_prob_max_tokens_per_micro_batch
        if budget:
            k = len(make_micro_batches(data, budget))
            k = int(self.all_reduce(k, "max"))
            return make_micro_batches(data, budget, min_num=k)
        size = self.train_cfg.ppo_micro_batch_size
        k = int(self.all_reduce(math.ceil(len(data) / size), "max"))
        return split_rows(len(data), size, min_num=k)

    def _inputs(self, mb: DataProto, response_len: int):
        """Model kwargs for a micro-batch, packed into one row when use_remove_padding, and where
        its outputs score the response: (kwargs, index, real). The per-position outputs, flattened
        to (batch * seq, ...) or (total, ...), score the n real response tokens at `index` (n,);
        `real` (batch, response_len) marks their places."""
        ids, attn, pos = (mb.batch[k] for k in SEQ_KEYS)
        if self.share_prefix:
            split = split_shared_prefix(ids, attn, pos, response_len)
            if split is not None:
                kwargs = dict(input_ids=split.input_ids, attention_mask=split.attention_mask,
                              position_ids=split.position_ids)
                kwargs[self.cache_key] = self._prefix_cache(split.prefix_ids, split.prefix_position_ids, len(ids))
                return kwargs, split.index, split.real
        packed = self.config.actor.use_remove_padding
        index, real = response_logit_index(attn, response_len, packed)
        if not packed:
            return dict(input_ids=ids, attention_mask=attn, position_ids=pos), index, real
        if self.model.config._attn_implementation != PACKED_ATTENTION:
            raise RuntimeError("use_remove_padding needs the model loaded with it on (attention would cross rows)")
        p = pack_rows(ids, attn, pos)
        # An all-ones mask lets transformers skip building a (total, total) packed-sequence mask;
        # the packed attention keeps each sequence to itself through cu_seq_lens.
        kwargs = dict(input_ids=p.input_ids, attention_mask=torch.ones_like(p.input_ids), position_ids=p.position_ids,
                      cu_seq_lens_q=p.cu_seqlens, cu_seq_lens_k=p.cu_seqlens, max_length_q=p.max_len,
                      max_length_k=p.max_len)
        return kwargs, index, real

    def _share_prefix(self, model) -> bool:
        """Whether micro-batches run their shared prompt prefix once (actor.share_prompt_prefix)."""
        cfg, want = self.config, self.config.actor.share_prompt_prefix
        if want not in ("auto", True, False):
            raise ValueError(f"actor.share_prompt_prefix must be auto | true | false, got {want!r}")
        other = sorted(attention_layer_types(model.config) - {"full_attention"})
        clash = [k for k, on in (
            ("actor.use_remove_padding", cfg.actor.use_remove_padding),
            ("model.gradient_checkpointing", cfg.gradient_checkpointing),  # the recompute would replay the cache writes
            ("model.compile", cfg.compile),
            ("actor.logprob_chunk_size=null", cfg.actor.logprob_chunk_size is None),  # that path has its own forward
            # measured: FSDP2 frees the prefix forward's gathered weights before the one backward
            (f"{self.world_size} processes", self.world_size > 1),
            # a sliding window would drop prefix columns the rows attend to
            (f"{model.config.model_type}'s {other} layers", bool(other))) if on]
        if want is True and clash:
            raise ValueError(f"actor.share_prompt_prefix=true does not combine with {', '.join(clash)}")
        # auto stays off on a GPU: on an H100 it was slower, at the embedded and a 0.5B shape (docs/training.md)
        return want is True or (want == "auto" and not clash and self.device.type == "cpu")

    def _prefix_cache(self, prefix_ids: torch.Tensor, position_ids: torch.Tensor, rows: int):
        """The shared prefix's KV cache, computed once (in the caller's grad mode) and broadcast to `rows` rows;
        autograd sums each row's gradient into the one prefix forward, so the split is exact."""
        from transformers import DynamicCache

        cache = DynamicCache(config=self.model.config)
        extra = {} if self.role == "critic" else {"logits_to_keep": 1}  # the prefix's logits are not needed
        with self._autocast():
            # no use_cache flag: a given cache is written either way (and ValueHeadModel sets the flag itself)
            self.model(input_ids=prefix_ids, attention_mask=torch.ones_like(prefix_ids), position_ids=position_ids,
                       **{self.cache_key: cache}, **extra)
        broadcast_cache(cache, rows, self.model.config.model_type)
        return cache

    def _mini_batch_rows(self) -> int:
        size = self.train_cfg.ppo_mini_batch_size
        if size % self.world_size:
            raise ValueError(f"ppo_mini_batch_size={size} must be divisible by the world size {self.world_size}")
        return size // self.world_size

    def _no_grad(self):
        """inference_mode (no autograd state at all) for the plain module. FSDP2 allocates its
        gathered-weight buffers on first use; made under inference_mode they could not be
        written again in training, so sharded models get no_grad."""
        return torch.no_grad() if self.world_size > 1 else torch.inference_mode()

    def _autocast(self):
        return torch.autocast(self.device.type, dtype=self.autocast_dtype, enabled=self.autocast_dtype is not None)

    def _optimizer_step(self) -> float:
        """Clip, then step unless the gradient norm is not finite; returns the pre-clip norm."""
        norm = torch.nn.utils.clip_grad_norm_(self.model.parameters(), self.train_cfg.grad_clip)
        norm = float(norm.full_tensor() if isinstance(norm, DTensor) else norm)
        if math.isfinite(norm):
            self.optimizer.step()
            if self._frozen_rows is not None:  # AdamW's decoupled decay moves rows that had no gradient
                ids, rows = self._frozen_rows
                weight = self.model.get_input_embeddings().weight
                with torch.no_grad():
                    weight[ids.to(weight.device)] = rows.to(weight.device)
        else:
            warnings.warn(f"rank {self.rank}: gradient norm is {norm}; skipping this optimizer step")
            self.optimizer.zero_grad(set_to_none=True)
        return norm

    def ppo_update(self, data: DataProto, micro_loss, prefix: str) -> dict[str, float]:
        """The update loop the actor and the critic share (their losses differ, the loop does not):
        train_cfg.ppo_epochs passes over mini-batches, one optimizer step per mini-batch, gradient
        accumulation over micro-batches. `micro_loss(mb, mask)` gives one micro-batch's (loss, metrics);
        mb is on the device, mask = its response_mask as bool (batch, response_len). Metrics are token-weighted
        means, except `*_min` ones: the minimum over the micro-batches that report them."""
        cfg = self.train_cfg
        metrics = defaultdict(list)
        self.model.train()
        for _ in range(cfg.ppo_epochs):
            for mini in data.split(self._mini_batch_rows()):
                self.optimizer.zero_grad(set_to_none=True)
                total = self.all_reduce(loss_units(mini.batch["response_mask"], cfg.loss_agg_mode))
                stats = defaultdict(float)
                for idx in self._micro_batches(mini):
                    mb = mini[idx].to(self.device)
                    mask = mb.batch["response_mask"].bool()  # (batch, response_len)
                    loss, m = micro_loss(mb, mask)
                    # This micro-batch's share of the global mini-batch loss; x world_size
                    # undoes the averaging of gradients over ranks in FSDP's reduce-scatter.
                    weight = loss_units(mask, cfg.loss_agg_mode) / max(total, 1) * self.world_size
                    (loss * weight).backward()
                    for k, v in m.items():
                        if k.endswith("_min"):  # a minimum over the micro-batches that report one
                            stats[k] = min(stats.get(k, v), v)
                        else:
                            stats[k] += v * weight  # summed over micro-batches, averaged over ranks
                metrics[f"{prefix}/grad_norm"].append(self._optimizer_step())
                for k, v in stats.items():
                    metrics[f"{prefix}/{k}"].append(v)
        out = {k: reduce_metric(k, v) for k, v in metrics.items()}
        out[f"{prefix}/lr"] = self.optimizer.param_groups[0]["lr"]  # the rate this update used
        self.scheduler.step()  # once per training step, so warmup_steps counts steps
        return out

    @register("all")
    def save_checkpoint(self, path: str) -> None:
        """Model + optimizer + lr scheduler + RNG, sharded per rank; see fsdp.save_checkpoint.
        With LoRA only the trainable parameters (the adapters) are saved."""
        fsdp.save_checkpoint(path, self.model, self.optimizer, {"scheduler": self.scheduler.state_dict()},
                             adapter_only=self.lora is not None)

    @register("all")
    def load_checkpoint(self, path: str) -> None:
        extra = fsdp.load_checkpoint(path, self.model, self.optimizer, adapter_only=self.lora is not None)
        self.scheduler.load_state_dict(extra["scheduler"])

    def rollout_weights(self):
        """What a rollout engine loads, without a copy: the model's own tensors on its device (a DTensor is
        gathered by the engine, one at a time); with LoRA, the merged base weights (get_full_state_dict).
        A CPU round trip of every weight cost 12-13 s a step at 3B on an H200 (docs/results/h200/decode_s5)."""
        if self.lora is not None:
            return self.get_full_state_dict()
        return self.model.state_dict()

    @register("all")
    def get_full_state_dict(self) -> dict[str, torch.Tensor]:
        """Unsharded CPU weights on every rank (to sync a rollout engine); LoRA adapters merged in,
        so the names and shapes are the base model's."""
        return merge_state_dict(self.model, fsdp.full_state_dict(self.model))
