"""Statistics over masked tensors.

Masked-out positions are excluded with torch.where (not multiplication), so NaN or
inf stored there never leaks into a result or its gradient. When no position is
valid, sums are 0, means are 0, and variances are 0 (no error), so an empty
micro-batch contributes nothing instead of NaN.
"""

import torch


def masked_sum(x: torch.Tensor, mask: torch.Tensor, dim: int | None = None, keepdim: bool = False) -> torch.Tensor:
    """Sum of x where mask is nonzero (over all elements when dim is None)."""
    kept = torch.where(mask.bool(), x, torch.zeros((), dtype=x.dtype, device=x.device))
    return kept.sum() if dim is None else kept.sum(dim=dim, keepdim=keepdim)


def _count(mask: torch.Tensor, dim: int | None, keepdim: bool) -> torch.Tensor:
    m = mask.bool()
    return m.sum() if dim is None else m.sum(dim=dim, keepdim=keepdim)


def masked_mean(x: torch.Tensor, mask: torch.Tensor, dim: int | None = None, keepdim: bool = False) -> torch.Tensor:
    """Mean of x over valid positions; 0 where there are none."""
    count = _count(mask, dim, keepdim).clamp(min=1)
    return masked_sum(x, mask, dim, keepdim) / count


def masked_var(
    x: torch.Tensor, mask: torch.Tensor, dim: int | None = None, unbiased: bool = True, keepdim: bool = False
) -> torch.Tensor:
    """Variance over valid positions (Bessel-corrected if unbiased); 0 with fewer than two."""
    mean = masked_mean(x, mask, dim, keepdim=True)
    sq = torch.where(mask.bool(), (x - mean) ** 2, torch.zeros((), dtype=x.dtype, device=x.device))
    total = sq.sum() if dim is None else sq.sum(dim=dim, keepdim=keepdim)
    count = _count(mask, dim, keepdim)
    denom = (count - 1) if unbiased else count
    return total / denom.clamp(min=1)


def masked_whiten(x: torch.Tensor, mask: torch.Tensor, shift_mean: bool = True, eps: float = 1e-8) -> torch.Tensor:
    """Normalise x to unit variance (and zero mean if shift_mean) over valid positions; 0 elsewhere."""
    mean = masked_mean(x, mask)
    var = masked_var(x, mask)
    white = (x - mean) * torch.rsqrt(var + eps)
    if not shift_mean:
        white = white + mean
    return torch.where(mask.bool(), white, torch.zeros((), dtype=x.dtype, device=x.device))
