"""Curves of several PPO runs of the embedded default side by side (e.g. alpha 0 and alpha 0.6).

    python -m tools.analysis.plot_runs --run "alpha 0=ppo_metrics.jsonl" \
        --run "alpha 0.6=alpha06_ppo_metrics.jsonl" --out curves.png

Training metrics (sampled rollouts, 32 per step) are smoothed with a moving average of
`--window` steps; validation metrics (greedy, every test_freq steps) are drawn as they are.
"""
from __future__ import annotations

import argparse
from pathlib import Path

from verl.trainer.tracking import read_jsonl

BIG = "Mixtral-8x22B-Instruct"  # the strongest and dearest generalist, the cautious annotator's choice
METRICS = [  # (title, key, scale), drawn for validation and training; {how} says how the rollouts were decoded
    ("EM ({how})", "em/mean", 1.0),
    ("reward ({how})", "reward/mean", 1.0),
    ("cost (1e-6 USD / question)", "cost_usd/mean", 1e6),
    (f"calls to {BIG} / question", f"calls/{BIG}/mean", 1.0),
    ("pool calls / question", "route_count/mean", 1.0),
    ("format ok", "format_ok/mean", 1.0),
]
PANELS = [(f"{split} " + title.format(how=how), prefix + key, scale)  # (title, key, scale): val's row, then train's
          for split, prefix, how in (("val", "val/", "greedy"), ("train", "", "sampled"))
          for title, key, scale in METRICS]


def metrics_rows(path: Path) -> list[dict]:
    """A run's metrics.jsonl rows (verl.trainer.tracking.read_jsonl); an empty file is an error naming it."""
    rows = read_jsonl(path)
    if not rows:
        raise ValueError(f"{path}: no metrics rows")
    return rows


def smooth(values: list[float], window: int) -> list[float]:
    """Trailing moving average (the first points average what exists so far)."""
    out = []
    for i in range(len(values)):
        chunk = values[max(0, i - window + 1): i + 1]
        out.append(sum(chunk) / len(chunk))
    return out


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--run", action="append", required=True, help="LABEL=metrics.jsonl (repeatable)")
    p.add_argument("--out", required=True, help="the PNG to write")
    p.add_argument("--window", type=int, default=5, help="steps of the moving average drawn over each curve")
    args = p.parse_args(argv)
    runs = []
    for spec in args.run:
        label, sep, path = spec.partition("=")
        if not sep:
            raise SystemExit(f"--run {spec!r}: expected LABEL=path")
        runs.append((label, metrics_rows(Path(path))))

    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(4, 3, figsize=(13, 12))
    for ax, (title, key, scale) in zip(axes.flat, PANELS):
        for label, rows in runs:
            pts = [(r["step"], scale * r[key]) for r in rows if key in r]
            if not pts:
                continue
            xs, ys = [x for x, _ in pts], [y for _, y in pts]
            if not key.startswith("val/"):
                ys = smooth(ys, args.window)
            ax.plot(xs, ys, marker="." if key.startswith("val/") else None, lw=1.2, label=label)
        ax.set_title(title + ("" if key.startswith("val/") else f", {args.window}-step mean"), fontsize=9)
        ax.set_xlabel("PPO step")
        ax.grid(alpha=0.3)
    axes.flat[0].legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(args.out, dpi=100)
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
