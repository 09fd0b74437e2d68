"""RL above its warm start over 3 seeds: per seed the fresh warm start, PPO and GRPO (paired test EM and cost),
the mean and spread over seeds, the baselines, and the training curves.

    python -m experiments.rl_seeds.summarize --collect /tmp/rl_seeds --records docs/results/rl_seeds
    python -m experiments.rl_seeds.summarize --records docs/results/rl_seeds        # rebuild from records

--collect copies each run's metrics and evaluation summary (gzipped) into the records (rl_warm_start's format);
table.md, summary.json and curves.png are then built from the records alone.
"""
from __future__ import annotations

import gzip
import json
import re
import statistics
from pathlib import Path

from experiments.rl_warm_start.summarize import EVAL, METRICS, arm_summary, records_from_cli, save_small
from verl.trainer.tracking import read_jsonl

ARM = re.compile(r"^(ppo|grpo)_s(\d+)$")
CURVES = (("val/em/mean", "greedy val EM (100 questions)"), ("reward/mean", "sampled training reward (10-step mean)"),
          ("format_ok/mean", "sampled format rate (10-step mean)"))
SMOOTH = 10  # steps averaged in the sampled panels: one step's 64 episodes are noisy


def runs_by_seed(records: Path) -> dict[int, dict[str, dict]]:
    """{seed: {"ppo": arm summary, "grpo": ...}} for every records/<algo>_s<seed> folder with an evaluation."""
    out: dict[int, dict[str, dict]] = {}
    for d in sorted(records.iterdir()):
        m = ARM.match(d.name)
        if m and (d / EVAL).exists():
            out.setdefault(int(m.group(2)), {})[m.group(1)] = arm_summary(d)
    return out


def baselines(records: Path) -> list[dict]:
    """Every non-router run of the first evaluation that has baselines: label, EM, cost (1e-6 USD)."""
    for d in sorted(records.iterdir()):
        if not (d / EVAL).exists():
            continue
        with gzip.open(d / EVAL, "rt") as f:
            runs = json.load(f)["runs"]
        rows = [{"run": r["label"], "em": r["overall"]["em"], "cost_1e6": r["overall"]["cost_usd"] * 1e6}
                for r in runs if r.get("kind") != "router"]
        if rows:
            return rows
    return []


def _diff(a: dict) -> str:
    lo, hi = (x + 0.0 for x in a["rl_minus_sft_ci95"])  # + 0.0: no "-0.000"
    return f"{a['rl_minus_sft'] + 0.0:+.3f} [{lo:+.3f}, {hi:+.3f}]"


def _spread(xs: list[float]) -> str:
    return f"{statistics.mean(xs):+.3f} (min {min(xs):+.3f}, max {max(xs):+.3f})" if xs else "-"


def table(seeds: dict[int, dict[str, dict]], base: list[dict]) -> str:
    lines = ["| seed | warm start EM | PPO EM | PPO - SFT [95% CI] | PPO cost - SFT | GRPO EM | GRPO - SFT [95% CI] "
             "| GRPO cost - SFT |", "|---|---|---|---|---|---|---|---|"]
    for s, arms in sorted(seeds.items()):
        any_arm = next(iter(arms.values()))
        cells = [str(s), f"{any_arm['test_em_sft']:.3f}"]
        for algo in ("ppo", "grpo"):
            a = arms.get(algo)
            cells += ([f"{a['test_em_rl']:.3f}", _diff(a), f"{a['cost_rl_minus_sft_1e6']:+.2f}"] if a else ["-"] * 3)
        lines.append("| " + " | ".join(cells) + " |")
    for algo in ("ppo", "grpo"):
        diffs = [arms[algo]["rl_minus_sft"] for arms in seeds.values() if algo in arms]
        lines.append(f"\n{algo.upper()} - SFT over {len(diffs)} seeds: {_spread(diffs)}; CI above 0 in "
                     f"{sum(arms[algo]['rl_minus_sft_ci95'][0] > 0 for arms in seeds.values() if algo in arms)}")
    if base:
        lines += ["", "| baseline (same test questions) | EM | cost (1e-6 USD) |", "|---|---|---|"]
        lines += [f"| {b['run']} | {b['em']:.3f} | {b['cost_1e6']:.2f} |" for b in base]
    return "\n".join(lines) + "\n"


def plot(records: Path, seeds: dict[int, dict[str, dict]], out: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, len(CURVES), figsize=(12.0, 3.4), dpi=80)
    colours = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    for i, (s, arms) in enumerate(sorted(seeds.items())):
        for algo, style in (("ppo", "-"), ("grpo", "--")):
            if algo not in arms:
                continue
            rows = read_jsonl(records / f"{algo}_s{s}" / METRICS)
            for ax, (key, _) in zip(axes, CURVES):
                pts = [(r["step"], r[key]) for r in rows if key in r]
                if not key.startswith("val/"):
                    pts = [(x, statistics.mean(y for _, y in pts[max(0, i - SMOOTH + 1):i + 1]))
                           for i, (x, _) in enumerate(pts)]
                if pts:
                    ax.plot(*zip(*pts), style, color=colours[i % len(colours)], lw=1.2,
                            label=f"{algo.upper()} seed {s}")
    for ax, (_, title) in zip(axes, CURVES):
        ax.set_xlabel("RL step")
        ax.set_title(title, fontsize=10)
        ax.grid(alpha=0.3)
    axes[0].legend(fontsize=7)
    fig.tight_layout()
    save_small(fig, out)


def main(argv=None) -> int:
    records = records_from_cli(argv, __doc__, "docs/results/rl_seeds")
    seeds = runs_by_seed(records)
    if not seeds:
        raise SystemExit(f"{records}: no ppo_s<N>/grpo_s<N> folder with {EVAL}")
    base = baselines(records)
    (records / "summary.json").write_text(json.dumps({"seeds": seeds, "baselines": base}, indent=1) + "\n")
    (records / "table.md").write_text(table(seeds, base))
    plot(records, seeds, records / "curves.png")
    print(table(seeds, base), end="")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
