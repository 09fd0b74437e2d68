"""Evaluation report: per-source metrics with a bootstrap CI, console table, JSON, JSONL, Pareto PNG.

Input is a list of scored trajectory records (dicts made by router_r1.eval.evaluate), one
per question, with at least: data_source, em, f1, format_ok, cost_usd, cost_reward,
reward, route_count, pool_failures, hit_budget, models_called, and `turns` (a pool call's
turn carries ok, error, latency_s, cached).

Pool health is reported per call, not per question: `pool_failure_rate` = failed calls /
calls, `pool_errors` counts the failures by kind, and `pool_latency_p50_s` / `p95` are
over the calls that went to the pool (cache hits left out; a failed call counts with the
time it took to fail).
"""
from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np

from router_r1.pool.health import call_stats
from router_r1.routing_collapse import call_counts, shares_entropy

OVERALL = "overall"


def bootstrap_ci(values, n_resamples: int = 1000, seed: int = 0, level: float = 0.95) -> tuple[float, float]:
    """Percentile bootstrap CI of the mean: resample with replacement `n_resamples` times (seeded)."""
    x = np.asarray(values, dtype=np.float64)  # (n,)
    if x.size == 0:
        return math.nan, math.nan
    rng = np.random.default_rng(seed)
    idx = rng.integers(0, x.size, size=(n_resamples, x.size))  # (n_resamples, n)
    means = x[idx].mean(axis=1)  # (n_resamples,)
    tail = 100.0 * (1.0 - level) / 2.0
    lo, hi = np.percentile(means, [tail, 100.0 - tail])
    return float(lo), float(hi)


def _mean(trajs: list[dict], key: str) -> float:
    return float(np.mean([float(t[key]) for t in trajs])) if trajs else math.nan


def pool_health(trajs: list[dict]) -> dict:
    """Calls, failure rate, failures by error kind, latency p50/p95 (s) of the calls made over HTTP."""
    st = call_stats([t.get("turns", []) for t in trajs])
    return {"pool_calls": st["calls"], "pool_failed": st["failed"], "pool_failure_rate": st["failure_rate"],
            "pool_errors": st["errors"], "pool_latency_p50_s": st["latency_p50_s"],
            "pool_latency_p95_s": st["latency_p95_s"]}


def metrics(trajs: list[dict], model_names: list[str], seed: int = 0) -> dict:
    """Means over one group of trajectories, EM with its 95% bootstrap CI, pool health, pool-model shares,
    and the routing-collapse diagnostic: each model's share of the calls and their entropy in bits."""
    em_lo, em_hi = bootstrap_ci([t["em"] for t in trajs], seed=seed)
    cost = _mean(trajs, "cost_usd")
    call_share, entropy = shares_entropy(call_counts([t.get("turns", []) for t in trajs], model_names))
    return {
        **pool_health(trajs),
        "n": len(trajs),
        "em": _mean(trajs, "em"),
        "em_ci95": [em_lo, em_hi],
        "f1": _mean(trajs, "f1"),
        "format_ok": _mean(trajs, "format_ok"),
        "cost_usd": cost,
        "cost_1e6_usd": cost * 1e6,
        "cost_reward": _mean(trajs, "cost_reward"),
        "reward": _mean(trajs, "reward"),
        "calls": _mean(trajs, "route_count"),
        "pool_failures": _mean(trajs, "pool_failures"),
        "hit_budget": _mean(trajs, "hit_budget"),
        "forced": float(np.mean([float(t.get("forced", False)) for t in trajs])) if trajs else math.nan,
        "truncated": float(np.mean([float(t.get("truncated", False)) for t in trajs])) if trajs else math.nan,
        # share of questions that called the model at least once
        "model_share": {m: float(np.mean([m in t["models_called"] for t in trajs])) if trajs else math.nan
                        for m in model_names},
        "call_share": call_share,
        "routing_entropy_bits": entropy,  # log2(#models) when calls spread evenly, 0 when one model takes all
    }


def summarize(trajs: list[dict], model_names: list[str], seed: int = 0) -> dict:
    """{"sources": {source: metrics}, "overall": metrics + em_macro (mean of the per-source EMs)}."""
    sources = sorted({t["data_source"] for t in trajs})
    per = {s: metrics([t for t in trajs if t["data_source"] == s], model_names, seed) for s in sources}
    overall = metrics(trajs, model_names, seed)
    overall["em_macro"] = float(np.mean([m["em"] for m in per.values()])) if per else math.nan
    return {"sources": per, OVERALL: overall}


