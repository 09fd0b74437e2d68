"""One alpha-conditioned router against fixed-alpha routers on the same questions: EM and cost per point,
paired bootstrap CIs of the differences, call shares and their entropy, one Pareto PNG with both curves.

    python -m tools.analysis.eval_alpha --data outputs/alpha/base/data/test.parquet --n 150 \
        --conditioned outputs/alpha/cond/hf --fixed 0=outputs/alpha/fixed_0/hf ... --sft outputs/alpha/base/sft \
        --out docs/results/alpha_cpu

The conditioned model is told each alpha in its prompt (as serving does); a fixed model reads the rows'
own prompts. Greedy; the simulated pool served in-process (zero latency). Turn settings are the
conditioned run's (its run_config.yaml, else configs/embedded.yaml's) unless a flag gives one.
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import numpy as np

from router_r1.calibrate import dearest, point, router_records
from router_r1.eval.evaluate import find_data_files, load_rows
from router_r1.eval.report import bootstrap_ci
from router_r1.flags import add_flags, from_args
from router_r1.runtime import (EnvOverrides, episode_config, load_policy, open_pool, quiet_transformers,
                               resolve_env)
from router_r1.routing_collapse import by_source


def stratified(rows, n: int, seed: int = 0):
    """n rows, each data source in its share of the file, drawn with a seeded RNG, file order kept."""
    if n >= len(rows):
        return rows
    rng = np.random.default_rng(seed)
    sources = sorted({r.source for r in rows})
    keep = []
    for s in sources:
        idx = [i for i, r in enumerate(rows) if r.source == s]
        k = round(n * len(idx) / len(rows))
        keep += list(rng.choice(idx, size=min(k, len(idx)), replace=False))
    return [rows[i] for i in sorted(keep)]


def paired(a: list[dict], b: list[dict], key: str) -> dict:
    """Mean of a - b over the same questions with its 95% bootstrap CI."""
    assert [r["uid"] for r in a] == [r["uid"] for r in b]
    d = [float(x[key]) - float(y[key]) for x, y in zip(a, b)]
    lo, hi = bootstrap_ci(d)
    return {"mean": float(np.mean(d)), "ci95": [lo, hi]}


def summarize(label: str, alpha: float | None, records: list[dict], pool) -> dict:
    p = point(alpha if alpha is not None else float("nan"), records, pool)
    per_source = {s: {"shares": sh, "entropy_bits": h}
                  for s, (sh, h) in by_source([r["turns"] for r in records], [r["data_source"] for r in records],
                                              pool.registry.names).items()}
    return {"label": label, "alpha": alpha, "n": p.n, "em": p.em, "em_ci95": list(p.em_ci95),
            "cost_1e6_usd": p.cost_per_1k_usd * 1e3, "format_ok": float(np.mean([r["format_ok"] for r in records])),
            "calls": p.calls_per_question, "dear_share": p.dear_share, "routing": per_source}


def plot(summary: dict, path: Path) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6.4, 4.4))
    for key, style, name in (("conditioned", "o-", "one alpha-conditioned model"),
                             ("fixed", "s--", "four fixed-alpha models")):
        pts = sorted(summary[key], key=lambda r: r["alpha"])
        ax.plot([r["cost_1e6_usd"] for r in pts], [r["em"] for r in pts], style, label=name)
        for r in pts:
            ax.annotate(f"{r['alpha']:g}", (r["cost_1e6_usd"], r["em"]), textcoords="offset points", xytext=(4, 4),
                        fontsize=8)
    if summary.get("sft"):
        s = summary["sft"]
        ax.plot([s["cost_1e6_usd"]], [s["em"]], "k^", label="SFT warm start")
    ax.set_xlabel("pool cost per question (1e-6 USD)")
    ax.set_ylabel("EM")
    ax.set_title(f"EM against cost, {summary['n']} test questions (labels: alpha)")
    ax.grid(alpha=0.3)
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--data", required=True, help="test parquet (sim.qa's, with extra_info.question)")
    p.add_argument("--n", type=int, default=150, help="questions, stratified by data source")
    p.add_argument("--conditioned", required=True, help="the alpha-conditioned run's HF dir")
    p.add_argument("--fixed", action="append", default=[], metavar="ALPHA=DIR", help="a fixed-alpha run (repeatable)")
    p.add_argument("--sft", default=None, help="the SFT warm start, one more point")
    p.add_argument("--pool", default="configs/pool/sim.yaml", help="pool yaml, served simulated")
    add_flags(p, EnvOverrides)
    p.add_argument("--alphas", type=float, nargs="+", default=[0.0, 0.3, 0.6, 0.9],
                   help="told to the conditioned model")
    p.add_argument("--out", required=True, help="output directory (summary.json, trajectories.jsonl, pareto.png)")
    p.add_argument("--only-conditioned", action="store_true", help="evaluate the conditioned model (and SFT) only")
    a = p.parse_args(argv)
    rows = stratified(load_rows(find_data_files([a.data])), a.n)
    env = resolve_env([a.conditioned], from_args(EnvOverrides, a), fallback="embedded")
    rcfg = episode_config(env, schedule="sync")
    fixed = {float(k): v for k, v in (f.split("=", 1) for f in a.fixed)}
    out_dir = Path(a.out)
    out_dir.mkdir(parents=True, exist_ok=True)
    quiet_transformers()
    recs: dict[str, list[dict]] = {}
    cache = out_dir / "records"  # each model's records, kept so a later call (--only-conditioned first) reuses them
    cache.mkdir(exist_ok=True)

    def records(label: str, ckpt: str, alpha: float | None) -> list[dict]:
        f = cache / f"{label}.json"
        if f.is_file() and json.loads(f.read_text())["checkpoint"] == str(ckpt):
            return json.loads(f.read_text())["records"]
        rs = router_records(load_policy(ckpt, "cpu"), pool, rows, rcfg, alpha, label)
        f.write_text(json.dumps({"checkpoint": str(ckpt), "records": rs}, default=float))
        print(f"{label}: EM {np.mean([r['em'] for r in rs]):.3f}", flush=True)
        return rs

    with open_pool(a.pool, sim=True) as pool:
        for alpha in a.alphas:
            recs[f"cond@{alpha:g}"] = records(f"cond@{alpha:g}", a.conditioned, alpha)
        if a.sft:
            recs["sft"] = records("sft", a.sft, None)
        if a.only_conditioned:
            return 0
        for alpha, ckpt in sorted(fixed.items()):
            recs[f"fixed@{alpha:g}"] = records(f"fixed@{alpha:g}", ckpt, None)
        summary = {"data": a.data, "n": len(rows), "pool": a.pool, "settings": EnvOverrides.values_in(rcfg), "dearest": dearest(pool),
                   "conditioned": [summarize(f"cond@{x:g}", x, recs[f"cond@{x:g}"], pool) for x in a.alphas],
                   "fixed": [summarize(f"fixed@{x:g}", x, recs[f"fixed@{x:g}"], pool) for x in sorted(fixed)],
                   "sft": summarize("sft", None, recs["sft"], pool) if a.sft else None,
                   "paired_cond_minus_fixed": {f"{x:g}": {"em": paired(recs[f"cond@{x:g}"], recs[f"fixed@{x:g}"], "em"),
                                                          "cost_usd": paired(recs[f"cond@{x:g}"], recs[f"fixed@{x:g}"],
                                                                             "cost_usd")}
                                               for x in sorted(fixed) if f"cond@{x:g}" in recs}}
    (out_dir / "summary.json").write_text(json.dumps(summary, indent=2, default=float))
    with open(out_dir / "trajectories.jsonl", "w") as f:
        for label, rs in recs.items():
            for r in rs:
                f.write(json.dumps({k: r[k] for k in ("run", "uid", "data_source", "em", "cost_usd", "models_called",
                                                      "answer", "format_ok")}, default=float) + "\n")
    plot(summary, out_dir / "pareto.png")
    print(f"{'run':<12} {'EM':>6} {'95% CI':>15} {'cost 1e-6$':>10} {'calls':>5} {'dear':>5} {'H bits':>6}")
    for r in summary["conditioned"] + summary["fixed"] + ([summary["sft"]] if a.sft else []):
        lo, hi = r["em_ci95"]
        print(f"{r['label']:<12} {r['em']:>6.3f} {f'[{lo:.3f}, {hi:.3f}]':>15} {r['cost_1e6_usd']:>10.2f} "
              f"{r['calls']:>5.2f} {r['dear_share']:>5.2f} {r['routing']['all']['entropy_bits']:>6.2f}")
    for x, d in summary["paired_cond_minus_fixed"].items():
        e, c = d["em"], d["cost_usd"]
        print(f"alpha {x}: cond - fixed EM {e['mean']:+.3f} [{e['ci95'][0]:+.3f}, {e['ci95'][1]:+.3f}], cost "
              f"{c['mean'] * 1e6:+.2f} [{c['ci95'][0] * 1e6:+.2f}, {c['ci95'][1] * 1e6:+.2f}] 1e-6 USD")
    return 0


if __name__ == "__main__":
    sys.exit(main())
