"""Summarise the runs of experiments/streaming/run_streaming.sh (issue 30): per run steps per hour, samples
per second, tokens per second per GPU (prompt + generated over the whole step, NeMo-RL's unit),
staleness, drops and importance weights; each run's speedup against sync; reward, format and EM
against samples trained, as summary.json, throughput.png and learning_curves.png.

    python -m experiments.streaming.summarize DIR [--gpus 1]   # DIR/<phase>/<run>_metrics.jsonl[.gz]
"""
from __future__ import annotations

import argparse
import gzip
import json
import statistics
from pathlib import Path

CURVES = {"reward": "reward/mean", "format_ok": "format_ok/mean", "em": "em/mean"}
STREAM = ("stream/staleness_mean", "stream/staleness_max", "stream/partial_frac", "offpolicy/is_weight_min",
          "offpolicy/is_weight_max", "offpolicy/is_truncated_frac", "timing/rollout_wait", "timing/stream_drain",
          "timing/decode", "timing/train")


def read_metrics(path: Path) -> list[dict]:
    """The training steps of a metrics file (.jsonl or .jsonl.gz); validation-only rows are skipped."""
    opener = gzip.open if path.suffix == ".gz" else open
    with opener(path, "rt") as f:
        rows = [json.loads(line) for line in f if line.strip()]
    return [r for r in rows if "timing/step" in r]


def summarize_run(rows: list[dict], gpus: int) -> dict:
    """Throughput over steps 2.. (step 1 carries warm-up and, in every mode, plays on-policy from scratch)."""
    if len(rows) < 2:
        raise ValueError(f"a run needs at least 2 training steps to summarise, got {len(rows)}")
    later = rows[1:]
    mean_step = statistics.fmean(r["timing/step"] for r in later)
    episodes = [r["episodes"] for r in rows]
    out = {"steps": len(rows), "episodes_per_step": episodes[0],
           "median_step_s": round(statistics.median(r["timing/step"] for r in later), 3),
           "mean_step_s": round(mean_step, 3),
           "steps_per_hour": round(3600 / mean_step, 1),
           "samples_per_s": round(statistics.fmean(episodes[1:]) / mean_step, 2),
           "tokens_per_s_per_gpu": round(statistics.median(r["timing/tokens_per_s"] for r in later) / gpus, 1),
           "dropped_total": max((r.get("stream/dropped_total", 0.0) for r in rows), default=0.0)}
    for key in STREAM:
        vals = [r[key] for r in later if key in r]
        if vals:
            out[f"median {key}"] = round(statistics.median(vals), 4)
    samples, total = [], 0
    for n in episodes:
        total += n
        samples.append(total)
    out["samples"] = samples
    for name, key in CURVES.items():
        out[name] = [round(r[key], 4) for r in rows if key in r]
    return out


def at_equal_samples(runs: dict) -> dict:
    """Mean reward / format / EM over the first N samples, N the fewest any run trained, with the standard
    error of that mean from the spread of its steps (a trend inflates it: an upper bound on the noise)."""
    n = int(min(r["samples"][-1] for r in runs.values()))
    out = {"samples": n}
    for name, r in runs.items():
        k = sum(s <= n for s in r["samples"])
        out[name] = {}
        for c in CURVES:
            vals = r[c][:k]
            if vals:
                out[name][c] = round(statistics.fmean(vals), 4)
                out[name][f"{c}_se"] = round(statistics.stdev(vals) / len(vals) ** 0.5, 4) if len(vals) > 1 else 0.0
    return out


def summarize(root: Path, gpus: int) -> dict:
    runs = {}
    for path in sorted(root.glob("*/*_metrics.jsonl*")):
        rows = read_metrics(path)
        for r in rows:  # episodes trained this step: the batch the update saw
            r["episodes"] = r["batch/episodes"]
        runs[f"{path.parent.name}/{path.name.split('_metrics')[0]}"] = summarize_run(rows, gpus)
    base = [v for k, v in runs.items() if k.endswith("/sync")]
    speedup = {}
    if base:
        sync_hour = statistics.fmean(b["steps_per_hour"] for b in base)
        speedup = {k: round(v["steps_per_hour"] / sync_hour, 3) for k, v in runs.items()}
    return {"runs": runs, "steps_per_hour_vs_sync": speedup, "at_equal_samples": at_equal_samples(runs) if runs else {}}


