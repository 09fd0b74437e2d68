"""Fast transformers rollout: a static KV cache, a decode step replayed as a CUDA graph.

`HFRollout` runs the model's own forward per token over a growing DynamicCache and reads
every token back to Python, so at batch 256 the GPU mostly waits for the CPU. Here the
weights stay the HF model's (q|k|v and gate|up are concatenated once and the parameters
become views into them: no copy, and `update_weights` works unchanged), but the forward
is ours, for Llama/Qwen2-shaped decoders (Llama 3.x rope scaling and tied embeddings included),
Qwen3 (per-head q/k norms) and Gemma 3 (its norms, GELU, two rope bases and sliding-window layers,
which get a second decode mask):

- the KV cache is one preallocated buffer per layer, (rows, kv_heads, max_len, head_dim);
  a row's prompt fills columns [0, its length) of the batch's prompt width W, generated
  token t goes to column W + t for every row, so a decode step writes one column for all
  rows and attends over a fixed-size prefix (a "bucket" of 128 columns) with a mask;
- one decode step (embed -> layers -> logits -> sample -> write the token) touches only
  device tensors, so it is captured once per (rows, bucket, sampling rule) as a CUDA graph
  and replayed; the step counter and column live on the device and advance inside it; the
  row count is rounded up to a power of two so a multi-turn rollout needs few graphs;
- sampling uses one uniform per row and step, drawn before the chunk (inverse CDF over the
  filtered softmax): the same distribution as `torch.multinomial`, no RNG inside the graph;
  without top-k/top-p the CDF is walked in two levels (block masses, then one block), so no
  vocabulary-wide cumsum runs per step;
- tokens come back to the CPU in chunks of `chunk` steps; stop strings and eos are checked
  there, one chunk behind the GPU, which meanwhile decodes the next chunk. Rows that have
  finished keep decoding until the whole batch is done (their extra tokens are dropped);
- with `compile=True` (rollout.compile) the per-layer functions below are torch.compile'd, which
  fuses the elementwise work between the matmuls; the graphs then replay the compiled kernels;
- the decode attention is one split-K Triton kernel on CUDA (triton_decode_attention: reads only the
  columns a row attends, no mask tensor, no scores round trip), or batched matmuls over the bucket with
  a -inf mask (`decode_attention="matmul"`, the CPU path).

On CPU the same step runs eagerly (the tests compare it with HFRollout token for token).
"""
from __future__ import annotations

import functools
import math

import torch
import torch.nn.functional as F

from .base import GenOutput, SamplingParams, refuse_constraint
from .hf_rollout import HFRollout, StopChecker, filter_logits

SUPPORTED_TYPES = ("llama", "qwen2", "qwen3", "gemma3_text")
STATIC_ROPE_TYPES = ("default", "linear", "llama3", "yarn")  # inv_freq does not depend on the length


def sample_from_uniform(logits: torch.Tensor, u: torch.Tensor, sampling: SamplingParams) -> torch.Tensor:
    """Inverse-CDF sampling: logits (batch, vocab), u (batch,) in [0, 1) -> token ids (batch,)."""
    if sampling.is_greedy:
        return logits.argmax(-1)
    probs = filter_logits(logits.float() / sampling.temperature, sampling.top_k, sampling.top_p).softmax(-1)
    cdf = probs.cumsum(-1)  # (batch, vocab)
    # right=True lands on the first token whose cdf exceeds u * total: never a zero-probability token
    idx = torch.searchsorted(cdf, (u * cdf[:, -1]).unsqueeze(-1), right=True).squeeze(-1)
    return idx.clamp_(max=logits.shape[-1] - 1)


SAMPLE_BLOCK = 1024  # vocabulary entries per block of the two-level inverse CDF


def block_sums(logits: torch.Tensor, temperature: float, block: int = SAMPLE_BLOCK):
    """Row max of logits / T (rows, 1) and the unnormalised probability mass of each block of `block`
    vocabulary entries (rows, blocks). One pass over the logits; the vocabulary is padded with -inf."""
    x = logits.float() / temperature
    x = F.pad(x, (0, -x.shape[-1] % block), value=float("-inf"))
    m = x.amax(-1, keepdim=True)
    return m, torch.exp(x - m).view(x.shape[0], -1, block).sum(-1)


