"""The policy worker (role "actor", or "ref" for the frozen reference): log-probs and the PPO loss.

The update loop, the model and the optimizer are the FSDPWorker base's (fsdp_worker.py).
`meta["temperature"]` (required: the T the rollout sampled at) divides the logits, so old, new and
reference log-probs are those of the distribution the episodes were drawn from.
"""
from __future__ import annotations

import contextlib
import math
import warnings

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from verl.algos.logprob import chunked_logprobs
from verl.algos.losses import agg_loss, entropy_from_logits, kl_loss, logprobs_from_logits, policy_loss, token_nll
from verl.algos.masked import masked_mean
from verl.protocol import DataProto
from verl.single_controller.base import register
from verl.utils.export_manifest import write_manifest
from verl.workers import fsdp
from verl.workers.config import WorkerConfig
from verl.workers.fsdp_worker import FSDPWorker
from verl.workers.lora import adapters_disabled, merge_state_dict
from verl.workers.micro_batch import SEQ_KEYS, pad_response, trim_padding
from verl.workers.model_loader import to_dtype


def sampled_temperature(data: DataProto) -> float:
    """meta["temperature"], checked: a batch without it would silently be scored at T = 1."""
    t = data.meta.get("temperature")
    if t is None:
        raise ValueError("the batch's meta has no 'temperature': set it to the sampling temperature of its "
                         "episodes (PPOTrainer.to_batch does), or 1.0 for batches not sampled at another T")
    if not (isinstance(t, (int, float)) and 0 < t <= 2):
        raise ValueError(f"batch meta 'temperature' must be a number in (0, 2], got {t!r}")
    return float(t)


def name_floor_loss(names: torch.Tensor, at: torch.Tensor,
                    log_floor: float) -> tuple[torch.Tensor, torch.Tensor | None]:
    """algorithm.name_floor: sum over names of relu(log floor - log of the name's mean probability over the choice
    positions `at` (batch, len)), and those means (k,), None without choices; names (batch, len, k) log-probs. A floor on the mean, not at
    each position: a name may be ~0 where another is right, and dies only when it is ~0 everywhere; its gradient
    goes to the positions where the name is likeliest. (Per position, 0.02 for 6 names at T 0.7 fought the policy
    loss at every choice and one run's copies drifted until the format failed: docs/results/card_start.)"""
    if not at.any():
        return names.sum() * 0.0, None
    picked = names[at]  # (positions, k)
    log_mean = torch.logsumexp(picked, dim=0) - math.log(len(picked))  # (k,)
    return torch.relu(log_floor - log_mean).sum(), log_mean.detach().exp()


