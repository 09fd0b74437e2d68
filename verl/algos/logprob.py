"""Token log-probs and entropies straight from hidden states, a chunk of positions at a time.

The policy's head maps (n, hidden) to (n, vocab) logits; for a 151k vocabulary the
full float32 (batch, len, vocab) tensor is what limits the micro-batch size. Here the
logits exist for one chunk of positions at a time (float32 inside the chunk), and
under autograd each chunk is recomputed in the backward pass instead of being stored.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch.utils.checkpoint import checkpoint


def _chunk(hidden, weight, bias, labels, temperature: float, with_entropy: bool, softcap: float | None = None):
    logits = F.linear(hidden, weight, bias).float()  # (rows, vocab)
    if softcap:  # Gemma 2's final logit soft-capping, applied by its forward before any temperature
        logits = torch.tanh(logits / softcap) * softcap
    logits = logits / temperature
    lse = torch.logsumexp(logits, dim=-1)  # (rows,)
    if labels.ndim == 2:  # (rows, k) ids per position: (rows, k) log-probs
        logp = logits.gather(-1, labels) - lse[:, None]
    else:
        logp = logits.gather(-1, labels[:, None]).squeeze(-1) - lse
    if not with_entropy:
        return logp, None
    # H = logsumexp(z) - sum softmax(z) * z: no log(0) on underflowed probabilities.
    entropy = lse - (torch.softmax(logits, dim=-1) * logits).sum(-1)
    return logp, entropy


def chunked_logprobs(hidden: torch.Tensor, weight: torch.Tensor, labels: torch.Tensor,
                     bias: torch.Tensor | None = None, temperature: float = 1.0, with_entropy: bool = False,
                     chunk_size: int = 2048, softcap: float | None = None) -> tuple[torch.Tensor, torch.Tensor | None]:
    """log softmax(hidden @ weight.T / temperature)[labels] and optionally the entropy,
    for hidden (n, h), weight (vocab, h), labels (n,) or (n, k); returns float32 (n,) or (n, k) tensors.
    `softcap`: the model's final logit soft-capping (cap * tanh(logits / cap)), if it has one."""
    if hidden.ndim != 2 or labels.shape[:1] != hidden.shape[:1] or labels.ndim > 2:
        raise ValueError(f"hidden {tuple(hidden.shape)} must be (n, h) and labels {tuple(labels.shape)} (n,) or (n, k)")
    if chunk_size < 1:
        raise ValueError(f"chunk_size must be >= 1, got {chunk_size}")
    # Recompute a chunk's logits in backward rather than keeping (n, vocab) alive for it.
    recompute = torch.is_grad_enabled() and (hidden.requires_grad or weight.requires_grad)
    logps, entropies = [], []
    for start in range(0, hidden.shape[0], chunk_size):
        h, y = hidden[start : start + chunk_size], labels[start : start + chunk_size]
        if recompute:
            lp, ent = checkpoint(_chunk, h, weight, bias, y, temperature, with_entropy, softcap, use_reentrant=False)
        else:
            lp, ent = _chunk(h, weight, bias, y, temperature, with_entropy, softcap)
        logps.append(lp)
        entropies.append(ent)
    if not logps:  # no positions: an empty slice that is still part of the graph
        empty = hidden[:, 0].float()  # (0,)
        return empty.reshape(labels.shape), (empty if with_entropy else None)
    return torch.cat(logps), (torch.cat(entropies) if with_entropy else None)