def sample_two_level(logits: torch.Tensor, u: torch.Tensor, temperature: float, sums=block_sums):
    """Inverse-CDF sampling without a vocabulary-wide cumsum: find the block where u * total falls
    (cumsum over the block masses), then the token inside that block. The same distribution as
    sample_from_uniform without top-k/top-p. logits (rows, vocab), u (rows,) -> tokens (rows,),
    and (m, mass) for the log-prob."""
    rows, vocab = logits.shape
    m, mass = sums(logits, temperature)                                  # (rows, 1), (rows, blocks)
    cum = mass.cumsum(-1)                                                # (rows, blocks)
    target = u[:, None] * cum[:, -1:]                                    # (rows, 1)
    b = torch.searchsorted(cum, target, right=True).clamp_(max=cum.shape[1] - 1)  # (rows, 1) block index
    before = torch.where(b > 0, cum.gather(1, (b - 1).clamp(min=0)), 0.0)  # mass of the blocks before it
    cols = b * SAMPLE_BLOCK + torch.arange(SAMPLE_BLOCK, device=logits.device)  # (rows, block)
    inside = logits.gather(1, cols.clamp(max=vocab - 1)).float() / temperature
    inside = torch.exp(inside - m).masked_fill_(cols >= vocab, 0.0).cumsum(-1)  # (rows, block)
    j = torch.searchsorted(inside, target - before, right=True)
    # rounding between the two cumsums may put the target past the block's own total: stay on the
    # block's last token with mass (never a padded or zero-probability one)
    j = torch.minimum(j, (inside < inside[:, -1:]).sum(-1, keepdim=True))
    return (b * SAMPLE_BLOCK + j).squeeze(1).clamp_(max=vocab - 1), m, mass


def sample_and_logprob(logits: torch.Tensor, u: torch.Tensor, sampling: SamplingParams, sums=block_sums):
    """Token (rows,) and, when asked, its log-prob (rows, 1) under the unfiltered softmax of
    logits / T (sampling.logprob_temperature: what the actor recomputes), or None.
    logits: (rows, vocab) in the model's dtype. Unfiltered sampling takes the two-level path."""
    plain = not sampling.is_greedy and sampling.top_k <= 0 and sampling.top_p >= 1.0
    if not plain:
        tok = sample_from_uniform(logits, u, sampling)
        if not sampling.return_logprobs:
            return tok, None
        lp = torch.log_softmax(logits.float() / sampling.logprob_temperature, -1).gather(-1, tok[:, None])
        return tok, lp
    tok, m, mass = sample_two_level(logits, u, sampling.temperature, sums)
    if not sampling.return_logprobs:
        return tok, None
    # block_sums already normalised logits / T: its max and block masses give the log-partition
    picked = logits.gather(1, tok[:, None]).float() / sampling.temperature  # (rows, 1)
    return tok, picked - m - mass.sum(-1, keepdim=True).log()


