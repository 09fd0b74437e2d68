"""Spreading rollout requests over engines (ranks, GPUs, pool endpoints) by their expected load.

A request's load is a hint of its cost, e.g. its turn budget: an episode allowed 6
turns can take 6 times as long as one allowed 1. Contiguous chunks put all samples of
a prompt (and so all its budget) on one engine; least-loaded-first evens the sums.
"""
from __future__ import annotations

import heapq
from typing import Any, Sequence


def assign_uniform(n: int, n_engines: int) -> list[list[int]]:
    """Contiguous near-equal chunks of range(n), in engine order (the first n % n_engines get one more)."""
    if n_engines < 1:
        raise ValueError(f"n_engines must be >= 1, got {n_engines}")
    base, extra = divmod(n, n_engines)
    out, start = [], 0
    for e in range(n_engines):
        size = base + (1 if e < extra else 0)
        out.append(list(range(start, start + size)))
        start += size
    return out


def assign_balanced(loads: Sequence[float], n_engines: int) -> list[list[int]]:
    """Greedy least-loaded: by load, largest first, each request goes to the engine with the
    smallest accumulated load (ties: fewer requests, then lower engine index).

    Deterministic; equal loads keep their input order; indices within an engine are sorted.
    """
    if n_engines < 1:
        raise ValueError(f"n_engines must be >= 1, got {n_engines}")
    for i, x in enumerate(loads):
        if not x >= 0:  # also catches nan
            raise ValueError(f"load of request {i} is {x!r}; loads must be >= 0")
    order = sorted(range(len(loads)), key=lambda i: -loads[i])  # sorted() is stable
    heap = [(0.0, 0, e) for e in range(n_engines)]  # (load, count, engine)
    out: list[list[int]] = [[] for _ in range(n_engines)]
    for i in order:
        load, count, e = heapq.heappop(heap)
        out[e].append(i)
        heapq.heappush(heap, (load + float(loads[i]), count + 1, e))
    return [sorted(b) for b in out]


def engine_loads(loads: Sequence[float], assignment: list[list[int]]) -> list[float]:
    """Summed load per engine."""
    return [float(sum(loads[i] for i in b)) for b in assignment]


def imbalance(engine_totals: Sequence[float]) -> float:
    """max / mean of the engines' loads: 1.0 is perfect balance (1.0 also when all are 0)."""
    mean = sum(engine_totals) / max(1, len(engine_totals))
    return max(engine_totals) / mean if mean > 0 else 1.0


def row_loads(rows: Sequence[Any], env: Any = None, sampling: Any = None, validate: bool = False) -> list[float] | None:
    """Per-row load hints: `env.row_load(row, sampling, validate)` when the environment has one
    (e.g. the turn budget it will draw for the row), else every row's `extra_info.turn_budget`;
    None when neither is there (then split uniformly)."""
    fn = getattr(env, "row_load", None)
    if fn is not None:
        return [float(fn(r, sampling, validate)) for r in rows]
    loads = []
    for r in rows:
        budget = (r.fields.get("extra_info") or {}).get("turn_budget")
        if budget is None:
            return None
        loads.append(float(budget))
    return loads