# ---------------------------------------------------------------------------------- console

def _short(name: str, width: int = 14) -> str:
    name = name.replace("-Instruct", "")
    return name if len(name) <= width else name[: width - 1] + "~"


def format_table(runs: list[dict]) -> str:
    """Two plain-text tables: the metrics per run and source, then each pool model's share of questions."""
    head = (f"{'run':<28} {'source':<14} {'n':>5} {'EM':>6} {'95% CI':>15} {'F1':>6} {'fmt':>5} "
            f"{'cost 1e-6$':>11} {'cost $':>10} {'R_cost':>6} {'reward':>6} {'calls':>5} "
            f"{'failed':>6} {'p50 s':>6} {'p95 s':>6}")
    lines = [head, "-" * len(head)]
    models: list[str] = []
    for run in runs:
        # only models some run called: a 6-model pool x many runs is wide enough
        models += [n for n, share in run[OVERALL]["model_share"].items() if share > 0 and n not in models]
        for source, m in _named_groups(run):
            lo, hi = m["em_ci95"]
            lines.append(f"{_label(run):<28} {source[:14]:<14} {m['n']:>5} {m['em']:>6.3f} "
                         f"{f'[{lo:.3f}, {hi:.3f}]':>15} {m['f1']:>6.3f} {m['format_ok']:>5.2f} "
                         f"{m['cost_1e6_usd']:>11.2f} {m['cost_usd']:>10.2e} {m['cost_reward']:>6.3f} "
                         f"{m['reward']:>6.3f} {m['calls']:>5.2f} {_rate(m):>6} "
                         f"{_secs(m.get('pool_latency_p50_s')):>6} {_secs(m.get('pool_latency_p95_s')):>6}")
    if models:
        head2 = f"{'share of questions':<43}" + "".join(f" {_short(n):>14}" for n in models) + f" {'H calls':>8}"
        lines += ["", head2, "-" * len(head2)]
        for run in runs:
            for source, m in _named_groups(run):
                h = m.get("routing_entropy_bits", math.nan)
                lines.append(f"{_label(run):<28} {source[:14]:<14}"
                             + "".join(f" {m['model_share'].get(n, 0.0):>14.2f}" for n in models)
                             + (f" {h:>8.2f}" if h == h else f" {'-':>8}"))
    return "\n".join(lines)


def _rate(m: dict) -> str:
    """Share of pool calls that failed; '-' when the group made none (or the summary predates it)."""
    return f"{m['pool_failure_rate']:.2f}" if m.get("pool_calls") else "-"


def _secs(x) -> str:
    return "-" if x is None or not math.isfinite(x) else f"{x:.2f}"


def _label(run: dict) -> str:
    return run["label"].replace("-Instruct", "")[:28]


def _named_groups(run: dict) -> list[tuple[str, dict]]:
    return [*run["sources"].items(), (OVERALL, run[OVERALL])]


# ---------------------------------------------------------------------------------- files