def pre_attention(h, norm_w, eps: float, qkv_w, qkv_b, cos, sin, heads: int, kv_heads: int, linear=F.linear):
    """Norm, fused q|k|v projection, rotary on q and k. h: (rows, T, hidden); cos/sin: (rows, T, 1, D).

    Returns q (rows, heads, T, D) and k, v (rows, kv_heads, T, D)."""
    rows, T, _ = h.shape
    qkv = linear(F.rms_norm(h, h.shape[-1:], norm_w, eps), qkv_w, qkv_b)
    qkv = qkv.view(rows, T, heads + 2 * kv_heads, -1)  # (rows, T, heads + 2 kv, D)
    D = qkv.shape[-1]
    qk = qkv[:, :, :heads + kv_heads]  # rotary on queries and keys at once
    qk = qk * cos + torch.cat([-qk[..., D // 2:], qk[..., :D // 2]], dim=-1) * sin
    return qk[:, :, :heads].transpose(1, 2), qk[:, :, heads:].transpose(1, 2), qkv[:, :, heads + kv_heads:].transpose(1, 2)


def qk_norm_pre_attention(h, norm_w, eps: float, qkv_w, qkv_b, cos, sin, heads: int, kv_heads: int, q_norm_w,
                          k_norm_w, linear=F.linear):
    """Qwen3: as pre_attention, with an RMSNorm over each query and key head before the rotary."""
    rows, T, _ = h.shape
    qkv = linear(F.rms_norm(h, h.shape[-1:], norm_w, eps), qkv_w, qkv_b).view(rows, T, heads + 2 * kv_heads, -1)
    D = qkv.shape[-1]
    qk = torch.cat([F.rms_norm(qkv[:, :, :heads], (D,), q_norm_w, eps),
                    F.rms_norm(qkv[:, :, heads:heads + kv_heads], (D,), k_norm_w, eps)], dim=2)
    qk = qk * cos + torch.cat([-qk[..., D // 2:], qk[..., :D // 2]], dim=-1) * sin
    return qk[:, :, :heads].transpose(1, 2), qk[:, :, heads:].transpose(1, 2), qkv[:, :, heads + kv_heads:].transpose(1, 2)


def post_attention(h, o, o_w, o_b, norm_w, eps: float, gate_up_w, gate_up_b, down_w, down_b, linear=F.linear):
    """Output projection + residual, then the SiLU-gated MLP + residual. o: (rows, heads, T, D)."""
    rows, heads, T, D = o.shape
    h = h + linear(o.transpose(1, 2).reshape(rows, T, heads * D), o_w, o_b)
    gate, up = linear(F.rms_norm(h, h.shape[-1:], norm_w, eps), gate_up_w, gate_up_b).chunk(2, dim=-1)
    return h + linear(F.silu(gate) * up, down_w, down_b)


def gemma_norm(x, w, eps: float):
    """Gemma's RMSNorm: in float32, scaled by (1 + w), cast back."""
    xf = x.float()
    return (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps) * (1.0 + w.float())).type_as(x)


def gemma_pre_attention(h, norm_w, eps: float, qkv_w, qkv_b, cos, sin, heads: int, kv_heads: int, q_norm_w, k_norm_w,
                        linear=F.linear):
    """Gemma 3: norm, fused q|k|v projection, per-head norms of q and k, rotary. Shapes as pre_attention."""
    rows, T, _ = h.shape
    qkv = linear(gemma_norm(h, norm_w, eps), qkv_w, qkv_b).view(rows, T, heads + 2 * kv_heads, -1)
    D = qkv.shape[-1]
    qk = torch.cat([gemma_norm(qkv[:, :, :heads], q_norm_w, eps),
                    gemma_norm(qkv[:, :, heads:heads + kv_heads], k_norm_w, eps)], dim=2)
    qk = qk * cos + torch.cat([-qk[..., D // 2:], qk[..., :D // 2]], dim=-1) * sin
    return qk[:, :, :heads].transpose(1, 2), qk[:, :, heads:].transpose(1, 2), qkv[:, :, heads + kv_heads:].transpose(1, 2)


def gemma_post_attention(h, o, o_w, o_b, eps: float, post_attn_w, pre_ff_w, post_ff_w, gate_up_w, gate_up_b,
                         down_w, down_b, linear=F.linear):
    """Gemma 3: output projection, its own norm, residual; then norm, GELU(tanh)-gated MLP, norm, residual."""
    rows, heads, T, D = o.shape
    h = h + gemma_norm(linear(o.transpose(1, 2).reshape(rows, T, heads * D), o_w, o_b), post_attn_w, eps)
    gate, up = linear(gemma_norm(h, pre_ff_w, eps), gate_up_w, gate_up_b).chunk(2, dim=-1)
    return h + gemma_norm(linear(F.gelu(gate, approximate="tanh") * up, down_w, down_b), post_ff_w, eps)


def matmul_decode_attention(q, k, v, bias, scaling: float):
    """One new query per row over the cache. q: (rows, heads, 1, D); k, v: (rows, kv, span, D);
    bias (rows, 1, 1, span) float32: 0 where the row may attend, -inf elsewhere. Grouped query heads
    share their kv head without copying it: (rows, kv, g, D) @ (rows, kv, D, span)."""
    rows, heads, _, D = q.shape
    kv = k.shape[1]
    qg = q.reshape(rows, kv, heads // kv, D) * scaling
    scores = torch.matmul(qg, k.transpose(-1, -2)) + bias                      # (rows, kv, g, span)
    probs = torch.softmax(scores, -1, dtype=torch.float32).to(q.dtype)
    return torch.matmul(probs, v).reshape(rows, heads, 1, D)


DECODE_ATTENTION = ("auto", "triton", "matmul")
# torch.compile modes without CUDA graphs: the engine captures its own graph around the whole step
COMPILE_MODES = ("default", "max-autotune-no-cudagraphs")
DECODE_LINEAR = ("torch", "triton")


def resolve_decode_attention(choice: str, device: torch.device) -> str:
    """The decode attention to use: "auto" is the Triton kernel on CUDA when triton imports, else the matmul path."""
    if choice not in DECODE_ATTENTION:
        raise ValueError(f"rollout.decode_attention must be one of {DECODE_ATTENTION}, got {choice!r}")
    if choice != "auto":
        return choice
    if device.type != "cuda":
        return "matmul"
    try:
        import triton  # noqa: F401
    except ImportError:
        return "matmul"
    return "triton"


class StaticRollout(HFRollout):
    """RolloutBackend with a static KV cache and CUDA-graph decode (eager on CPU)."""

    bucket = 128  # attention spans a multiple of this many cache columns
    lockstep_batches = False  # its slots batch across episodes (SlotRollout's generate_one): auto stays continuous

    def __init__(self, model, tokenizer, device="cpu", dtype=None, max_batch_size: int = 256,
                 max_model_len: int = 4096, eos_token_ids=None, cuda_graph: bool = True, chunk: int = 16,
                 prefill_tokens: int = 32768, compile: bool = False, decode_attention: str = "auto",
                 compile_mode: str = "default", decode_linear: str = "torch"):
        cfg = model.config
        if cfg.model_type not in SUPPORTED_TYPES:
            raise ValueError(f"StaticRollout supports model_type {SUPPORTED_TYPES}, got {cfg.model_type!r}; "
                             "use rollout.name=hf")
        self.gemma = cfg.model_type == "gemma3_text"
        self.qk_norm = cfg.model_type == "qwen3"  # per-head RMSNorm of q and k (Gemma 3 has its own)
        rope = getattr(cfg, "rope_parameters", None) or getattr(cfg, "rope_scaling", None) or {}
        ropes = [rope[t] for t in sorted(set(cfg.layer_types))] if self.gemma else [rope]  # Gemma: one per layer type
        for r in ropes:
            if r.get("rope_type", r.get("type", "default")) not in STATIC_ROPE_TYPES:
                raise ValueError(f"StaticRollout: rope type {r.get('rope_type')!r} is not supported; use rollout.name=hf")
        act = cfg.hidden_activation if self.gemma else getattr(cfg, "hidden_act", "silu")
        if act != ("gelu_pytorch_tanh" if self.gemma else "silu"):
            raise ValueError(f"StaticRollout: activation {act!r} is not supported for {cfg.model_type}; use rollout.name=hf")
        if self.gemma and (cfg.attn_logit_softcapping or cfg.final_logit_softcapping):
            raise ValueError("StaticRollout: logit soft-capping is not supported; use rollout.name=hf")
        if getattr(cfg, "use_sliding_window", False):
            raise ValueError("StaticRollout: sliding-window attention is not supported; use rollout.name=hf")
        super().__init__(model, tokenizer, device=device, dtype=dtype, max_batch_size=max_batch_size,
                         eos_token_ids=eos_token_ids)
        self.max_model_len = max_model_len
        self.cuda_graph = cuda_graph and self.device.type == "cuda"
        self.round_rows = self.cuda_graph  # pad the row count to a power of two (fewer graphs)
        self.chunk = chunk
        self.prefill_tokens = prefill_tokens
        attn = model.model.layers[0].self_attn
        self.n_heads, self.n_kv = cfg.num_attention_heads, cfg.num_key_value_heads
        self.head_dim, self.scaling = attn.head_dim, attn.scaling
        self._state: dict | None = None  # cache and step buffers, allocated on first use
        self._fused: list[dict] = []  # per layer: qkv / gate_up weights that the HF parameters view
        self._graphs: dict = {}
        # torch.compile fuses the elementwise work between the matmuls (norms, rotary, residuals,
        # SiLU*up, the attention's scale/mask/softmax) and the sampler's pass over the logits; one
        # compiled graph serves every layer, since the layers' weights are arguments. The cache
        # writes stay eager (an in-place write into a graph input could be functionalised into a copy
        # of the cache); so do the sampler's small cumsums.
        if compile_mode not in COMPILE_MODES:
            raise ValueError(f"rollout.compile_mode must be one of {COMPILE_MODES}, got {compile_mode!r}")
        wrap = functools.partial(torch.compile, mode=compile_mode) if compile else (lambda f: f)
        pre, post = (gemma_pre_attention, gemma_post_attention) if self.gemma else (pre_attention, post_attention)
        pre = qk_norm_pre_attention if self.qk_norm else pre
        if decode_linear not in DECODE_LINEAR:
            raise ValueError(f"rollout.decode_linear must be one of {DECODE_LINEAR}, got {decode_linear!r}")
        if decode_linear == "triton":  # the layers' matmuls; the LM head already streams near the bandwidth
            from . import triton_decode_linear  # noqa: F401  registers torch.ops.verl.decode_linear
            pre = functools.partial(pre, linear=torch.ops.verl.decode_linear)
            post = functools.partial(post, linear=torch.ops.verl.decode_linear)
        self.decode_linear = decode_linear
        self._pre, self._post, self._attn = wrap(pre), wrap(post), wrap(matmul_decode_attention)
        self._sums = wrap(block_sums)
        # Gemma 3 alternates sliding-window layers (they see the last `window` positions) with full ones
        self.layer_types = list(cfg.layer_types) if self.gemma else ["full_attention"] * cfg.num_hidden_layers
        self.window = cfg.sliding_window if self.gemma else None
        self.decode_attention = resolve_decode_attention(decode_attention, self.device)
        self._triton_attn = None
        if self.decode_attention == "triton":  # triton is imported only where the kernel is used
            from .triton_decode_attention import triton_decode_attention
            self._triton_attn = triton_decode_attention

    # ---- buffers -----------------------------------------------------------------------

    def _fuse_weights(self) -> None:
        """Concatenate q|k|v and gate|up weights and make the HF parameters views into them.

        One matmul instead of three (two), no extra memory, and `update_weights` (which copies
        into the parameters in place) keeps the fused tensors current. `sleep` moves the
        parameters to new storage, so this runs again after every wake."""
        self._fused = []
        with torch.no_grad():
            for layer in self.model.model.layers:
                a, m = layer.self_attn, layer.mlp
                fused = {}
                for name, mods in (("qkv", (a.q_proj, a.k_proj, a.v_proj)), ("gate_up", (m.gate_proj, m.up_proj))):
                    for attr in ("weight", "bias"):
                        parts = [getattr(mod, attr) for mod in mods]
                        if any(p is None for p in parts):
                            fused[f"{name}_{attr}"] = None
                            continue
                        whole = torch.cat([p.data for p in parts])  # (sum of out features, ...)
                        start = 0
                        for p in parts:
                            p.data = whole[start:start + p.shape[0]]
                            start += p.shape[0]
                        fused[f"{name}_{attr}"] = whole
                self._fused.append(fused)

    def _buffers(self) -> dict:
        if self._state is None:
            self._fuse_weights()
            rows, cols, dev = self.max_batch_size, self.max_model_len, self.device
            dtype = self.model.get_input_embeddings().weight.dtype
            shape = (rows, self.n_kv, cols, self.head_dim)
            layers = len(self.model.model.layers)
            self._state = {
                "k": [torch.zeros(shape, dtype=dtype, device=dev) for _ in range(layers)],
                "v": [torch.zeros(shape, dtype=dtype, device=dev) for _ in range(layers)],
                "prompt_ok": torch.zeros(rows, cols, dtype=torch.bool, device=dev),  # real prompt columns
                "width": torch.zeros(1, dtype=torch.long, device=dev),   # prompt width W of this batch
                "col": torch.zeros(1, dtype=torch.long, device=dev),     # cache column of the fed token
                "step": torch.zeros(1, dtype=torch.long, device=dev),    # index of the next output token
                "tok": torch.zeros(rows, dtype=torch.long, device=dev),  # token fed at the next step
                "pos": torch.zeros(rows, dtype=torch.long, device=dev),  # its rotary position
                "u": torch.zeros(rows, cols, dtype=torch.float32, device=dev),  # uniforms per step
                "out": torch.zeros(rows, cols, dtype=torch.long, device=dev),   # sampled tokens
                "out_lp": torch.zeros(rows, cols, dtype=torch.float32, device=dev),
                "arange": torch.arange(cols, device=dev),
                "mask_bias": torch.zeros(rows, cols, dtype=torch.float32, device=dev),  # decode mask: 0 / -inf
                "window_bias": torch.zeros(rows, cols, dtype=torch.float32, device=dev),  # ... of sliding layers
                "len": torch.zeros(rows, dtype=torch.long, device=dev),   # prompt length per row
            }
        return self._state

    def sleep(self) -> None:
        """Free the KV cache and the graphs (they point into it), then move the weights off the GPU."""
        self._state, self._graphs = None, {}
        super().sleep()

    # ---- the model, our way ----------------------------------------------------------------

    def _rotary(self, pos: torch.Tensor, dtype, layer_type: str = "full_attention"):
        """cos, sin (rows, T, 1, head_dim) for positions pos (rows, T); Gemma has one rope per layer type."""
        rope = self.model.model.rotary_emb
        prefix = f"{layer_type}_" if self.gemma else ""
        inv_freq, scale = getattr(rope, prefix + "inv_freq"), getattr(rope, prefix + "attention_scaling")
        freqs = pos[..., None].float() * inv_freq.float()  # (rows, T, head_dim / 2)
        emb = torch.cat([freqs, freqs], dim=-1)[:, :, None]  # broadcast over heads
        return (emb.cos() * scale).to(dtype), (emb.sin() * scale).to(dtype)

    def _norm(self, x: torch.Tensor, norm) -> torch.Tensor:
        if self.gemma:
            return gemma_norm(x, norm.weight, norm.eps)
        return F.rms_norm(x, x.shape[-1:], norm.weight, norm.variance_epsilon)

    def _layers(self, h: torch.Tensor, pos: torch.Tensor, attend) -> torch.Tensor:
        """Run every decoder layer; `attend(layer_index, q, k, v)` does the cache write and attention.

        h: (rows, T, hidden); pos: (rows, T); q: (rows, heads, T, head_dim), k/v: (rows, kv, T, head_dim)."""
        rot = {t: self._rotary(pos, h.dtype, t) for t in set(self.layer_types)}
        for i, layer in enumerate(self.model.model.layers):
            w, a, m = self._fused[i], layer.self_attn, layer.mlp
            cos, sin = rot[self.layer_types[i]]
            if self.gemma:
                norm = layer.input_layernorm
                q, k, v = self._pre(h, norm.weight, norm.eps, w["qkv_weight"], w["qkv_bias"], cos, sin, self.n_heads,
                                    self.n_kv, a.q_norm.weight, a.k_norm.weight)
                o = attend(i, q, k, v)  # (rows, heads, T, head_dim)
                h = self._post(h, o, a.o_proj.weight, a.o_proj.bias, norm.eps, layer.post_attention_layernorm.weight,
                               layer.pre_feedforward_layernorm.weight, layer.post_feedforward_layernorm.weight,
                               w["gate_up_weight"], w["gate_up_bias"], m.down_proj.weight, m.down_proj.bias)
                continue
            qk_norms = (a.q_norm.weight, a.k_norm.weight) if self.qk_norm else ()
            q, k, v = self._pre(h, layer.input_layernorm.weight, layer.input_layernorm.variance_epsilon,
                                w["qkv_weight"], w["qkv_bias"], cos, sin, self.n_heads, self.n_kv, *qk_norms)
            o = attend(i, q, k, v)  # (rows, heads, T, head_dim)
            h = self._post(h, o, a.o_proj.weight, a.o_proj.bias, layer.post_attention_layernorm.weight,
                           layer.post_attention_layernorm.variance_epsilon, w["gate_up_weight"], w["gate_up_bias"],
                           m.down_proj.weight, m.down_proj.bias)
        return h

    def _logits(self, h_last: torch.Tensor) -> torch.Tensor:
        return self.model.lm_head(self._norm(h_last, self.model.model.norm))  # (rows, vocab), model dtype

    # ---- prefill: the prompt into the cache, eager, in row chunks ---------------------------------

    def _prefill(self, prompts: list[list[int]], width: int) -> torch.Tensor:
        """Write every prompt's keys/values into cache columns [0, width); returns last logits (rows, vocab).

        Prompts are right-padded here, so plain causal attention (the flash kernel, no mask) is
        exact for the real tokens; decode steps then mask the padding columns out."""
        st, dev = self._buffers(), self.device
        rows = len(prompts)
        ids = torch.full((rows, width), self.pad_id, dtype=torch.long)  # (rows, width), right-padded
        for r, p in enumerate(prompts):
            ids[r, :len(p)] = torch.tensor(p)
        ids = ids.to(dev)
        lengths = torch.tensor([len(p) for p in prompts], device=dev)   # (rows,)
        st["prompt_ok"][:rows].zero_()
        st["prompt_ok"][:rows, :width] = st["arange"][:width] < lengths[:, None]
        pos = st["arange"][:width].expand(rows, width)                   # (rows, width)
        window_mask = None  # sliding-window layers: a query sees the last `window` positions, itself included
        if self.window is not None and width > self.window:
            back = st["arange"][:width, None] - st["arange"][None, :width]  # (width, width)
            window_mask = (back >= 0) & (back < self.window)
        logits = []
        step = max(1, self.prefill_tokens // width)
        for r0 in range(0, rows, step):
            r1 = min(rows, r0 + step)

            def attend(i, q, k, v, r0=r0, r1=r1):
                st["k"][i][r0:r1, :, :width] = k
                st["v"][i][r0:r1, :, :width] = v
                if window_mask is not None and self.layer_types[i] == "sliding_attention":
                    return F.scaled_dot_product_attention(q, k, v, attn_mask=window_mask, scale=self.scaling,
                                                          enable_gqa=True)
                return F.scaled_dot_product_attention(q, k, v, is_causal=True, scale=self.scaling, enable_gqa=True)

            h = self._layers(self.model.model.embed_tokens(ids[r0:r1]), pos[r0:r1], attend)  # (n, width, hidden)
            last = h[torch.arange(r1 - r0, device=dev), lengths[r0:r1] - 1]  # (n, hidden)
            logits.append(self._logits(last))
        st["pos"][:rows] = lengths
        st["len"][:rows] = lengths
        st["width"].fill_(width)
        st["col"].fill_(width)
        st["step"].zero_()
        return torch.cat(logits)

    # ---- one decode step (the graph body) -------------------------------------------------------

    def _emit(self, logits: torch.Tensor, rows: int, sampling: SamplingParams) -> None:
        """Sample from logits (rows, vocab), record token and log-prob at `step`, feed the token next."""
        st = self._state
        u = st["u"][:rows].index_select(1, st["step"]).squeeze(1)        # (rows,)
        tok, lp = sample_and_logprob(logits, u, sampling, self._sums)         # (rows,), (rows, 1) or None
        st["out"][:rows].index_copy_(1, st["step"], tok[:, None])
        if lp is not None:
            st["out_lp"][:rows].index_copy_(1, st["step"], lp)
        st["tok"][:rows].copy_(tok)
        st["step"].add_(1)

    def _decode_step(self, rows: int, span: int, sampling: SamplingParams) -> None:
        """Feed `tok` at column `col`, attend over columns [0, span), emit the next token."""
        st = self._state
        if self._triton_attn is None:
            self._decode_masks(rows, span)

        def attend(i, q, k, v):
            kc, vc = st["k"][i][:rows], st["v"][i][:rows]
            kc.index_copy_(2, st["col"], k)
            vc.index_copy_(2, st["col"], v)
            sliding = self.layer_types[i] == "sliding_attention"
            if self._triton_attn is not None:
                return self._triton_attn(q, kc, vc, st["len"][:rows], st["pos"][:rows], st["width"], st["col"], span,
                                         self.scaling, self.window if sliding else None)
            bias = st["window_bias" if sliding else "mask_bias"]
            return self._attn(q, kc[:, :, :span], vc[:, :, :span], bias[:rows, None, None, :span], self.scaling)

        h = self.model.model.embed_tokens(st["tok"][:rows, None])         # (rows, 1, hidden)
        h = self._layers(h, st["pos"][:rows, None], attend)
        self._emit(self._logits(h[:, -1]), rows, sampling)
        st["pos"][:rows].add_(1)
        st["col"].add_(1)

    def _decode_masks(self, rows: int, span: int) -> None:
        """The matmul path's -inf biases over columns [0, span): the row's prompt columns and every generated
        column up to the current one; sliding layers also drop columns `window` or more positions back."""
        st = self._state
        cols = st["arange"][:span]
        allowed = st["prompt_ok"][:rows, :span] | ((cols >= st["width"]) & (cols <= st["col"]))  # (rows, span)
        st["mask_bias"][:rows, :span] = torch.where(allowed, 0.0, float("-inf"))
        if self.window is not None:
            col_pos = torch.where(cols < st["width"], cols, st["len"][:rows, None] + cols - st["width"])  # (rows, span)
            near = st["pos"][:rows, None] - col_pos < self.window
            st["window_bias"][:rows, :span] = torch.where(allowed & near, 0.0, float("-inf"))

    def _step_fn(self, rows: int, span: int, sampling: SamplingParams):
        """The decode step for this shape: a replayed CUDA graph on GPU, the eager function on CPU."""
        if not self.cuda_graph:
            return lambda: self._decode_step(rows, span, sampling)
        key = (rows, span, sampling.is_greedy, sampling.temperature, sampling.top_k, sampling.top_p,
               sampling.return_logprobs)
        graph = self._graphs.get(key)
        if graph is None:
            st = self._state
            saved = {k: st[k].clone() for k in ("col", "step", "tok", "pos")}
            side = torch.cuda.Stream()
            side.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(side):  # warm-up outside capture (cuBLAS handles, allocator)
                self._decode_step(rows, span, sampling)
            torch.cuda.current_stream().wait_stream(side)
            for k, v in saved.items():  # the warm-up advanced the state: undo it
                st[k].copy_(v)
            graph = torch.cuda.CUDAGraph()
            # thread_local: an off-policy rollout captures in its own thread while the update runs in another
            with torch.cuda.graph(graph, pool=self._graphs.get("pool"), capture_error_mode="thread_local"):
                self._decode_step(rows, span, sampling)
            self._graphs.setdefault("pool", graph.pool())
            self._graphs[key] = graph
        return graph.replay

    # ---- the loop --------------------------------------------------------------------------------

    @torch.inference_mode()
    def _generate_chunk(self, prompts, sampling, generator, stopper: StopChecker | None) -> list[GenOutput]:
        refuse_constraint(sampling, "hf_static")
        real, width, n_new = len(prompts), max(len(p) for p in prompts), sampling.max_new_tokens
        if width + n_new > self.max_model_len:
            raise ValueError(f"StaticRollout: prompt width {width} + max_new_tokens {n_new} exceeds "
                             f"max_model_len={self.max_model_len} (raise rollout.max_model_len)")
        # Graphs are captured per row count: round it up to a power of two (filler rows repeat
        # the first prompt and are dropped) so a multi-turn rollout reuses a few graphs.
        rows = min(self.max_batch_size, 1 << (real - 1).bit_length()) if self.round_rows else real
        st = self._buffers()
        st["u"][:rows, :n_new] = torch.rand((rows, n_new), generator=generator, device=self.device)
        self._emit(self._prefill(prompts + [prompts[0]] * (rows - real), width), rows, sampling)  # token 0

        tokens: list[list[int]] = [[] for _ in range(real)]
        logprobs: list[list[float]] = [[] for _ in range(real)]
        reasons: list[str | None] = [None] * real

        def read_back(start: int, end: int):
            """Queue the copy of output tokens [start, end) to the host behind the work already queued."""
            pin = self.device.type == "cuda"
            toks = torch.empty((real, end - start), dtype=torch.long, pin_memory=pin)
            toks.copy_(st["out"][:real, start:end], non_blocking=pin)
            lps = None
            if sampling.return_logprobs:
                lps = torch.empty((real, end - start), dtype=torch.float32, pin_memory=pin)
                lps.copy_(st["out_lp"][:real, start:end], non_blocking=pin)
            event = torch.cuda.Event() if pin else None
            if event is not None:
                event.record()
            return toks, lps, event

        def check(copied) -> None:
            """Apply eos / stop / length per row to a chunk that read_back queued."""
            toks, lps, event = copied
            if event is not None:
                event.synchronize()
            toks = toks.tolist()
            lps = lps.tolist() if lps is not None else None
            for r in range(real):
                if reasons[r] is not None:
                    continue
                for j, t in enumerate(toks[r]):
                    tokens[r].append(t)
                    if lps is not None:
                        logprobs[r].append(lps[r][j])
                    if t in self.eos_ids:
                        reasons[r] = "eos"
                    elif stopper is not None and stopper.hit(tokens[r]):
                        reasons[r] = "stop"
                    elif len(tokens[r]) == n_new:
                        reasons[r] = "length"
                    if reasons[r] is not None:
                        break

        pending = read_back(0, 1)
        emitted = 1
        while emitted < n_new and not all(reasons):
            n = min(self.chunk, n_new - emitted)
            # the last token fed in this chunk sits at column width + emitted + n - 2 < span
            span = min(self.max_model_len, math.ceil((width + emitted + n - 1) / self.bucket) * self.bucket)
            step = self._step_fn(rows, span, sampling)
            for _ in range(n):
                step()
            copied = read_back(emitted, emitted + n)
            emitted += n
            check(pending)  # the previous chunk, while the GPU decodes this one
            pending = copied
        if not all(reasons):
            check(pending)
        return [GenOutput(token_ids=tokens[r], finish_reason=reasons[r] or "length",
                          logprobs=logprobs[r] if sampling.return_logprobs else None) for r in range(real)]