def _colour(name: str, runs: list[str]):
    """Sync runs in greys, the others in the default cycle: the baseline reads at a glance."""
    others = [r for r in runs if not r.endswith("/sync")]
    if name.endswith("/sync"):
        return "0.15" if name.startswith(runs[0].split("/")[0]) else "0.55"
    return f"C{others.index(name)}"


def plot(summary: dict, out: Path) -> list[Path]:
    """throughput.png (steps per hour, tokens/s/GPU, per run) and learning_curves.png (per samples trained)."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    runs = summary["runs"]
    names = list(runs)
    colours = [_colour(n, names) for n in names]
    fig, axes = plt.subplots(1, 2, figsize=(11, 3.8))
    for ax, key, label in ((axes[0], "steps_per_hour", "training steps per hour"),
                           (axes[1], "tokens_per_s_per_gpu", "tokens/s per GPU")):
        vals = [runs[n][key] for n in names]
        bars = ax.bar(range(len(names)), vals, color=colours)
        ax.set_xticks(range(len(names)), names, rotation=30, ha="right", fontsize=8)
        ax.set_ylabel(label)
        for bar, n in zip(bars, names):
            speed = summary["steps_per_hour_vs_sync"].get(n)
            if speed is not None:
                ax.annotate(f"{speed:.2f}x", (bar.get_x() + bar.get_width() / 2, bar.get_height()),
                            ha="center", va="bottom", fontsize=8)
    axes[0].set_title("steps per hour (label: vs mean sync)", fontsize=9)
    axes[1].set_title("trained tokens (prompt + generated) / whole step time", fontsize=9)
    fig.tight_layout()
    paths = [out / "throughput.png"]
    fig.savefig(paths[0], dpi=100)
    plt.close(fig)

    fig, axes = plt.subplots(1, 3, figsize=(13, 3.8))
    for name, colour in zip(names, colours):
        run = runs[name]
        for ax, key in zip(axes, CURVES):
            if run[key]:
                ax.plot(run["samples"][:len(run[key])], run[key], marker=".", color=colour, label=name,
                        lw=2 if name.endswith("/sync") else 1)
    for ax, key in zip(axes, CURVES):
        ax.set(xlabel="episodes trained", ylabel=f"training {key} (mean over the step)")
        ax.axvline(summary["at_equal_samples"]["samples"], color="0.7", ls=":", lw=1)
    axes[0].set_title("dotted: the equal-samples cut", fontsize=9)
    axes[0].legend(fontsize=7)
    fig.tight_layout()
    paths.append(out / "learning_curves.png")
    fig.savefig(paths[1], dpi=100)
    plt.close(fig)
    return paths


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("dir", type=Path, help="the folder with <phase>/<run>_metrics.jsonl")
    p.add_argument("--gpus", type=int, default=1, help="GPUs the runs used (tokens/s per GPU)")
    args = p.parse_args(argv)
    summary = summarize(args.dir, args.gpus)
    if not summary["runs"]:
        raise SystemExit(f"{args.dir}: no <phase>/<run>_metrics.jsonl files")
    (args.dir / "summary.json").write_text(json.dumps(summary, indent=1) + "\n")
    print(f"{'run':24s} {'steps':>5} {'median s':>8} {'steps/h':>8} {'samples/s':>9} {'tok/s/GPU':>9} "
          f"{'vs sync':>7} {'staleness':>9} {'dropped':>7}")
    for name, r in summary["runs"].items():
        print(f"{name:24s} {r['steps']:5d} {r['median_step_s']:8.2f} {r['steps_per_hour']:8.0f} "
              f"{r['samples_per_s']:9.2f} {r['tokens_per_s_per_gpu']:9.0f} "
              f"{summary['steps_per_hour_vs_sync'].get(name, float('nan')):7.2f} "
              f"{r.get('median stream/staleness_mean', 0.0):9.2f} {r['dropped_total']:7.0f}")
    eq = summary["at_equal_samples"]
    print(f"means over the first {eq['samples']} episodes (+- one standard error over steps):")
    for k, m in eq.items():
        if k != "samples":
            print(f"  {k:22s} " + "  ".join(f"{c} {m[c]:.3f} +- {m[c + '_se']:.3f}" for c in CURVES if c in m))
    print("plots: " + ", ".join(str(p) for p in plot(summary, args.dir)))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