def _clean(x):
    """JSON has no NaN: write null."""
    if isinstance(x, float) and not math.isfinite(x):
        return None
    if isinstance(x, dict):
        return {k: _clean(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [_clean(v) for v in x]
    return x


def write_json(path: str | Path, doc: dict) -> None:
    Path(path).write_text(json.dumps(_clean(doc), indent=2, ensure_ascii=False) + "\n")


def write_jsonl(path: str | Path, records: list[dict], append: bool = False) -> None:
    with open(path, "a" if append else "w", encoding="utf-8") as f:
        for r in records:
            f.write(json.dumps(_clean(r), ensure_ascii=False) + "\n")


def pareto_front(points: list[tuple[float, float]]) -> list[int]:
    """Indices of the (cost, em) points no other point beats (cheaper-or-equal and at least as accurate), by cost."""
    order = sorted(range(len(points)), key=lambda i: (points[i][0], -points[i][1]))
    front, best = [], -math.inf
    for i in order:
        if points[i][1] > best:
            front.append(i)
            best = points[i][1]
    return front


def png_path(out: str | Path) -> Path:
    """Where a plot asked for as `out` is written: a directory gets pareto.png, a name without suffix .png
    (what matplotlib's savefig would do silently)."""
    out = Path(out)
    if out.is_dir():
        return out / "pareto.png"
    return out if out.suffix else out.with_suffix(".png")


def _readable_cost_axis(ax, costs: list[float]) -> None:
    """symlog puts a free method (cost 0) next to paid ones, but labels only decades: when the paid costs
    span less than a decade, no label would show, so place about five plain ones instead."""
    from matplotlib.ticker import FuncFormatter, MaxNLocator

    paid = [c for c in costs if c > 0]
    if paid and max(paid) < 10 * min(paid):
        ax.xaxis.set_major_locator(MaxNLocator(nbins=5))
        ax.xaxis.set_major_formatter(FuncFormatter(lambda v, _: f"{v:.3g}"))


def plot_pareto(runs: list[dict], path: str | Path) -> Path:
    """EM against mean raw cost (1e-6 USD), one panel per data source and one overall, one point per run;
    returns the PNG's path (png_path)."""
    fig = pareto_figure(runs)
    path = png_path(path)
    fig.savefig(path, dpi=110)
    import matplotlib.pyplot as plt

    plt.close(fig)
    return path


def pareto_figure(runs: list[dict]):
    """The figure plot_pareto writes."""
    import matplotlib

    matplotlib.use("Agg")  # files only: no display on a training node
    import matplotlib.pyplot as plt

    panels = sorted({s for run in runs for s in run["sources"]}) + [OVERALL]
    cols = min(3, len(panels))
    rows = math.ceil(len(panels) / cols)
    fig, axes = plt.subplots(rows, cols, figsize=(4.6 * cols, 3.8 * rows + 0.4), squeeze=False)
    colors = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    markers = "osD^v<>ph*"  # colour x marker tells apart up to 100 runs (an alpha sweep and all singles)
    for ax, panel in zip(axes.flat, panels):
        pts = []
        for k, run in enumerate(runs):
            m = run[OVERALL] if panel == OVERALL else run["sources"].get(panel)
            if m is None or not m["n"]:
                continue
            pts.append((m["cost_1e6_usd"], m["em"]))
            ax.scatter([pts[-1][0]], [pts[-1][1]], s=32, color=colors[k % len(colors)],
                       marker=markers[k // len(colors) % len(markers)], label=_label(run), zorder=3)
        front = [pts[i] for i in pareto_front(pts)]
        if len(front) > 1:
            ax.step([p[0] for p in front], [p[1] for p in front], where="post", color="grey", lw=1, ls="--")
        # symlog: a free method (cost 0) sits on the axis next to paid ones
        ax.set_xscale("symlog", linthresh=1.0)
        _readable_cost_axis(ax, [p[0] for p in pts])
        ax.set_title(panel, fontsize=10)
        ax.set_xlabel("mean cost per question (1e-6 USD)")
        ax.set_ylabel("EM")
        ax.set_ylim(-0.02, 1.02)
        ax.grid(alpha=0.3)
    for ax in list(axes.flat)[len(panels):]:
        ax.axis("off")
    handles, labels = axes.flat[len(panels) - 1].get_legend_handles_labels()
    fig.legend(handles, labels, loc="lower center", ncol=min(4, len(labels)), fontsize=8, frameon=False)
    fig.tight_layout(rect=(0, 0.04 + 0.03 * math.ceil(len(labels) / 4), 1, 1))
    return fig


def main(argv: list[str] | None = None) -> int:
    """Join the runs of several summary.json files into one table and one Pareto plot (e.g. an alpha sweep)."""
    import argparse
    import sys

    p = argparse.ArgumentParser(prog="python -m router_r1.eval.report", description=main.__doc__)
    p.add_argument("summaries", nargs="+", help="summary.json files written by router_r1.eval.evaluate")
    p.add_argument("--out", default="pareto.png", help="the PNG to write")
    a = p.parse_args(argv)
    runs = []
    for path in a.summaries:
        try:
            runs += json.loads(Path(path).read_text())["runs"]
        except (OSError, ValueError, KeyError, TypeError) as e:
            print(f"error: {path}: not a summary.json of router_r1.eval.evaluate ({type(e).__name__})",
                  file=sys.stderr)
            return 2
    print(format_table(runs))
    print(f"wrote {plot_pareto(runs, a.out)}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
