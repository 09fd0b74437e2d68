"""The cost-EM trade-off of issue 31's Gemma runs, zoomed onto the routers (the full plot with every single model is
pareto.png): fixed-alpha SFTs, the conditioned router told each alpha (a line in alpha order), oracle-hops.

    python -m experiments.gemma_alpha.plot_tradeoff EVAL_DIR BASELINES_SUMMARY OUT.png [RUNS]
RUNS: the conditioned runs to draw, comma-separated (default cond_think,cond_each; gemma_alpha_s2: cond_think,cond_think_x2).
EVAL_DIR holds run_gemma_alpha.sh's evaluations (fixed_A_A/, cond_think_A/, cond_each_A/, each with its summary.json)
or their summaries as this directory keeps them (summary_cond_think_A.json.gz, ...).
"""
import argparse
import gzip
import json
import re
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402


def overall(path: Path) -> list[tuple[str, float | None, float, float]]:
    """(label, told alpha, cost 1e-6 USD, EM) of each run in one summary.json(.gz)."""
    opener = gzip.open if path.suffix == ".gz" else open
    with opener(path, "rt") as f:
        runs = json.load(f)["runs"]
    return [(r["label"], r.get("told_alpha"), r["overall"]["cost_1e6_usd"], r["overall"]["em"]) for r in runs]


def summaries(ev: Path, name: str) -> list[Path]:
    """The summaries of the runs called name_*: in their evaluation directories, or gzipped side by side."""
    def told(path: Path) -> bool:  # name_<alpha>, not a longer run's name_x2_<alpha>
        stem = path.parent.name if path.name == "summary.json" else path.name[len("summary_"):-len(".json.gz")]
        return not re.match(r"x\d+_", stem[len(name) + 1:])
    found = sorted(ev.glob(f"{name}_*/summary.json")) or sorted(ev.glob(f"summary_{name}_*.json.gz"))
    return [f for f in found if told(f)]


def draw(eval_dir: str, baselines: str, out: str, runs: str = "cond_think,cond_each") -> None:
    """The trade-off plot of the runs in eval_dir against the baselines' oracle-hops point, into out."""
    ev = Path(eval_dir)
    fig, ax = plt.subplots(figsize=(7.5, 5))
    for name, style in zip(runs.split(","), ("o-", "s--", "^:")):
        points = sorted((p for f in summaries(ev, name) for p in overall(f)), key=lambda p: p[1])
        if points:
            ax.plot([p[2] for p in points], [p[3] for p in points], style, label=f"conditioned ({name}), told alpha",
                    alpha=0.8)
            for _, a, c, e in points:
                ax.annotate(f"{a:g}", (c, e), textcoords="offset points", xytext=(4, 4), fontsize=8)
    fixed = sorted(p for f in summaries(ev, "fixed") for p in overall(f))
    for label, _, c, e in fixed:
        alpha = label.split("fixed_")[1].rstrip(")")
        ax.plot(c, e, "k*", markersize=12)
        ax.annotate(f"fixed {alpha}", (c, e), textcoords="offset points", xytext=(5, -12), fontsize=9)
    for label, _, c, e in overall(Path(baselines)):
        if label == "oracle-hops":
            ax.plot(c, e, "D", color="tab:green", markersize=10, markerfacecolor="none", zorder=5,
                    label="oracle-hops (cheapest reliable model per hop)")
    ax.plot([], [], "k*", markersize=12, label="fixed-alpha SFT")
    ax.set_xlabel("mean cost per question (1e-6 USD)")
    ax.set_ylabel("EM (300 test questions)")
    ax.set_title("Gemma 3 270M on sim_tradeoff: one conditioned router vs four fixed-alpha routers")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8, loc="lower right")
    fig.tight_layout()
    fig.savefig(out, dpi=120)


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("eval_dir", help="run_gemma_alpha.sh's evaluations, or a records folder of summary_*.json.gz")
    p.add_argument("baselines", help="the baselines' summary.json(.gz)")
    p.add_argument("out", help="the PNG to write")
    p.add_argument("runs", nargs="?", default="cond_think,cond_each", help="conditioned runs to draw, comma-separated")
    a = p.parse_args(argv)
    draw(a.eval_dir, a.baselines, a.out, a.runs)


if __name__ == "__main__":
    main()
