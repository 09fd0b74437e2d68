"""Rollout with plain transformers: our own batched, KV-cached decode loop (CPU or GPU).

Prompts are left-padded so every row's next token sits in the last column; the prompt is
run once (prefill) into a DynamicCache and then one token per step is fed (on the CPU the leading
tokens all prompts share, instruction and pool listing, run once and are broadcast to every row).
Rows that have finished keep receiving a masked pad token until the whole chunk is done.

Stop strings: a row stops at the first step where its generated text contains a stop
string. We keep whole tokens, so the stop string ends inside the last kept token (a token
that spans past the stop string is kept whole, as vLLM keeps it in `token_ids`).
"""
from __future__ import annotations

import contextlib
import os
from typing import Sequence

import torch
from transformers import DynamicCache

from verl.workers.model_loader import attention_layer_types, broadcast_cache, cache_keyword

from .base import GenOutput, SamplingParams, clean_names, full_tensor, validate_prompts


def filter_logits(logits: torch.Tensor, top_k: int, top_p: float) -> torch.Tensor:
    """Set logits outside the top-k and outside the top-p nucleus to -inf. logits: (batch, vocab)."""
    vocab = logits.shape[-1]
    if 0 < top_k < vocab:
        kth = torch.topk(logits, top_k, dim=-1).values[:, -1:]  # (batch, 1)
        logits = logits.masked_fill(logits < kth, float("-inf"))
    if top_p < 1.0:
        sorted_logits, order = torch.sort(logits, dim=-1, descending=True)  # (batch, vocab)
        probs = sorted_logits.softmax(-1)
        mass_before = probs.cumsum(-1) - probs  # mass of strictly more likely tokens
        # keep a token while the mass before it is < top_p: the token crossing top_p stays in
        sorted_logits = sorted_logits.masked_fill(mass_before >= top_p, float("-inf"))
        logits = torch.full_like(logits, float("-inf")).scatter(-1, order, sorted_logits)
    return logits


def pick(scores: torch.Tensor, sampling: SamplingParams, generator: torch.Generator | None) -> int:
    """One of a choice point's sequences by their log-probs (k,): the likeliest when greedy, else drawn in
    proportion to exp(score / temperature) (top-k and top-p do not apply to whole sequences)."""
    if sampling.is_greedy:
        return int(scores.argmax())
    probs = (scores / sampling.temperature).softmax(-1)
    return int(torch.multinomial(probs, 1, generator=generator))


def sample_next(logits: torch.Tensor, sampling: SamplingParams,
                generator: torch.Generator | None) -> torch.Tensor:
    """Pick one token per row from fp32 logits (batch, vocab) -> (batch,)."""
    if sampling.is_greedy:
        return logits.argmax(-1)
    logits = filter_logits(logits / sampling.temperature, sampling.top_k, sampling.top_p)
    # Inverse CDF: one uniform a row. torch.multinomial costs 40x more on the CPU at (32, 4k) (it draws per entry).
    cdf = logits.softmax(-1).cumsum(-1)  # (batch, vocab)
    u = torch.rand(cdf.shape[0], 1, generator=generator, device=cdf.device) * cdf[:, -1:]  # (batch, 1)
    # right=True: the first token whose cdf passes u, so a zero-probability token (a flat step) is never drawn
    return torch.searchsorted(cdf, u, right=True).squeeze(-1).clamp(max=cdf.shape[-1] - 1)


class StopChecker:
    """Finds stop strings at the end of a row's generated tokens without decoding every step.

    A stop string first appears with its last character inside the newest token, so we only
    decode a tail when the newest token could hold that character (a per-token-id verdict,
    cached). The tail is as many tokens as the longest stop string has bytes: every token
    decodes to at least one byte, so no occurrence can start before it.
    """

    def __init__(self, tokenizer, stops: Sequence[str]):
        self.tokenizer = tokenizer
        self.stops = tuple(stops)
        self.window = max(len(s.encode("utf-8")) for s in self.stops)
        self.final_chars = {s[-1] for s in self.stops}
        # decoders may strip or merge whitespace in a lone token: do not trust the prefilter then
        self.check_always = any(c.isspace() for c in self.final_chars)
        self._may_end: dict[int, bool] = {}

    def _decode(self, ids: list[int]) -> str:
        return self.tokenizer.decode(ids, skip_special_tokens=False, clean_up_tokenization_spaces=False)

    def may_end_stop(self, token_id: int) -> bool:
        verdict = self._may_end.get(token_id)
        if verdict is None:
            text = self._decode([token_id])
            # U+FFFD: a lone token holding part of a multi-byte character
            verdict = "\ufffd" in text or any(c in text for c in self.final_chars)
            self._may_end[token_id] = verdict
        return verdict

    def hit(self, generated: list[int]) -> bool:
        """True if the generated text (whose newest token is generated[-1]) now holds a stop string."""
        if not self.check_always and not self.may_end_stop(generated[-1]):
            return False
        tail = self._decode(generated[-self.window:])
        return any(s in tail for s in self.stops)


