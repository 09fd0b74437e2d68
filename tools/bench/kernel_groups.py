"""Where a profiled GPU region spends its kernel time, grouped by what the kernels do.

The groups are read from kernel names (cuBLAS/CUTLASS GEMMs, flash attention, Triton, ATen's
elementwise and reduction kernels, the fused optimizer, copies), so a breakdown reads the same
whether the kernels came from eager ATen or from torch.compile.
"""
from __future__ import annotations

import re

# First match wins: order from the most specific name pattern to the most generic.
GROUPS: list[tuple[str, re.Pattern]] = [
    ("optimizer", re.compile(r"adam|multi_tensor|foreach|fused_optim", re.I)),
    ("attention", re.compile(r"flash|fmha|attention|sdpa|_attn|decode_attention", re.I)),
    ("gemm", re.compile(r"gemm|cutlass|nvjet|xmma|sm\d+_.*(?:tensorop|hmma)|splitkreduce|cublas", re.I)),
    ("loss/softmax", re.compile(r"softmax|log_softmax|cross_entropy|nll_loss|logsumexp", re.I)),
    ("triton (fused)", re.compile(r"triton", re.I)),
    ("reduction/norm", re.compile(r"reduce|norm|sum_kernel|mean|welford", re.I)),
    ("copy/cast", re.compile(r"copy|memcpy|memset|cat|index|gather|scatter|fill", re.I)),
    ("elementwise", re.compile(r"elementwise|vectorized|unrolled|pointwise", re.I)),
]


def group_of(kernel_name: str) -> str:
    """The group a kernel belongs to ("other" when no pattern matches)."""
    for group, pattern in GROUPS:
        if pattern.search(kernel_name):
            return group
    return "other"


def breakdown(events) -> dict[str, dict]:
    """Kernel seconds and launches per group from a profiler's key_averages() (CUDA events only)."""
    out: dict[str, dict] = {}
    for e in events:
        if getattr(e, "device_type", None) is None or "CUDA" not in str(e.device_type):
            continue
        slot = out.setdefault(group_of(e.key), dict(seconds=0.0, launches=0))
        slot["seconds"] += e.self_device_time_total / 1e6
        slot["launches"] += e.count
    return dict(sorted(out.items(), key=lambda kv: -kv[1]["seconds"]))


def format_breakdown(groups: dict[str, dict], wall_s: float) -> str:
    """One line per group: ms, share of kernel time, launches; then kernel time against the wall."""
    total = sum(g["seconds"] for g in groups.values())
    lines = [f"{name:16} {g['seconds'] * 1e3:10.1f} ms {g['seconds'] / total:6.1%} {g['launches']:7d} launches"
             for name, g in groups.items()] if total else []
    lines.append(f"{'kernel time':16} {total * 1e3:10.1f} ms of {wall_s * 1e3:.1f} ms wall "
                 f"(gaps {max(wall_s - total, 0.0) * 1e3:.1f} ms)")
    return "\n".join(lines)
