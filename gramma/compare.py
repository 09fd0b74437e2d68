"""Paired comparison of two evaluations on the same questions: EM per kind, bootstrap CI, McNemar.

    python -m gramma.compare BASE.jsonl NEW.jsonl [--out cmp.json]

Inputs are trajectories files from gramma.graph_eval (one record per question, keyed by uid).
The difference is NEW - BASE; the 95% interval resamples questions (paired bootstrap), and
the exact McNemar test counts the questions only one of the two got right.
"""
from __future__ import annotations

import argparse
import json
import math
import sys
from pathlib import Path

import numpy as np

from router_r1.eval.report import bootstrap_ci


def load(path: str | Path) -> dict[str, dict]:
    recs = [json.loads(x) for x in Path(path).read_text().splitlines() if x.strip()]
    out = {r["uid"]: r for r in recs}
    if len(out) != len(recs):
        raise ValueError(f"{path}: repeated uids")
    return out


def mcnemar_p(wins: int, losses: int) -> float:
    """Two-sided exact McNemar p-value: binomial(wins + losses, 1/2) on the discordant pairs."""
    n = wins + losses
    if n == 0:
        return 1.0
    k = min(wins, losses)
    tail = sum(math.comb(n, i) for i in range(k + 1)) / 2 ** n
    return min(1.0, 2 * tail)


def paired(base: np.ndarray, new: np.ndarray, n_boot: int = 10000, seed: int = 0) -> dict:
    """EM of both, the difference, its 95% paired-bootstrap interval, wins/losses and McNemar p."""
    if base.shape != new.shape or base.ndim != 1 or len(base) == 0:
        raise ValueError("paired: need two non-empty 1-d arrays of the same length")
    diff = new - base  # (n,)
    lo, hi = bootstrap_ci(diff, n_boot, seed)  # resampling questions keeps each pair together
    wins, losses = int(((new >= 1) & (base < 1)).sum()), int(((new < 1) & (base >= 1)).sum())
    return {"n": len(diff), "base": float(base.mean()), "new": float(new.mean()), "diff": float(diff.mean()),
            "ci95": [lo, hi],
            "wins": wins, "losses": losses, "mcnemar_p": mcnemar_p(wins, losses)}


def compare(base: dict[str, dict], new: dict[str, dict], key: str = "em", n_boot: int = 10000) -> dict[str, dict]:
    """{"all": stats, kind: stats, ...} over the uids both evaluations share (they must be the same)."""
    if set(base) != set(new):
        raise ValueError(f"the two evaluations cover different questions ({len(set(base) ^ set(new))} differ)")
    uids = sorted(base)
    kinds = sorted({base[u]["kind"] for u in uids})
    out = {}
    for kind in ["all", *kinds]:
        us = [u for u in uids if kind == "all" or base[u]["kind"] == kind]
        out[kind] = paired(np.array([float(base[u][key]) for u in us]), np.array([float(new[u][key]) for u in us]),
                           n_boot)
    return out


def table(stats: dict[str, dict], base_name: str = "base", new_name: str = "new") -> str:
    lines = [f"| questions | n | EM {base_name} | EM {new_name} | diff | 95% CI | won/lost | McNemar p |",
             "|---|--:|--:|--:|--:|--:|--:|--:|"]
    for kind, s in stats.items():
        lo, hi = s["ci95"]
        lines.append(f"| {kind} | {s['n']} | {s['base']:.3f} | {s['new']:.3f} | {s['diff']:+.3f} | "
                     f"[{lo:+.3f}, {hi:+.3f}] | {s['wins']}/{s['losses']} | {s['mcnemar_p']:.3g} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m gramma.compare", description=__doc__.split("\n\n")[0])
    p.add_argument("base", help="the baseline's trajectories JSONL")
    p.add_argument("new", help="the compared run's trajectories JSONL")
    p.add_argument("--key", default="em", help="per-question field to compare (em, score, ...)")
    p.add_argument("--boot", type=int, default=10000, help="bootstrap resamples of the paired difference")
    p.add_argument("--out", default=None, help="write the comparison as JSON here")
    args = p.parse_args(argv)
    try:
        stats = compare(load(args.base), load(args.new), args.key, args.boot)
    except (ValueError, KeyError, OSError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    names = [Path(args.base).stem, Path(args.new).stem]
    if names[0] == names[1]:  # the same checkpoint on two question files: name them by their folders
        names = [Path(args.base).parent.name, Path(args.new).parent.name]
    print(table(stats, *names))
    if args.out:
        Path(args.out).write_text(json.dumps({"base": args.base, "new": args.new, "key": args.key, **stats},
                                             indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
