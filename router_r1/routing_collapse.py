"""Routing-collapse diagnostics: each pool model's share of the calls, per data source, and their entropy.

A known failure of learned routers is collapse onto one model (often the dearest generalist).
The entropy of the call shares says how far a policy is from it: log2(K) bits when the K
models get equal shares, 0 when one model takes every call.
"""
from __future__ import annotations

import math
from collections.abc import Iterable, Sequence

ALL = "all"


def call_counts(episodes_turns: Iterable[list[dict]], names: Sequence[str]) -> dict[str, int]:
    """Calls made to each model (failed ones too) over episodes, from their turn records."""
    counts = dict.fromkeys(names, 0)
    for turns in episodes_turns:
        for t in turns:
            if "ok" in t and t.get("model") in counts:  # "ok" is set once the pool was called
                counts[t["model"]] += 1
    return counts


def shares_entropy(counts: dict[str, int]) -> tuple[dict[str, float], float]:
    """(share of calls per model, entropy of the shares in bits); no calls: zero shares, entropy nan."""
    total = sum(counts.values())
    if total == 0:
        return dict.fromkeys(counts, 0.0), math.nan
    shares = {m: c / total for m, c in counts.items()}
    return shares, 0.0 - sum(p * math.log2(p) for p in shares.values() if p > 0)  # 0.0, not -0.0


def domain_shares(episodes_turns: Iterable[list[dict]], names: Sequence[str]) -> dict[str, dict]:
    """{domain: {"calls": n, "share": {model: share}}} over the calls whose turn carries a "domain" (evaluation
    sets it from the simulated world: the domain of a one-fact sub-question); other calls are left out."""
    groups: dict[str, list[dict]] = {}
    for turns in episodes_turns:
        for t in turns:
            if "ok" in t and t.get("domain"):
                groups.setdefault(t["domain"], []).append(t)
    out = {}
    for domain, calls in sorted(groups.items()):
        counts = call_counts([calls], names)
        out[domain] = {"calls": sum(counts.values()), "share": shares_entropy(counts)[0]}
    return out


def by_source(episodes_turns: Sequence[list[dict]], sources: Sequence[str | None],
              names: Sequence[str]) -> dict[str, tuple[dict[str, float], float]]:
    """{source: (shares, entropy)} for each data source and for ALL of them together."""
    if len(episodes_turns) != len(sources):
        raise ValueError(f"by_source: {len(episodes_turns)} episodes but {len(sources)} sources")
    groups: dict[str, list[list[dict]]] = {}
    for turns, source in zip(episodes_turns, sources):
        groups.setdefault(str(source or "unknown"), []).append(turns)
    out = {s: shares_entropy(call_counts(g, names)) for s, g in sorted(groups.items())}
    out[ALL] = shares_entropy(call_counts(episodes_turns, names))
    return out


def collapse_metrics(episodes_turns: Sequence[list[dict]], sources: Sequence[str | None],
                     names: Sequence[str]) -> dict[str, list[float]]:
    """Training metrics: routing/<source>/share/<model> and routing/<source>/entropy_bits, one value per batch
    (a source whose episodes made no call has no entropy entry)."""
    out: dict[str, list[float]] = {}
    for source, (shares, entropy) in by_source(episodes_turns, sources, names).items():
        for m, p in shares.items():
            out[f"routing/{source}/share/{m}"] = [p]
        if not math.isnan(entropy):
            out[f"routing/{source}/entropy_bits"] = [entropy]
    return out
