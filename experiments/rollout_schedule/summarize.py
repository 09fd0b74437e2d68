"""On-policy against one-step off-policy PPO from run_offpolicy.sh's two metrics files: median step time (steps 2..),
rollout wait, reward by step, the speedup, staleness and importance weights; a plot of reward and step time.

    python -m experiments.rollout_schedule.summarize ON_METRICS OFF_METRICS --plot offpolicy.png
    # the CPU record: docs/results/rollout_schedule/offpolicy_cpu/metrics_{on,off}_policy.jsonl.gz
"""
from __future__ import annotations

import argparse
import gzip
import json
import statistics
from pathlib import Path


def steps(path: Path) -> list[dict]:
    """The training steps of a metrics file (.jsonl or .jsonl.gz)."""
    opener = gzip.open if path.suffix == ".gz" else open
    with opener(path, "rt") as f:
        return [r for r in map(json.loads, f) if "timing/step" in r]


def report(rows: dict[int, list[dict]]) -> list[str]:
    """The printed summary; step 1 includes warm-up (and plays on-policy in both), so medians start at step 2."""
    lines = []
    for k, v in rows.items():
        later = [r["timing/step"] for r in v[1:]]
        lines.append(f"off_policy_steps={k}: median step {statistics.median(later):.2f} s over steps 2..{len(v)}; "
                     f"rollout wait {statistics.median(r['timing/rollout_wait'] for r in v[1:]):.2f} s; "
                     f"reward by step " + " ".join(f"{r['reward/mean']:.3f}" for r in v))
    a = statistics.median(r["timing/step"] for r in rows[0][1:])
    b = statistics.median(r["timing/step"] for r in rows[1][1:])
    lines.append(f"speedup off-policy vs on-policy per step: {a / b:.2f}x")
    stale = [r.get("offpolicy/staleness") for r in rows[1]]
    lines.append(f"off-policy staleness by step: {stale}  IS weight mean by step: "
                 f"{[round(r.get('offpolicy/is_weight_mean', float('nan')), 3) for r in rows[1]]}")
    return lines


def plot(rows: dict[int, list[dict]], out: Path) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(1, 2, figsize=(10, 3.5))
    for k, label in ((0, "on-policy"), (1, "one-step off-policy")):
        x = [r["step"] for r in rows[k]]
        ax[0].plot(x, [r["reward/mean"] for r in rows[k]], marker="o", label=label)
        ax[1].plot(x, [r["timing/step"] for r in rows[k]], marker="o", label=label)
    ax[0].set(xlabel="step", ylabel="training reward (mean)")
    ax[1].set(xlabel="step", ylabel="step wall time (s)")
    ax[0].legend()
    fig.tight_layout()
    fig.savefig(out, dpi=100)


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("on_policy", type=Path, help="the on-policy run's metrics.jsonl[.gz]")
    p.add_argument("off_policy", type=Path, help="the one-step off-policy run's metrics.jsonl[.gz]")
    p.add_argument("--plot", type=Path, help="where to draw reward and step time by step (none: no plot)")
    a = p.parse_args(argv)
    rows = {0: steps(a.on_policy), 1: steps(a.off_policy)}
    for k, v in rows.items():
        if len(v) < 2:
            raise SystemExit(f"error: {(a.on_policy, a.off_policy)[k]} has {len(v)} training steps; need 2 or more")
    print("\n".join(report(rows)))
    if a.plot:
        plot(rows, a.plot)
        print(f"plot: {a.plot}")


if __name__ == "__main__":
    main()
