"""Table of run.sh's arms: each seed's greedy test EM, RL minus its warm start (paired 95% CI), cost, the share of
its greedy test routes that ask the hop's best model, P(best) at the warm start's routes (route_probs.md), greedy
validation EM (start, lowest, end), the lowest sampled format rate and the names training stopped sampling; then
each arm's mean.

    python -m experiments.forked_groups.summarize OUT [--records docs/results/forked_groups] [--pool POOL]
"""
from __future__ import annotations

import argparse
import json
import re
import shutil
import statistics
import sys
from pathlib import Path

RUN = re.compile(r"^(?P<arm>\w+?)_s(?P<seed>\d+)$")
P_BEST = re.compile(r"P\(best\) over \d+ hops of a known domain: ([\d.]+)")
SHARE = re.compile(r"^routing/all/share/(?P<model>.+)/mean$")
DROP_WINDOW = 20  # training steps in a row with no sampled route to a name before it counts as dropped


def best_route_share(trajectories: list[dict], best: dict[str, str]) -> float | None:
    """Share of the routed hops of a known domain that ask that domain's best model (None: no such hop)."""
    hops = [t for traj in trajectories for t in traj.get("turns", [])
            if t.get("action") == "route" and t.get("model") and t.get("domain") in best]
    return sum(t["model"] == best[t["domain"]] for t in hops) / len(hops) if hops else None


def dropped_names(rows: list[dict], window: int = DROP_WINDOW) -> dict[str, int] | None:
    """Models the sampled routes named at some step and then in none of the last `window` training steps or more:
    model -> the first step of that final silence (a name no episode samples gets no gradient back). None: the
    metrics log no route shares."""
    steps = [(r["step"], {m["model"]: x for k, x in r.items() if (m := SHARE.match(k))}) for r in rows]
    steps = [(step, by_model) for step, by_model in steps if by_model]  # training steps; validation rows log none
    if not steps:
        return None
    dropped = {}
    for model in sorted({m for _, by_model in steps for m in by_model}):
        named = [i for i, (_, by_model) in enumerate(steps) if by_model.get(model, 0.0) > 0]
        if named and len(steps) - 1 - named[-1] >= window:
            dropped[model] = steps[named[-1] + 1][0]
    return dropped


def read_run(run: Path, best: dict[str, str]) -> dict:
    """One run's figures from eval/summary.json and trajectories.jsonl, route_probs.md and ppo/metrics.jsonl."""
    runs = json.loads((run / "eval" / "summary.json").read_text())["runs"]
    rl = next(r for r in runs if r["label"] != "SFT router")
    paired = next(r for r in runs if r["label"] == "SFT router")["vs_router"]  # warm start - RL
    lo, hi = paired["em_diff_ci95"]
    rows = [json.loads(line) for line in (run / "ppo" / "metrics.jsonl").read_text().splitlines() if line.strip()]
    val = [r["val/em/mean"] for r in rows if "val/em/mean" in r]
    fmt = [r["format_ok/mean"] for r in rows if "format_ok/mean" in r]
    probs = run / "route_probs.md"
    p_best = P_BEST.search(probs.read_text()) if probs.exists() else None
    trajs = run / "eval" / "trajectories.jsonl"
    routes = (best_route_share([t for t in map(json.loads, trajs.read_text().splitlines()) if t["run"] == rl["label"]],
                               best) if trajs.exists() else None)
    return {"em": rl["overall"]["em"], "gain": -paired["em_diff"], "gain_ci": (-hi, -lo), "best_routes": routes,
            "cost_1e6": rl["overall"]["cost_usd"] * 1e6, "p_best": float(p_best.group(1)) if p_best else None,
            "val": (val[0], min(val), val[-1]) if val else None, "format_min": min(fmt) if fmt else None,
            "dropped": _mark_best(dropped_names(rows), set(best.values()))}