def _eos_ids(model, tokenizer) -> set[int]:
    ids: set[int] = set()
    for source in (tokenizer.eos_token_id, getattr(model.config, "eos_token_id", None),
                   getattr(getattr(model, "generation_config", None), "eos_token_id", None)):
        if isinstance(source, int):
            ids.add(source)
        elif isinstance(source, (list, tuple)):
            ids.update(int(i) for i in source)
    return ids


class HFRollout:
    """RolloutBackend over a transformers causal LM. The model is moved to `device`/`dtype` in place."""

    @property
    def lockstep_batches(self) -> bool:
        """Whole batches beat many small ones (env.schedule=auto plays sync): on the CPU this loop pays per call
        and per decode step, not per row (the card recipe's rollout: 2.40 s continuous, 0.91 s sync)."""
        return self.device.type == "cpu"

    def __init__(self, model, tokenizer, device: str | torch.device = "cpu", dtype: torch.dtype | None = None,
                 max_batch_size: int = 64, eos_token_ids: Sequence[int] | None = None):
        if max_batch_size < 1:
            raise ValueError(f"HFRollout: max_batch_size must be >= 1, got {max_batch_size}")
        self.device = torch.device(device)
        self.model = model.to(device=self.device, dtype=dtype) if dtype is not None else model.to(self.device)
        self.model.eval()
        self.tokenizer = tokenizer
        self.max_batch_size = max_batch_size
        self.eos_ids = set(eos_token_ids) if eos_token_ids is not None else _eos_ids(model, tokenizer)
        pad = tokenizer.pad_token_id
        self.pad_id = pad if pad is not None else (min(self.eos_ids) if self.eos_ids else 0)
        self.vocab_size = model.get_output_embeddings().weight.shape[0]
        self._cache_kw = cache_keyword(self.model)
        self._full_attention = attention_layer_types(self.model.config) == {"full_attention"}
        self._asleep = False
        # The engine decodes on a CUDA stream of its own: a rollout played ahead (off-policy) then never
        # queues the update's kernels behind its decode steps on the shared default stream (what is left
        # is host-side contention, as measured on the H200: docs/results.md). `_weights_ready` orders the
        # stream after the last copy of new weights.
        self._stream = torch.cuda.Stream(self.device) if self.device.type == "cuda" else None
        self._weights_ready: torch.cuda.Event | None = None

    # ---- RolloutBackend ----------------------------------------------------------------

    def generate(self, prompts: list[list[int]], sampling: SamplingParams) -> list[GenOutput]:
        """Generate one continuation per prompt; outputs come back in input order.

        Logprobs (if asked) are log-softmax of the raw logits (T=1, before top-k/top-p), as vLLM's default."""
        if self._asleep:
            raise RuntimeError("HFRollout.generate called while asleep: call wake() first")
        sampling.validate()
        validate_prompts(prompts, self.vocab_size)
        generator = None
        if sampling.seed is not None and not sampling.is_greedy:
            generator = torch.Generator(device=self.device).manual_seed(sampling.seed)
        stopper = StopChecker(self.tokenizer, sampling.stop) if sampling.stop else None
        # longest first, so each chunk holds prompts of similar length (less padding)
        order = sorted(range(len(prompts)), key=lambda i: -len(prompts[i]))
        results: list[GenOutput | None] = [None] * len(prompts)
        with self.on_own_stream():
            for start in range(0, len(order), self.max_batch_size):
                idx = order[start:start + self.max_batch_size]
                outs = self._generate_chunk([prompts[i] for i in idx], sampling, generator, stopper)
                for i, out in zip(idx, outs):
                    results[i] = out
        return results  # type: ignore[return-value]

    @contextlib.contextmanager
    def on_own_stream(self):
        """Run the enclosed GPU work on the engine's stream, after the last weight copy (no-op off CUDA).
        Results leave as Python lists, whose read-back waits for this stream alone."""
        if self._stream is None:
            yield
            return
        if self._weights_ready is not None:
            self._stream.wait_event(self._weights_ready)
        with torch.cuda.stream(self._stream):
            yield

    def _mark_weights_ready(self) -> None:
        """Record, on the caller's stream, that new weights are in place (the engine's stream waits for it)."""
        if self._stream is not None:
            self._weights_ready = torch.cuda.Event()
            self._weights_ready.record()

    def update_weights(self, state_dict: dict[str, torch.Tensor]) -> None:
        """Copy new weights into the model, one tensor at a time (each gathered and cast on its way in, so a
        sharded GPU state dict never sits whole anywhere); every parameter must be given, no unknown name."""
        names = clean_names(state_dict.keys())  # a clash of two keys raises here too
        # named_parameters drops tied duplicates (lm_head tied to embed_tokens): those may be absent
        required = {n for n, _ in self.model.named_parameters()}
        targets = self.model.state_dict(keep_vars=True)
        missing, unexpected = sorted(required - names.keys()), sorted(names.keys() - targets.keys())
        if missing or unexpected:  # checked on the names, before any weight changes
            raise KeyError(f"HFRollout.update_weights: state_dict does not match the model: "
                           f"missing {len(missing)} {missing[:8]}, unexpected {len(unexpected)} {unexpected[:8]}")
        with torch.no_grad():
            for name, key in names.items():  # in place: StaticRollout's fused q|k|v views stay current
                targets[name].copy_(full_tensor(state_dict[key]))
        self._mark_weights_ready()

    def sleep(self) -> None:
        """Move the weights to CPU when on an accelerator (the KV cache lives only inside generate)."""
        if self.device.type != "cpu" and not self._asleep:
            self.model.to("cpu")
            if self.device.type == "cuda":
                torch.cuda.empty_cache()
        self._asleep = True

    def wake(self) -> None:
        if self.device.type != "cpu" and self._asleep:
            self.model.to(self.device)
            self._mark_weights_ready()
        self._asleep = False

    # ---- the decode loop -----------------------------------------------------------------

    def _shared_prefix(self, prompts: list[list[int]]) -> int:
        """How many leading tokens every prompt shares (the instruction and listing), leaving each row at least one
        of its own; 0 for one row, a model with other than full-attention layers (a window would crop them) or off the
        CPU (a small policy is launch-bound on a GPU; its step was slower with this: docs/training.md)."""
        if len(prompts) < 2 or self.device.type != "cpu" or not self._full_attention:
            return 0
        return min(len(os.path.commonprefix(prompts)), min(len(p) for p in prompts) - 1)

    def _forward(self, input_ids, attention_mask, position_ids, cache, **kw) -> torch.Tensor:
        out = self.model(input_ids=input_ids, attention_mask=attention_mask, position_ids=position_ids,
                         use_cache=True, **{self._cache_kw: cache}, **kw)
        return out.logits[:, -1, :].float()  # (batch, vocab)

    def _constrain(self, logits: torch.Tensor, prompts: list[list[int]], tokens: list[list[int]],
                   reasons: list[str | None], forced: list[list[int]], sampling: SamplingParams,
                   generator: torch.Generator | None) -> torch.Tensor:
        """logits (batch, vocab) with each row that is writing a chosen sequence held to its next token. A row
        whose generated ids open a choice point first picks one of its sequences, scored in whole (pick)."""
        for row, generated in enumerate(tokens):
            if reasons[row] is not None:
                continue
            if not forced[row]:
                options = sampling.constraint.choices(generated)
                if options:
                    scores = self.sequence_logprobs(prompts[row] + generated, options)  # (k,)
                    forced[row] = list(options[pick(scores, sampling, generator)])
            if forced[row]:
                keep = torch.full_like(logits[row], float("-inf"))
                keep[forced[row].pop(0)] = 0.0
                logits[row] = logits[row] + keep
        return logits

    @torch.inference_mode()
    def sequence_logprobs(self, context: list[int], options: list[list[int]]) -> torch.Tensor:
        """(k,) log-prob of each option as the continuation of `context` (T=1, raw logits), one batched forward."""
        if not options or any(not o for o in options):
            raise ValueError("sequence_logprobs: every option must hold at least one token")
        rows = [context + o for o in options]
        width, keep = max(map(len, rows)), max(map(len, options)) + 1
        input_ids = torch.full((len(rows), width), self.pad_id, dtype=torch.long)  # (k, len)
        attention_mask = torch.zeros((len(rows), width), dtype=torch.long)        # (k, len)
        for i, r in enumerate(rows):
            input_ids[i, width - len(r):] = torch.tensor(r, dtype=torch.long)
            attention_mask[i, width - len(r):] = 1
        input_ids, attention_mask = input_ids.to(self.device), attention_mask.to(self.device)
        position_ids = (attention_mask.cumsum(-1) - 1).clamp(min=0)
        logits = self.model(input_ids=input_ids, attention_mask=attention_mask, position_ids=position_ids,
                            use_cache=False, logits_to_keep=keep).logits.float()  # (k, keep, vocab)
        logp = logits.log_softmax(-1)
        scores = []
        for i, o in enumerate(options):
            # column j predicts the token after it: option o's tokens sit in the last len(o) columns
            at = torch.arange(keep - 1 - len(o), keep - 1, device=logp.device)
            scores.append(logp[i, at, torch.tensor(o, device=logp.device)].sum())
        return torch.stack(scores)

    @torch.inference_mode()
    def _generate_chunk(self, prompts: list[list[int]], sampling: SamplingParams,
                        generator: torch.Generator | None, stopper: StopChecker | None) -> list[GenOutput]:
        batch, dev = len(prompts), self.device
        shared = self._shared_prefix(prompts)
        width = max(len(p) for p in prompts) - shared
        # The shared prefix's columns, then each row's rest left-padded: (batch, shared + width)
        input_ids = torch.full((batch, width), self.pad_id, dtype=torch.long)  # (batch, width): the rests
        attention_mask = torch.zeros((batch, shared + width), dtype=torch.long)
        attention_mask[:, :shared] = 1
        for row, p in enumerate(prompts):
            input_ids[row, width - len(p) + shared:] = torch.tensor(p[shared:], dtype=torch.long)
            attention_mask[row, shared + width - len(p) + shared:] = 1
        input_ids, attention_mask = input_ids.to(dev), attention_mask.to(dev)
        position_ids = (attention_mask.cumsum(-1) - 1).clamp(min=0)[:, shared:]  # (batch, width)
        next_pos = attention_mask.sum(-1, keepdim=True)                      # (batch, 1)

        cache = DynamicCache(config=self.model.config)
        if shared:  # once, batch 1, then broadcast: the rows' rests attend to one copy of its keys and values
            prefix = torch.tensor([prompts[0][:shared]], dtype=torch.long, device=dev)  # (1, shared)
            self._forward(prefix, torch.ones_like(prefix), torch.arange(shared, device=dev)[None], cache,
                          logits_to_keep=1)
            broadcast_cache(cache, batch, self.model.config.model_type)
        logits = self._forward(input_ids, attention_mask, position_ids, cache, logits_to_keep=1)

        tokens: list[list[int]] = [[] for _ in range(batch)]
        logprobs: list[list[float]] = [[] for _ in range(batch)]
        reasons: list[str | None] = [None] * batch
        forced: list[list[int]] = [[] for _ in range(batch)]  # a chosen sequence's tokens still to write
        alive = torch.ones(batch, dtype=torch.bool, device=dev)              # (batch,)
        for step in range(sampling.max_new_tokens):
            if sampling.constraint is not None:
                logits = self._constrain(logits, prompts, tokens, reasons, forced, sampling, generator)
            next_tok = sample_next(logits, sampling, generator)                # (batch,)
            next_tok = torch.where(alive, next_tok, torch.full_like(next_tok, self.pad_id))
            if sampling.return_logprobs:
                step_lp = torch.log_softmax(logits / sampling.logprob_temperature, -1)
                step_lp = step_lp.gather(-1, next_tok[:, None]).squeeze(-1).tolist()
            last_step = step == sampling.max_new_tokens - 1
            for row, (tok, is_alive) in enumerate(zip(next_tok.tolist(), alive.tolist())):
                if not is_alive:
                    continue
                tokens[row].append(tok)
                if sampling.return_logprobs:
                    logprobs[row].append(step_lp[row])
                if tok in self.eos_ids:
                    reasons[row] = "eos"
                elif stopper is not None and stopper.hit(tokens[row]):
                    reasons[row] = "stop"
                elif last_step:
                    reasons[row] = "length"
            if all(r is not None for r in reasons):
                break
            alive = torch.tensor([r is None for r in reasons], device=dev)
            # the fed token is real only for rows still generating; finished rows get a masked pad
            attention_mask = torch.cat([attention_mask, alive.long()[:, None]], dim=1)  # (batch, len+1)
            logits = self._forward(next_tok[:, None], attention_mask, next_pos, cache)
            next_pos = next_pos + 1
        return [GenOutput(token_ids=tokens[r], finish_reason=reasons[r],  # type: ignore[arg-type]
                          logprobs=logprobs[r] if sampling.return_logprobs else None)
                for r in range(batch)]