class ActorWorker(FSDPWorker):
    def __init__(self, config: WorkerConfig, role: str = "actor"):
        if role not in ("actor", "ref"):
            raise ValueError(f"ActorWorker role must be 'actor' or 'ref', got {role!r}")
        super().__init__(config, role)

    def _log_prob(self, mb: DataProto, temperature: float, with_entropy: bool, name_ids: torch.Tensor | None = None):
        """(log p(response token), entropy or None), each (batch, response_len), and with `name_ids` (k,) the
        log-probs of those tokens at every position, (batch, response_len, k), else None; 0 on padding."""
        cfg = self.config.actor
        if cfg.logprob_chunk_size is None and not cfg.use_remove_padding:
            return self._log_prob_full_vocab(mb, temperature, with_entropy, name_ids)
        resp_len = mb.batch["responses"].shape[1]
        keep = resp_len
        if not cfg.use_remove_padding:
            mb, keep = trim_padding(mb)
        kwargs, index, real = self._inputs(mb, keep)
        labels = mb.batch["responses"][:, :keep][real]  # (n,)
        k = 0 if name_ids is None else len(name_ids)
        if k:  # column 0 the response token, then the names: (n, 1 + k)
            labels = torch.cat([labels[:, None], name_ids.to(labels.device).expand(len(labels), k)], dim=1)
        head = self.model.get_output_embeddings()
        text_cfg = self.model.config.get_text_config()
        softcap = getattr(text_cfg, "final_logit_softcapping", None)  # applied to the logits in the chunks

        def head_forward(hidden):  # (batch, seq, hidden) or (1, total, hidden)
            # Under autocast the head's matmul runs in the compute dtype: cast the weight once, not per chunk.
            weight = head.weight if self.autocast_dtype is None else head.weight.to(self.autocast_dtype)
            lp, ent = chunked_logprobs(hidden.reshape(-1, hidden.shape[-1])[index], weight, labels, head.bias,
                                       temperature, with_entropy, cfg.logprob_chunk_size or max(len(labels), 1),
                                       softcap)
            rows = list(lp.T) if k else [lp]  # the response token's log-prob, then each name's
            return torch.stack(rows[:1] + ([ent] if with_entropy else []) + rows[1:])  # (1 [+1] + k, n)

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
        names = None
        if k:
            names = torch.zeros(*real.shape, k, device=logp.device).index_put((real,), scores[-k:].T)  # (batch, keep, k)
            names = pad_response(names, resp_len)  # (batch, response_len, k)
        return logp, entropy, names

    def _log_prob_full_vocab(self, mb: DataProto, temperature: float, with_entropy: bool,
                             name_ids: torch.Tensor | None = None):
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
        names = None
        if name_ids is not None and len(name_ids):
            names = (logits[..., name_ids.to(logits.device)] - logits.logsumexp(-1, keepdim=True)) * real[..., None]
            names = pad_response(names, resp_len)  # (batch, response_len, k)
        return pad_response(logp, resp_len), (pad_response(entropy, resp_len) if with_entropy else None), names

    @register("dp")
    def compute_log_prob(self, data: DataProto) -> DataProto:
        """`old_log_probs` (and `entropys` if meta["calculate_entropy"]) for the response tokens."""
        data = data.select(list(SEQ_KEYS) + ["responses"])
        temperature = sampled_temperature(data)
        with_entropy = bool(data.meta.get("calculate_entropy", False))
        n, resp_len = data.batch["responses"].shape
        logp = torch.zeros(n, resp_len)  # (batch, response_len)
        entropy = torch.zeros(n, resp_len) if with_entropy else None
        self.model.eval()
        with self._no_grad():
            for idx in self._micro_batches(data, no_grad=True):
                lp, ent, _ = self._log_prob(data[idx].to(self.device), temperature, with_entropy)
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
        token_bonus = "entropy_weights" in data.batch  # algorithm.decision_entropy_coef: a bonus on some tokens
        keys += ["entropy_weights"] if token_bonus else []
        keys += ["kl_weights"] if cfg.use_kl_loss and "kl_weights" in data.batch else []  # decision_kl_weight
        floor_on = "choice_mask" in data.batch  # algorithm.name_floor: the names' probability floor
        keys += ["choice_mask"] if floor_on else []
        data = data.select(keys)
        temperature = sampled_temperature(data)
        use_entropy = cfg.entropy_coef != 0 or token_bonus
        name_ids = torch.tensor(data.meta["name_ids"], dtype=torch.long) if floor_on else None
        log_floor = math.log(data.meta["name_floor"]) if floor_on else 0.0

        def micro_loss(mb: DataProto, mask: torch.Tensor):
            logp, entropy, names = self._log_prob(mb, temperature, use_entropy, name_ids)
            # Masked positions may hold anything: keep it out of the graph (0 * inf is nan).
            old = torch.where(mask, mb.batch["old_log_probs"], logp.detach())
            adv = torch.where(mask, mb.batch["advantages"], 0.0)
            w = mb.batch.get("rollout_is_weights")
            loss, m = policy_loss(logp, old, adv, mask, cfg.clip_ratio_low, cfg.clip_ratio_high,
                                  cfg.dual_clip_c, cfg.loss_agg_mode,
                                  is_weights=None if w is None else torch.where(mask, w, 0.0))
            m["pg_loss"] = loss.item()
            if cfg.entropy_coef != 0:
                ent = agg_loss(entropy, mask, cfg.loss_agg_mode)
                loss = loss - cfg.entropy_coef * ent
                m["entropy"] = ent.item()
            if token_bonus:  # aggregated over every policy token, as the policy loss is
                bonus = agg_loss(torch.where(mask, entropy * mb.batch["entropy_weights"], 0.0), mask,
                                 cfg.loss_agg_mode)
                loss = loss - bonus
                m["entropy_bonus"] = bonus.item()
            if floor_on:
                floor_loss, mean_p = name_floor_loss(names, mask & mb.batch["choice_mask"].bool(), log_floor)
                loss = loss + data.meta["name_floor_coef"] * floor_loss
                m["name_floor_loss"] = floor_loss.item()
                if mean_p is not None:  # the update's lowest; a micro-batch without choices has no mean to report
                    m["name_floor_mean_p_min"] = mean_p.min().item()
            if cfg.use_kl_loss:
                ref = torch.where(mask, mb.batch["ref_log_prob"], logp.detach())
                kl_w = mb.batch.get("kl_weights")
                kl = kl_loss(logp, ref, mask, cfg.kl_loss_type, cfg.loss_agg_mode,
                             weights=None if kl_w is None else torch.where(mask, kl_w, 0.0))
                loss = loss + cfg.kl_loss_coef * kl
                m["kl_loss"] = kl.item()
            return loss, m

        return self.ppo_update(data, micro_loss, "actor")

    @register("dp")
    def update_sft(self, data: DataProto) -> dict[str, float]:
        """trainer.mode=sft: the token-mean next-token loss on the tokens the policy wrote, through the same
        update loop as PPO. Right-padded rows: input_ids, attention_mask, and response_mask, here aligned
        with input_ids (batch, seq): 1 on policy tokens. actor.sft_context_loss_weight W adds W x the
        token-mean loss on the other real tokens (prompt, environment text)."""
        cfg = self.config.actor
        if not self.trainable:
            raise RuntimeError(f"update_sft called on a worker with role {self.role!r}")
        if cfg.use_remove_padding:
            raise ValueError("trainer.mode=sft runs on padded rows: set actor.use_remove_padding=false")
        weight = cfg.sft_context_loss_weight
        data = data.select(["input_ids", "attention_mask", "response_mask"])
        attn, policy = data.batch["attention_mask"].bool(), data.batch["response_mask"].bool()
        context = attn & ~policy  # (batch, seq)
        context[:, 0] = False  # the first token has no prediction
        # The loop weights each micro-batch by its share of the mini-batch's policy tokens; the context
        # term is a mean over other tokens, so each row carries its mini-batch's totals (over ranks) to
        # reweight it. With one micro-batch both factors are exactly 1.
        totals = torch.zeros(len(data), 2, dtype=torch.float64)  # (batch, [context, policy] tokens of the mini-batch)
        rows = self._mini_batch_rows()
        for start in range(0, len(data), rows):
            part = slice(start, start + rows)
            totals[part, 0] = self.all_reduce(int(context[part].sum()))
            totals[part, 1] = self.all_reduce(int(policy[part].sum()))
        data.batch["sft_token_totals"] = totals

        def micro_loss(mb: DataProto, mask: torch.Tensor):
            ids, attn = mb.batch["input_ids"], mb.batch["attention_mask"]
            with self._autocast():
                logits = self.model(input_ids=ids, attention_mask=attn, use_cache=False).logits  # (batch, seq, vocab)
            nll = token_nll(logits, ids)  # (batch, seq)
            loss = masked_mean(nll, mask)
            m = {"sft_loss": loss.item()}
            if weight > 0:
                # Prompt and environment text repeat names across the sequence (question -> route,
                # reply -> answer): predicting it trains the copying the policy needs far sooner than
                # policy tokens alone. RL never trains those tokens, so nothing is lost there.
                ctx = attn.bool() & ~mask  # (batch, seq)
                ctx[:, 0] = False
                context_loss = masked_mean(nll, ctx)
                context_total, policy_total = mb.batch["sft_token_totals"][0].tolist()
                share = (int(ctx.sum()) / max(context_total, 1.0)) * (policy_total / max(int(mask.sum()), 1))
                loss = loss + weight * (context_loss * share)
                m["context_loss"] = context_loss.item() * share
            return loss, m

        return self.ppo_update(data, micro_loss, "actor")

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
            write_manifest(path)  # last: load_policy checks every file against it
        self.barrier()
