"""The policy worker (role "actor", or "ref" for the frozen reference): log-probs and the PPO update.

Data-parallel: each rank holds 1/world_size of every batch; under world_size > 1 the
model is sharded with FSDP2, with one process it is the plain module. Losses are
weighted so that any split over ranks and micro-batches gives the gradient of the whole
mini-batch loss (see micro_batch.loss_units). `meta["temperature"]` (default 1.0)
divides the logits, so log-probs match the distribution the rollout sampled from.
"""
from __future__ import annotations

import contextlib
import math
import warnings
from collections import defaultdict

import numpy as np
import torch
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.tensor import DTensor
from transformers import AutoModelForCausalLM, AutoTokenizer

from verl.algos.logprob import chunked_logprobs
from verl.algos.losses import agg_loss, entropy_from_logits, kl_loss, logprobs_from_logits, policy_loss
from verl.protocol import DataProto
from verl.single_controller.base import Worker, register
from verl.workers import fsdp
from verl.workers.config import WorkerConfig
from verl.workers.lora import adapters_disabled, apply_lora, as_lora_config, merge_state_dict, trainable_parameters
from verl.workers.micro_batch import (SEQ_KEYS, loss_units, make_micro_batches, pack_rows, pad_response,
                                      response_logit_index, split_rows, trim_padding)
from verl.workers.model_loader import PACKED_ATTENTION, compile_decoder_layers, load_model, to_dtype


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
        if self.trainable:
            # The fused (one-kernel) AdamW on one GPU; sharded DTensor parameters keep the default
            # multi-tensor path, the one that the multi-process tests exercise.
            fused = self.device.type == "cuda" and self.world_size == 1
            t = self.train_cfg
            self.optimizer = torch.optim.AdamW(trainable_parameters(model), lr=t.lr, betas=tuple(t.betas),
                                               weight_decay=t.weight_decay, fused=fused or None)
            # critic.warmup_steps holds the actor back instead; the critic's lr has no warmup
            warmup = t.warmup_steps if self.role == "actor" else 0
            self.scheduler = torch.optim.lr_scheduler.LambdaLR(
                self.optimizer, lambda step: min(1.0, (step + 1) / warmup) if warmup > 0 else 1.0)

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
        else:
            warnings.warn(f"rank {self.rank}: gradient norm is {norm}; skipping this optimizer step")
            self.optimizer.zero_grad(set_to_none=True)
        return norm

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

    @register("all")
    def get_full_state_dict(self) -> dict[str, torch.Tensor]:
        """Unsharded CPU weights on every rank (to sync a rollout engine); LoRA adapters merged in,
        so the names and shapes are the base model's."""
        return merge_state_dict(self.model, fsdp.full_state_dict(self.model))


