"""hf_static with continuous batching: StaticRollout's model code over per-episode cache slots.

`StaticRollout.generate` decodes a batch in lockstep (one shared cache column per step).
Here every slot is one row of its own cache (slots, kv_heads, max_len + 1, head_dim) with
its own length, so requests join and leave between steps (`slot_engine.SlotEngine`
schedules them) and a later turn of an episode finds its earlier context still cached:

- start: prefill only the tokens after what the slot holds (queries at their true
  positions attend to the cached columns and causally to each other), sample token 0; the
  requests that join at one boundary are prefilled together, right-padded, in one forward;
- decode step: every slot feeds its token at its own column `pos` (rotary position =
  column: a slot has no padding), attends over [0, pos], samples with its own uniform;
  slots without a request write to a scratch column (max_len) and do not advance. The step
  touches device tensors only, so on CUDA it is captured as a graph per (span, sampling
  rule) and replayed; on CPU it runs eagerly.

`generate` (the batch path) is StaticRollout's, unchanged; new weights or sleep empty the slots.
"""
from __future__ import annotations

import math

import torch
import torch.nn.functional as F

from .base import GenOutput, SamplingParams
from .slot_engine import SlotEngine
from .static_rollout import StaticRollout, sample_and_logprob


class SlotRollout(StaticRollout):
    """RolloutBackend and AsyncRolloutBackend: batch `generate` plus continuous `generate_one`."""

    def __init__(self, model, tokenizer, *args, slot_chunk: int = 8, n_slots: int | None = None, **kwargs):
        super().__init__(model, tokenizer, *args, **kwargs)
        self.n_slots = n_slots or self.max_batch_size
        self.max_len = self.max_model_len
        self._sl: dict | None = None
        self._slot_graphs: dict = {}
        self._fused_ok = False  # both paths' buffers share one fusing of the weights per wake
        self._host_pos = [0] * self.n_slots
        self._host_active = [False] * self.n_slots
        self.engine = SlotEngine(self, tokenizer, self.eos_ids, chunk=slot_chunk, vocab_size=self.vocab_size)

    # ---- AsyncRolloutBackend ----------------------------------------------------------------

    async def generate_one(self, prompt_ids: list[int], sampling: SamplingParams) -> GenOutput:
        if self._asleep:
            raise RuntimeError("SlotRollout.generate_one called while asleep: call wake() first")
        return await self.engine.generate_one(prompt_ids, sampling)

    def release(self, context_ids: list[int]) -> None:
        self.engine.release(context_ids)

    def update_weights(self, state_dict) -> None:
        super().update_weights(state_dict)
        self.engine.forget()  # the cached keys/values came from the old weights

    def sleep(self) -> None:
        self._sl, self._slot_graphs = None, {}
        self.engine.forget()
        super().sleep()
        self._fused_ok = False  # the weights moved: fuse again on first use

    def _fuse_weights(self) -> None:
        # The batch path fuses whenever its buffers are (re)made; doing it again while the slots'
        # graphs point at the fused tensors would leave them reading stale copies.
        if not self._fused_ok:
            super()._fuse_weights()
            self._fused_ok = True

    # ---- buffers ----------------------------------------------------------------------------

    def _slot_buffers(self) -> dict:
        if self._sl is None:
            self._fuse_weights()
            S, L, dev = self.n_slots, self.max_len, self.device
            dtype = self.model.get_input_embeddings().weight.dtype
            shape = (S, self.n_kv, L + 1, self.head_dim)  # column L: scratch for slots without a request
            layers = len(self.model.model.layers)
            self._sl = {
                "k": [torch.zeros(shape, dtype=dtype, device=dev) for _ in range(layers)],
                "v": [torch.zeros(shape, dtype=dtype, device=dev) for _ in range(layers)],
                "tok": torch.zeros(S, dtype=torch.long, device=dev),     # token fed at the next step
                "pos": torch.zeros(S, dtype=torch.long, device=dev),     # its column = rotary position
                "nstep": torch.zeros(S, dtype=torch.long, device=dev),   # index of the next sampled token
                "active": torch.zeros(S, dtype=torch.bool, device=dev),
                "u": torch.zeros(S, L, dtype=torch.float32, device=dev),
                "out": torch.zeros(S, L, dtype=torch.long, device=dev),
                "out_lp": torch.zeros(S, L, dtype=torch.float32, device=dev),
                "arange": torch.arange(L + 1, device=dev),
                "slots": torch.arange(S, device=dev),
                "mask_bias": torch.zeros(S, L, dtype=torch.float32, device=dev),
                "window_bias": torch.zeros(S, L, dtype=torch.float32, device=dev),
                "past_end": torch.full((1,), L + 1, device=dev),  # the Triton kernel's empty generated range
            }
            self._host_pos = [0] * S
            self._host_active = [False] * S
        return self._sl

    # ---- SlotRunner -------------------------------------------------------------------------

    def start(self, slot: int, ids: list[int], reuse: int, sampling: SamplingParams, u: torch.Tensor) -> None:
        """Prefill ids[reuse:] into the slot after its `reuse` cached tokens; sample the first token."""
        self.start_many([(slot, ids, reuse, u)], sampling)

    @torch.inference_mode()
    def start_many(self, reqs: list[tuple[int, list[int], int, torch.Tensor]], sampling: SamplingParams) -> None:
        """`start` for several (slot, ids, reuse, uniforms) at once: one forward per group of rows whose
        (rows x longest context) fits `prefill_tokens`, rows right-padded to the longest new part."""
        order = sorted(reqs, key=lambda r: -len(r[1]))
        while order:
            width = len(order[0][1])
            take = max(1, self.prefill_tokens // max(width, 1))
            self._prefill_rows(order[:take], sampling)
            order = order[take:]

    def _prefill_rows(self, reqs, sampling: SamplingParams) -> None:
        st, dev, L = self._slot_buffers(), self.device, self.max_len
        rows = len(reqs)
        news = [ids[reuse:] for _, ids, reuse, _ in reqs]
        N, T = max(map(len, news)), max(len(ids) for _, ids, _, _ in reqs)
        x = torch.full((rows, N), self.pad_id, dtype=torch.long)          # (rows, N), right-padded
        for r, new in enumerate(news):
            x[r, :len(new)] = torch.tensor(new)
        x = x.to(dev)
        slot = torch.tensor([r[0] for r in reqs], device=dev)               # (rows,)
        reuse = torch.tensor([r[2] for r in reqs], device=dev)              # (rows,)
        n = torch.tensor([len(new) for new in news], device=dev)            # (rows,)
        i = st["arange"][:N]
        pos = reuse[:, None] + i[None, :]                                   # (rows, N): true positions
        write = torch.where(i[None, :] < n[:, None], pos, L)                # padding writes to the scratch column
        back = pos[:, :, None] - st["arange"][None, None, :T]               # (rows, N, T): query pos - key pos
        causal = (back >= 0)[:, None]                                       # (rows, 1, N, T)
        window = causal & (back < self.window)[:, None] if self.window is not None else causal

        def attend(li, q, k, v):  # q (rows, heads, N, D); k, v (rows, kv, N, D)
            kc, vc = st["k"][li], st["v"][li]
            kc[slot[:, None], :, write] = k.transpose(1, 2)                 # (rows, N, kv, D) into each slot
            vc[slot[:, None], :, write] = v.transpose(1, 2)
            mask = window if self.layer_types[li] == "sliding_attention" else causal
            return F.scaled_dot_product_attention(q, kc[slot, :, :T], vc[slot, :, :T], attn_mask=mask,
                                                  scale=self.scaling, enable_gqa=True)

        h = self._layers(self.model.model.embed_tokens(x), pos, attend)    # (rows, N, hidden)
        for s, _, _, u in reqs:
            st["u"][s, :len(u)] = u.to(dev)
        last = h[torch.arange(rows, device=dev), n - 1]                     # (rows, hidden)
        tok, lp = sample_and_logprob(self._logits(last), st["u"][slot, 0], sampling, self._sums)
        st["out"][slot, 0] = tok
        if lp is not None:
            st["out_lp"][slot, 0] = lp[:, 0]
        st["tok"][slot], st["pos"][slot], st["nstep"][slot] = tok, reuse + n, 1
        st["active"][slot] = True
        for s, ids, _, _ in reqs:
            self._host_pos[s], self._host_active[s] = len(ids), True

    @torch.inference_mode()
    def stop(self, slot: int) -> None:
        self._sl["active"][slot] = False
        self._host_active[slot] = False

    @torch.inference_mode()
    def steps(self, n: int, sampling: SamplingParams) -> None:
        live = [p for p, a in zip(self._host_pos, self._host_active) if a]
        if not live or n < 1:
            return
        # the last token fed in these n steps sits at column max(pos) + n - 1 < span
        span = min(self.max_len, math.ceil((max(live) + n) / self.bucket) * self.bucket)
        step = self._slot_step_fn(span, sampling)
        for _ in range(n):
            step()
        self._host_pos = [p + n if a else p for p, a in zip(self._host_pos, self._host_active)]

    @torch.inference_mode()
    def read(self, slots: list[int], starts: list[int]) -> list[tuple[list[int], list[float]]]:
        st = self._sl
        ns = st["nstep"].tolist()
        lo, hi = min(starts), min(self.max_len, max(ns[s] for s in slots))
        rows = torch.tensor(slots, device=self.device)
        toks = st["out"][rows, lo:hi].tolist()
        lps = st["out_lp"][rows, lo:hi].tolist()
        return [(toks[i][s0 - lo:ns[s] - lo], lps[i][s0 - lo:ns[s] - lo])
                for i, (s, s0) in enumerate(zip(slots, starts))]

    # ---- one decode step over all slots (the graph body) ------------------------------------

    def _slot_decode_step(self, span: int, sampling: SamplingParams) -> None:
        st, L = self._sl, self.max_len
        triton = self._triton_attn is not None
        if triton:  # a slot attends columns [0, pos]: the kernel's prompt range, with no generated range
            upto = st["pos"] + 1                                                # (slots,)
        else:
            cols = st["arange"][:span]
            allowed = cols[None, :] <= st["pos"][:, None]                      # (slots, span)
            st["mask_bias"][:, :span] = torch.where(allowed, 0.0, float("-inf"))
            if self.window is not None:
                near = st["pos"][:, None] - cols[None, :] < self.window
                st["window_bias"][:, :span] = torch.where(allowed & near, 0.0, float("-inf"))
        write = torch.where(st["active"] & (st["pos"] < L), st["pos"], L)      # (slots,) cache column

        def attend(i, q, k, v):
            kc, vc = st["k"][i], st["v"][i]
            kc[st["slots"], :, write] = k[:, :, 0]
            vc[st["slots"], :, write] = v[:, :, 0]
            sliding = self.layer_types[i] == "sliding_attention"
            if triton:
                return self._triton_attn(q, kc, vc, upto, st["pos"], st["past_end"], st["past_end"], span,
                                         self.scaling, self.window if sliding else None)
            bias = st["window_bias" if sliding else "mask_bias"]
            return self._attn(q, kc[:, :, :span], vc[:, :, :span], bias[:, None, None, :span], self.scaling)

        h = self.model.model.embed_tokens(st["tok"][:, None])                  # (slots, 1, hidden)
        h = self._layers(h, st["pos"][:, None], attend)
        idx = st["nstep"].clamp(max=L - 1)[:, None]                            # (slots, 1)
        tok, lp = sample_and_logprob(self._logits(h[:, -1]), st["u"].gather(1, idx).squeeze(1), sampling, self._sums)
        st["out"].scatter_(1, idx, tok[:, None])
        if lp is not None:
            st["out_lp"].scatter_(1, idx, lp)
        st["tok"].copy_(tok)
        step = st["active"].long()
        st["pos"].add_(step)
        st["nstep"].add_(step)

    def _slot_step_fn(self, span: int, sampling: SamplingParams):
        if not self.cuda_graph:
            return lambda: self._slot_decode_step(span, sampling)
        key = (span, sampling.is_greedy, sampling.temperature, sampling.top_k, sampling.top_p,
               sampling.return_logprobs)
        graph = self._slot_graphs.get(key)
        if graph is None:
            st = self._sl
            saved = {k: st[k].clone() for k in ("tok", "pos", "nstep")}
            side = torch.cuda.Stream()
            side.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(side):  # warm-up outside capture
                self._slot_decode_step(span, sampling)
            torch.cuda.current_stream().wait_stream(side)
            for k, v in saved.items():  # the warm-up advanced the state: undo it
                st[k].copy_(v)
            graph = torch.cuda.CUDAGraph()
            # thread_local: an off-policy rollout captures in its own thread while the update runs in another
            with torch.cuda.graph(graph, pool=self._slot_graphs.get("pool"), capture_error_mode="thread_local"):
                self._slot_decode_step(span, sampling)
            self._slot_graphs.setdefault("pool", graph.pool())
            self._slot_graphs[key] = graph
        return graph.replay
