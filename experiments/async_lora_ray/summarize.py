"""Summarise the H200 runs of experiments/async_lora_ray/run_async_lora_ray.sh: step time and its parts per run,
the paired ratios (off-policy vs on-policy, LoRA vs full, Ray vs single process) and the training
curves, as summary.json and two PNGs.

    python -m experiments.async_lora_ray.summarize DIR     # DIR holds ppo/, ray/, streams/ (metrics JSONL)
"""
from __future__ import annotations

import argparse
import gzip
import json
import statistics
from pathlib import Path

PARTS = ("rollout_wait", "decode", "env_wait", "old_log_prob", "ref", "values", "update_critic", "train")
MIXTRAL = "calls/Mixtral-8x22B-Instruct/mean"
PAIRS = {  # (phase, baseline run, compared run): what the ratio says
    "offpolicy_vs_onpolicy": ("ppo", "onpolicy", "offpolicy"),
    "offpolicy_vs_onpolicy_own_stream": ("streams", "onpolicy", "offpolicy"),
    "lora_vs_full": ("ppo", "onpolicy", "lora"),
    "ray_vs_single_process": ("ray", "spmd", "ray"),
}


def read_metrics(path: Path) -> list[dict]:
    """The training steps of a metrics file (.jsonl or .jsonl.gz); validation-only rows are skipped."""
    opener = gzip.open if path.suffix == ".gz" else open
    with opener(path, "rt") as f:
        rows = [json.loads(line) for line in f if line.strip()]
    return [r for r in rows if "timing/step" in r]


def summarize_run(rows: list[dict]) -> dict:
    """Median step time (steps 2.. : step 1 carries warm-up and plays on-policy in every mode), its parts,
    and the per-step curves."""
    if len(rows) < 2:
        raise ValueError(f"a run needs at least 2 training steps to summarise, got {len(rows)}")
    later = rows[1:]
    out = {"steps": len(rows),
           "median_step_s": statistics.median(r["timing/step"] for r in later),
           "mean_step_s": statistics.fmean(r["timing/step"] for r in later),
           "median_parts_s": {p: statistics.median(r[f"timing/{p}"] for r in later)
                              for p in PARTS if f"timing/{p}" in later[0]}}
    for key, name in (("reward/mean", "reward"), ("format_ok/mean", "format_ok"), (MIXTRAL, "mixtral_calls")):
        out[name] = [round(r[key], 4) for r in rows if key in r]
    return out


def summarize(root: Path) -> dict:
    runs = {}
    for path in sorted(root.glob("*/*_metrics.jsonl*")):
        name = path.name.split("_metrics")[0]
        runs[f"{path.parent.name}/{name}"] = summarize_run(read_metrics(path))
    ratios = {}
    for label, (phase, base, other) in PAIRS.items():
        a, b = runs.get(f"{phase}/{base}"), runs.get(f"{phase}/{other}")
        if a and b:  # > 1: the compared run's step is faster
            ratios[label] = round(a["median_step_s"] / b["median_step_s"], 3)
    return {"runs": runs, "speedup_median_step": ratios}


def plot(summary: dict, out: Path) -> list[Path]:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    runs = summary["runs"]
    names = list(runs)
    fig, ax = plt.subplots(figsize=(9, 4))
    shown = ("rollout_wait", "old_log_prob", "ref", "values", "update_critic")
    for i, name in enumerate(names):
        parts, bottom = runs[name]["median_parts_s"], 0.0
        for j, p in enumerate(shown):
            v = parts.get(p, 0.0)
            ax.bar(i, v, bottom=bottom, color=f"C{j}", label=p if i == 0 else None)
            bottom += v
        rest = runs[name]["median_step_s"] - bottom  # the actor update and bookkeeping
        ax.bar(i, max(rest, 0.0), bottom=bottom, color="C9", label="actor update + rest" if i == 0 else None)
    ax.set_xticks(range(len(names)), names, rotation=20, ha="right")
    ax.set_ylabel("median seconds per PPO step (steps 2..)")
    ax.legend(fontsize=8, ncol=2)
    fig.tight_layout()
    times = out / "step_time_parts.png"
    fig.savefig(times, dpi=100)
    plt.close(fig)

    fig, axes = plt.subplots(1, 2, figsize=(10, 3.6))
    for name in ("ppo/onpolicy", "ppo/lora", "ppo/offpolicy"):
        if name in runs:
            for a, key in zip(axes, ("format_ok", "mixtral_calls")):
                a.plot(range(1, len(runs[name][key]) + 1), runs[name][key], marker=".", label=name.split("/")[1])
    axes[0].set(xlabel="PPO step", ylabel="training format-ok rate")
    axes[1].set(xlabel="PPO step", ylabel="Mixtral-8x22B calls per episode")
    axes[0].legend()
    fig.tight_layout()
    curves = out / "training_curves.png"
    fig.savefig(curves, dpi=100)
    plt.close(fig)
    return [times, curves]


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("dir", type=Path, help="the folder with ppo/, ray/, streams/")
    args = p.parse_args(argv)
    summary = summarize(args.dir)
    (args.dir / "summary.json").write_text(json.dumps(summary, indent=1) + "\n")
    for name, run in summary["runs"].items():
        print(f"{name:18s} {run['steps']:3d} steps  median step {run['median_step_s']:.2f} s  " +
              " ".join(f"{k} {v:.2f}" for k, v in run["median_parts_s"].items()))
    for label, ratio in summary["speedup_median_step"].items():
        print(f"speedup {label}: {ratio:.2f}x")
    for path in plot(summary, args.dir):
        print(f"plot: {path}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