class ActorWorker(FSDPWorker):
    def __init__(self, config: WorkerConfig, role: str = "actor"):
        if role not in ("actor", "ref"):
            raise ValueError(f"ActorWorker role must be 'actor' or 'ref', got {role!r}")
        super().__init__(config, role)

    def _log_prob(self, mb: DataProto, temperature: float, with_entropy: bool):
        """(log p(response token), entropy or None), each (batch, response_len), 0 on padding."""
        cfg = self.config.actor
        if cfg.logprob_chunk_size is None and not cfg.use_remove_padding:
            return self._log_prob_full_vocab(mb, temperature, with_entropy)
        resp_len = mb.batch["responses"].shape[1]
        keep = resp_len
        if not cfg.use_remove_padding:
            mb, keep = trim_padding(mb)
        kwargs, index, real = self._inputs(mb, keep)
        labels = mb.batch["responses"][:, :keep][real]  # (n,)
        head = self.model.get_output_embeddings()
        text_cfg = self.model.config.get_text_config()
        softcap = getattr(text_cfg, "final_logit_softcapping", None)  # applied to the logits in the chunks

        def head_forward(hidden):  # (batch, seq, hidden) or (1, total, hidden)
            # Under autocast the head's matmul runs in the compute dtype: cast the weight once, not per chunk.
            weight = head.weight if self.autocast_dtype is None else head.weight.to(self.autocast_dtype)
            lp, ent = chunked_logprobs(hidden.reshape(-1, hidden.shape[-1])[index], weight, labels, head.bias,
                                       temperature, with_entropy, cfg.logprob_chunk_size or max(len(labels), 1),
                                       softcap)
            return torch.stack([lp, ent]) if with_entropy else lp[None]  # (1 or 2, n)

        # The head runs inside the model's forward because FSDP2 gathers its (root-level) weight
        # only there; swapped in, it returns per-token log-probs where the logits would be. The
        # model must then not soft-cap what it takes for logits (Gemma 2): the chunks did.
        head.forward = head_forward
        if softcap:
            text_cfg.final_logit_softcapping = None
        try:
            with self._autocast():
                scores = self.model(**kwargs, use_cache=False, logits_to_keep=0).logits  # (1 or 2, n)
        finally:
            del head.forward
            if softcap:
                text_cfg.final_logit_softcapping = softcap
        logp, entropy = scores[0], (scores[1] if with_entropy else None)
        zeros = torch.zeros(real.shape, device=logp.device)  # (batch, keep)
        logp = pad_response(zeros.index_put((real,), logp), resp_len)
        if with_entropy:
            entropy = pad_response(zeros.index_put((real,), entropy), resp_len)
        return logp, entropy

    def _log_prob_full_vocab(self, mb: DataProto, temperature: float, with_entropy: bool):
        """The reference path: padded rows, (batch, kept, vocab) float32 logits."""
        resp_len = mb.batch["responses"].shape[1]
        mb, keep = trim_padding(mb)
        with self._autocast():
            out = self.model(input_ids=mb.batch["input_ids"], attention_mask=mb.batch["attention_mask"],
                             position_ids=mb.batch["position_ids"], use_cache=False, logits_to_keep=keep + 1)
        # Position t's logits predict token t+1: the last keep+1 positions score the kept response.
        logits = out.logits[:, -keep - 1 : -1].float() / temperature  # (batch, keep, vocab)
        real = mb.batch["attention_mask"][:, -keep:]  # (batch, keep)
        logp = logprobs_from_logits(logits, mb.batch["responses"]) * real
        entropy = entropy_from_logits(logits) * real if with_entropy else None
        return pad_response(logp, resp_len), (pad_response(entropy, resp_len) if with_entropy else None)

    @register("dp")
    def compute_log_prob(self, data: DataProto) -> DataProto:
        """`old_log_probs` (and `entropys` if meta["calculate_entropy"]) for the response tokens."""
        data = data.select(list(SEQ_KEYS) + ["responses"])
        temperature = data.meta.get("temperature", 1.0)
        with_entropy = bool(data.meta.get("calculate_entropy", False))
        n, resp_len = data.batch["responses"].shape
        logp = torch.zeros(n, resp_len)  # (batch, response_len)
        entropy = torch.zeros(n, resp_len) if with_entropy else None
        self.model.eval()
        with self._no_grad():
            for idx in self._micro_batches(data, no_grad=True):
                lp, ent = self._log_prob(data[idx].to(self.device), temperature, with_entropy)
                idx = torch.as_tensor(idx)
                logp[idx] = lp.cpu()  # back to the original row order
                if with_entropy:
                    entropy[idx] = ent.cpu()
        out = {"old_log_probs": logp} if entropy is None else {"old_log_probs": logp, "entropys": entropy}
        return DataProto.from_dict(out)

    @register("dp")
    def compute_ref_log_prob(self, data: DataProto) -> DataProto:
        """The same computation as compute_log_prob, returned as `ref_log_prob`. On a LoRA actor
        it runs with the adapters off: the reference policy is the base model, no second copy."""
        with adapters_disabled(self.model) if self.lora is not None else contextlib.nullcontext():
            return DataProto.from_dict({"ref_log_prob": self.compute_log_prob(data).batch["old_log_probs"]})

    @register("dp")
    def update_actor(self, data: DataProto) -> dict[str, float]:
        """PPO: epochs over mini-batches, one optimizer step per mini-batch, gradient
        accumulation over micro-batches. Needs old_log_probs, advantages (and ref_log_prob
        when actor.use_kl_loss)."""
        cfg = self.config.actor
        if not self.trainable:
            raise RuntimeError(f"update_actor called on a worker with role {self.role!r}")
        keys = list(SEQ_KEYS) + ["responses", "response_mask", "old_log_probs", "advantages"]
        keys += ["ref_log_prob"] if cfg.use_kl_loss else []
        keys += ["rollout_is_weights"] if "rollout_is_weights" in data.batch else []  # off-policy batches
        data = data.select(keys)
        temperature = data.meta.get("temperature", 1.0)
        use_entropy = cfg.entropy_coef != 0
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
                    logp, entropy = self._log_prob(mb, temperature, use_entropy)
                    # Masked positions may hold anything: keep it out of the graph (0 * inf is nan).
                    old = torch.where(mask, mb.batch["old_log_probs"], logp.detach())
                    adv = torch.where(mask, mb.batch["advantages"], 0.0)
                    w = mb.batch.get("rollout_is_weights")
                    loss, m = policy_loss(logp, old, adv, mask, cfg.clip_ratio_low, cfg.clip_ratio_high,
                                          cfg.dual_clip_c, cfg.loss_agg_mode,
                                          is_weights=None if w is None else torch.where(mask, w, 0.0))
                    m["pg_loss"] = loss.item()
                    if use_entropy:
                        ent = agg_loss(entropy, mask, cfg.loss_agg_mode)
                        loss = loss - cfg.entropy_coef * ent
                        m["entropy"] = ent.item()
                    if cfg.use_kl_loss:
                        ref = torch.where(mask, mb.batch["ref_log_prob"], logp.detach())
                        kl = kl_loss(logp, ref, mask, cfg.kl_loss_type, cfg.loss_agg_mode)
                        loss = loss + cfg.kl_loss_coef * kl
                        m["kl_loss"] = kl.item()
                    # This micro-batch's share of the global mini-batch loss; x world_size
                    # undoes the averaging of gradients over ranks in FSDP's reduce-scatter.
                    weight = loss_units(mask, cfg.loss_agg_mode) / max(total, 1) * self.world_size
                    (loss * weight).backward()
                    for k, v in m.items():
                        stats[k] += v * weight  # summed over micro-batches, averaged over ranks
                metrics["actor/grad_norm"].append(self._optimizer_step())
                for k, v in stats.items():
                    metrics[f"actor/{k}"].append(v)
        out = {k: float(np.mean(v)) for k, v in metrics.items()}
        out["actor/lr"] = self.optimizer.param_groups[0]["lr"]  # the rate this update used
        self.scheduler.step()  # once per training step, so warmup_steps counts steps
        return out

    @register("all")
    def export_hf(self, path: str, dtype: str | torch.dtype | None = None) -> None:
        """Rank 0 writes an HF model directory (config, safetensors, tokenizer) that from_pretrained loads;
        LoRA adapters are merged into the weights (a full model, no peft needed to load it)."""
        state = merge_state_dict(self.model, fsdp.full_state_dict(self.model, rank0_only=True))
        if self.rank == 0:
            with torch.device("meta"):  # structure only: the weights come from `state`
                skeleton = AutoModelForCausalLM.from_config(self.model.config)
            if dtype is not None:
                state = {k: v.to(to_dtype(dtype)) if v.is_floating_point() else v for k, v in state.items()}
            skeleton.save_pretrained(path, state_dict=state)
            tokenizer = self.config.tokenizer
            if isinstance(tokenizer, str):
                tokenizer = AutoTokenizer.from_pretrained(tokenizer)
            if tokenizer is None:
                warnings.warn(f"export_hf: no tokenizer configured; {path} holds the model only")
            else:
                tokenizer.save_pretrained(path)
        self.barrier()