def collect(out: Path, best: dict[str, str]) -> dict[str, dict[int, dict]]:
    """arm -> seed -> figures, for every evaluated OUT/<arm>_s<seed>."""
    arms: dict[str, dict[int, dict]] = {}
    for run in sorted(out.iterdir()):
        m = RUN.match(run.name)
        if m and (run / "eval" / "summary.json").exists():
            arms.setdefault(m["arm"], {})[int(m["seed"])] = read_run(run, best)
    return arms


def _f(x, fmt: str) -> str:
    return "-" if x is None else format(x, fmt)


def _mark_best(dropped: dict[str, int] | None, best_models: set[str]) -> dict[str, int] | None:
    """The dropped names with a * on each that is some domain's best model."""
    return None if dropped is None else {m + "*" * (m in best_models): s for m, s in dropped.items()}


def _dropped(d: dict[str, int] | None) -> str:
    return "-" if d is None else ", ".join(f"{m} ({s})" for m, s in d.items()) or "none"


def table(arms: dict[str, dict[int, dict]]) -> str:
    lines = ["| arm | seed | test EM | RL - warm start [95% CI] | cost 1e-6 $ | best-model routes | P(best) "
             "| val EM start / min / end | min format | names dropped (from step; * a domain's best) |",
             "|---|---|---|---|---|---|---|---|---|---|"]
    for arm, seeds in arms.items():
        for s, r in sorted(seeds.items()):
            val = " / ".join(f"{v:.2f}" for v in r["val"]) if r["val"] else "-"
            lines.append(f"| {arm} | {s} | {r['em']:.3f} | {r['gain']:+.3f} [{r['gain_ci'][0]:+.3f}, "
                         f"{r['gain_ci'][1]:+.3f}] | {r['cost_1e6']:.2f} | {_f(r['best_routes'], '.2f')} "
                         f"| {_f(r['p_best'], '.2f')} | {val} "
                         f"| {_f(r['format_min'], '.2f')} | {_dropped(r['dropped'])} |")
        rs = list(seeds.values())
        pb = [r["p_best"] for r in rs if r["p_best"] is not None]
        br = [r["best_routes"] for r in rs if r["best_routes"] is not None]
        spread = f" (sd {statistics.stdev([r['em'] for r in rs]):.3f})" if len(rs) > 1 else ""
        lines.append(f"| **{arm}, mean of {len(rs)}** | | **{statistics.mean(r['em'] for r in rs):.3f}**{spread} "
                     f"| {statistics.mean(r['gain'] for r in rs):+.3f} | "
                     f"{statistics.mean(r['cost_1e6'] for r in rs):.2f} | "
                     f"{_f(statistics.mean(br) if br else None, '.2f')} | "
                     f"{_f(statistics.mean(pb) if pb else None, '.2f')} | | | "
                     f"{sum(any(m.endswith('*') for m in r['dropped'] or ()) for r in rs)} of {len(rs)} "
                     "dropped a best model |")
    return "\n".join(lines)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("out", type=Path, help="run.sh's OUT: <arm>_s<seed> run directories")
    ap.add_argument("--records", type=Path, default=None,
                    help="write table.md here, with each run's route_probs.md as <arm>_s<seed>_route_probs.md")
    ap.add_argument("--pool", type=Path, default=Path("configs/pool/sim.yaml"),
                    help="the simulated pool yaml whose accuracies name each domain's best model")
    args = ap.parse_args(argv)
    from router_r1.pool.registry import ModelRegistry
    from tools.analysis.route_probs import best_per_domain
    arms = collect(args.out, best_per_domain(args.pool, list(ModelRegistry.from_yaml(args.pool).seen().models)))
    if not arms:
        raise SystemExit(f"summarize: no evaluated <arm>_s<seed> run in {args.out}")
    text = table(arms)
    print(text)
    if args.records:
        args.records.mkdir(parents=True, exist_ok=True)
        (args.records / "table.md").write_text(text + "\n")
        for arm, seeds in arms.items():
            for s in seeds:
                probs = args.out / f"{arm}_s{s}" / "route_probs.md"
                if probs.exists():
                    shutil.copyfile(probs, args.records / f"{arm}_s{s}_route_probs.md")
    return 0


if __name__ == "__main__":
    sys.exit(main())
