"""Token log-probs and entropies straight from hidden states, a chunk of positions at a time.

The policy's head maps (n, hidden) to (n, vocab) logits; for a 151k vocabulary the
full float32 (batch, len, vocab) tensor is what limits the micro-batch size. Here the
logits exist for one chunk of positions at a time, and the chunk's backward is written
out by hand: it recomputes the chunk's logits and forms their gradient in one pass
(`_grad_logits`), instead of autograd's float32 graph of casts, softmax and gather.
`compiled=True` hands the two elementwise halves to torch.compile (one or two fused
kernels each on a GPU); the matmuls stay cuBLAS's.
"""
from __future__ import annotations

import functools

import torch
import torch.nn.functional as F


def _scores(logits, labels, temperature: float, softcap: float | None, with_entropy: bool):
    """(log p(label), logsumexp, entropy or None) in float32 from one chunk's raw logits (rows, vocab)."""
    z = logits.float()
    if softcap:  # Gemma 2's final logit soft-capping, applied by its forward before any temperature
        z = torch.tanh(z / softcap) * softcap
    z = z / temperature
    lse = torch.logsumexp(z, dim=-1)  # (rows,)
    logp = z.gather(-1, labels[:, None]).squeeze(-1) - lse
    if not with_entropy:
        return logp, lse, None
    # H = logsumexp(z) - sum softmax(z) * z: no log(0) on underflowed probabilities.
    return logp, lse, lse - (torch.softmax(z, dim=-1) * z).sum(-1)


def _grad_logits(logits, labels, lse, entropy, g_logp, g_entropy, temperature: float, softcap: float | None):
    """d(sum g_logp * logp + g_entropy * H)/d logits, in the logits' dtype, (rows, vocab).

    With p = softmax(z): d logp_y/dz_j = [j = y] - p_j and dH/dz_j = -p_j (log p_j + H)."""
    raw = logits.float()
    capped = torch.tanh(raw / softcap) if softcap else None
    z = (capped * softcap if softcap else raw) / temperature
    logp_all = z - lse[:, None]
    p = torch.exp(logp_all)
    onehot = torch.arange(z.shape[-1], device=z.device)[None, :] == labels[:, None]
    grad = g_logp[:, None] * (onehot.float() - p)
    if g_entropy is not None:
        grad = grad - g_entropy[:, None] * p * (logp_all + entropy[:, None])
    grad = grad / temperature
    if softcap:
        grad = grad * (1 - capped * capped)
    return grad.to(logits.dtype)


@functools.cache
def _kernels(compiled: bool):
    if not compiled:
        return _scores, _grad_logits
    return (torch.compile(_scores, dynamic=True), torch.compile(_grad_logits, dynamic=True))


class _HeadLogProbs(torch.autograd.Function):
    """One chunk: log p(label) and optionally the entropy of softmax((h @ W.T + b) / T).
    Saves the chunk's inputs and per-row statistics, not its (rows, vocab) logits."""

    @staticmethod
    def forward(ctx, hidden, weight, bias, labels, temperature, softcap, with_entropy, compiled):
        scores, _ = _kernels(compiled)
        # The matmul runs in the weight's dtype (the actor hands in the autocast dtype's copy).
        logits = F.linear(hidden.to(weight.dtype), weight, None if bias is None else bias.to(weight.dtype))
        logp, lse, entropy = scores(logits, labels, temperature, softcap, with_entropy)
        ctx.save_for_backward(hidden, weight, bias, labels, lse, entropy)
        ctx.opts = (temperature, softcap, compiled)
        return (logp, entropy) if with_entropy else (logp,)

    @staticmethod
    def backward(ctx, g_logp, g_entropy=None):
        hidden, weight, bias, labels, lse, entropy = ctx.saved_tensors
        temperature, softcap, compiled = ctx.opts
        _, grad_logits = _kernels(compiled)
        h = hidden.to(weight.dtype)
        logits = F.linear(h, weight, None if bias is None else bias.to(weight.dtype))  # (rows, vocab), recomputed
        g_entropy = g_entropy if entropy is not None else None
        grad = grad_logits(logits, labels, lse, entropy, g_logp.float(), None if g_entropy is None else
                           g_entropy.float(), temperature, softcap)  # (rows, vocab)
        g_hidden = (grad @ weight).to(hidden.dtype) if ctx.needs_input_grad[0] else None
        g_weight = grad.T @ h if ctx.needs_input_grad[1] else None
        g_bias = grad.sum(0).to(bias.dtype) if bias is not None and ctx.needs_input_grad[2] else None
        return g_hidden, g_weight, g_bias, None, None, None, None, None


def chunked_logprobs(hidden: torch.Tensor, weight: torch.Tensor, labels: torch.Tensor,
                     bias: torch.Tensor | None = None, temperature: float = 1.0, with_entropy: bool = False,
                     chunk_size: int = 2048, softcap: float | None = None,
                     compiled: bool = False) -> tuple[torch.Tensor, torch.Tensor | None]:
    """log softmax(hidden @ weight.T / temperature)[labels] and optionally the entropy,
    for hidden (n, h), weight (vocab, h), labels (n,); returns float32 (n,) tensors.
    `softcap`: the model's final logit soft-capping (cap * tanh(logits / cap)), if it has one.
    `compiled`: the elementwise work through torch.compile (the actor's `model.compile`)."""
    if hidden.ndim != 2 or labels.shape != hidden.shape[:1]:
        raise ValueError(f"hidden {tuple(hidden.shape)} must be (n, h) and labels {tuple(labels.shape)} (n,)")
    if chunk_size < 1:
        raise ValueError(f"chunk_size must be >= 1, got {chunk_size}")
    logps, entropies = [], []
    for start in range(0, hidden.shape[0], chunk_size):
        h, y = hidden[start : start + chunk_size], labels[start : start + chunk_size]
        out = _HeadLogProbs.apply(h, weight, bias, y, float(temperature), softcap, with_entropy, compiled)
        logps.append(out[0])
        entropies.append(out[1] if with_entropy else None)
    if not logps:  # no positions: an empty slice that is still part of the graph
        empty = hidden[:, 0].float()  # (0,)
        return empty, (empty if with_entropy else None)
    return torch.cat(logps), (torch.cat(entropies) if with_entropy else None)
