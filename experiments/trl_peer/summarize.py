"""Our GRPO against TRL's GRPOTrainer: the batch reward against samples seen, per trainer over seeds.

    python -m experiments.trl_peer.summarize --collect OUT --records docs/results/trl_peer   # copy, then build
    python -m experiments.trl_peer.summarize --records docs/results/trl_peer                 # rebuild from records

--collect copies each run's curve.jsonl (OUT/<ours|peer>/seed<N>/curve.jsonl) into records/curves/ (records may
keep them gzipped, .jsonl.gz); table.md, summary.json and reward.png are then built from the records alone. A
window pools WINDOW steps of every seed; a seed's two runs see the same questions in the same order, so ours - TRL
is paired by (seed, step) and its 95% interval is a bootstrap over those pairs. Steps of one run are not
independent (one policy walks through them), so that interval is narrower than one over seeds; the per-seed
differences are printed beside it.
"""
from __future__ import annotations

import argparse
import io
import json
import shutil
from pathlib import Path

import numpy as np

from experiments.trl_peer.settings import read_curve

TRAINERS = {"ours": "ours (verl GRPO)", "trl": "TRL GRPOTrainer"}
RUN_DIRS = {"ours": "ours", "peer": "trl"}  # run.sh's folder -> the trainer named in its curve
WINDOW = 5  # steps per table row
BOOT = 2000


def collect(runs: Path, records: Path) -> list[Path]:
    """OUT/<ours|peer>/seed<N>/curve.jsonl -> records/curves/<trainer>_seed<N>.jsonl."""
    dest = records / "curves"
    dest.mkdir(parents=True, exist_ok=True)
    copied = []
    for folder, trainer in RUN_DIRS.items():
        for src in sorted((runs / folder).glob("seed*/curve.jsonl")):
            copied.append(Path(shutil.copyfile(src, dest / f"{trainer}_{src.parent.name}.jsonl")))
    if not copied:
        raise ValueError(f"{runs}: no <ours|peer>/seed<N>/curve.jsonl")
    return copied


def load(records: Path) -> dict[str, dict[int, list[dict]]]:
    """trainer -> seed -> its rows by step; ValueError when a trainer is missing or the seeds' steps differ."""
    runs: dict[str, dict[int, list[dict]]] = {t: {} for t in TRAINERS}
    curves = records / "curves"
    for path in sorted([*curves.glob("*.jsonl"), *curves.glob("*.jsonl.gz")]):
        rows = read_curve(path)
        t, seed = rows[0]["trainer"], rows[0]["seed"]
        if t not in runs:
            raise ValueError(f"{path}: unknown trainer {t!r} (known: {', '.join(TRAINERS)})")
        runs[t][seed] = sorted(rows, key=lambda r: r["step"])
    for t, seeds in runs.items():
        if not seeds:
            raise ValueError(f"{records}/curves: no {t} run")
    if len({tuple(r["samples"] for r in rows) for s in runs.values() for rows in s.values()}) != 1:
        raise ValueError(f"{records}/curves: the runs' steps or samples per step differ")
    if runs["ours"].keys() != runs["trl"].keys():
        raise ValueError(f"{records}/curves: seeds differ (ours {sorted(runs['ours'])}, trl {sorted(runs['trl'])})")
    return runs


def rewards(runs: dict, trainer: str) -> np.ndarray:
    """(seeds, steps) batch rewards, seeds in order."""
    return np.array([[r["reward"] for r in runs[trainer][s]] for s in sorted(runs[trainer])])


def paired_ci(diff: np.ndarray, seed: int = 0) -> list[float]:
    """95% bootstrap interval of the mean of `diff` (resampling its entries)."""
    rng = np.random.default_rng(seed)
    means = diff[rng.integers(0, diff.size, size=(BOOT, diff.size))].mean(axis=1)
    return [round(float(np.quantile(means, 0.025)), 4), round(float(np.quantile(means, 0.975)), 4)]


def summarize(runs: dict) -> dict:
    ours, trl = rewards(runs, "ours"), rewards(runs, "trl")
    samples = [r["samples"] for r in next(iter(runs["ours"].values()))]
    windows = []
    for start in range(0, len(samples), WINDOW):
        sl = slice(start, start + WINDOW)
        diff = (ours[:, sl] - trl[:, sl]).ravel()
        windows.append({"samples": [samples[sl][0] - samples[0] + 1, samples[sl][-1]],
                        "ours": round(float(ours[:, sl].mean()), 4), "trl": round(float(trl[:, sl].mean()), 4),
                        "ours_seed_range": [round(float(x), 4) for x in (ours[:, sl].mean(1).min(), ours[:, sl].mean(1).max())],
                        "trl_seed_range": [round(float(x), 4) for x in (trl[:, sl].mean(1).min(), trl[:, sl].mean(1).max())],
                        "ours_minus_trl": round(float(diff.mean()), 4), "ci95": paired_ci(diff, start)})
    step_s = {t: [r["step_s"] for s in runs[t].values() for r in s if r["step_s"] is not None] for t in TRAINERS}
    whole = (ours - trl).ravel()
    return {"seeds": sorted(runs["ours"]), "steps": len(samples), "samples_per_step": samples[0],
            "samples": samples, "reward_per_step": {t: [round(float(x), 4) for x in rewards(runs, t).mean(0)]
                                                    for t in TRAINERS},
            "windows": windows,
            "overall": {"ours": round(float(ours.mean()), 4), "trl": round(float(trl.mean()), 4),
                        "ours_minus_trl": round(float(whole.mean()), 4), "ci95": paired_ci(whole)},
            "per_seed_ours_minus_trl": {str(seed): round(float(d), 4)
                                        for seed, d in zip(sorted(runs["ours"]), (ours - trl).mean(1))},
            "windows_ours_below_trl_ci": sum(w["ci95"][1] < 0 for w in windows),
            "median_step_s": {t: round(float(np.median(v)), 2) if v else None for t, v in step_s.items()}}


def table(s: dict) -> str:
    lines = [f"Mean batch reward over seeds {', '.join(map(str, s['seeds']))} ({s['samples_per_step']} samples a step, "
             f"{WINDOW} steps a row; seed range in brackets)", "",
             "| samples seen | ours (verl GRPO) | TRL GRPOTrainer | ours - TRL [95% CI] |", "|---|---|---|---|"]
    for w in s["windows"] + [{"samples": ["all", ""], **s["overall"], "ours_seed_range": None}]:
        span = f"{w['samples'][0]}-{w['samples'][1]}" if w["samples"][1] != "" else "all"
        rng = lambda k: "" if w.get("ours_seed_range") is None else f" [{w[k][0]:.3f}, {w[k][1]:.3f}]"  # noqa: E731
        lines.append(f"| {span} | {w['ours']:.3f}{rng('ours_seed_range')} | {w['trl']:.3f}{rng('trl_seed_range')} | "
                     f"{w['ours_minus_trl']:+.3f} [{w['ci95'][0]:+.3f}, {w['ci95'][1]:+.3f}] |")
    t = s["median_step_s"]
    per_seed = ", ".join(f"seed {k} {v:+.3f}" for k, v in s["per_seed_ours_minus_trl"].items())
    lines += ["", f"Ours - TRL over all steps, per seed: {per_seed}.",
              f"Windows where ours is below TRL (CI under 0): {s['windows_ours_below_trl_ci']} of {len(s['windows'])}. "
              f"Median seconds per step (generation, reward, update; shared 2-core machine): ours {t['ours']}, "
              f"TRL {t['trl']}."]
    return "\n".join(lines) + "\n"


def plot(runs: dict, s: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(8, 4.5), dpi=110)
    x = s["samples"]
    for t, color in (("ours", "tab:blue"), ("trl", "tab:orange")):
        r = rewards(runs, t)
        for row in r:
            ax.plot(x, row, color=color, alpha=0.25, lw=0.8)
        ax.plot(x, r.mean(0), color=color, lw=2, label=f"{TRAINERS[t]}: mean of {len(r)} seeds")
    ax.plot([], [], color="gray", alpha=0.4, lw=0.8, label="one seed")
    ax.set_xlabel("samples seen")
    ax.set_ylabel("mean reward of the step's batch (route EM)")
    ax.set_title("Single-turn routing, 1-hop questions: GRPO from the same warm start")
    every = np.concatenate([rewards(runs, t).ravel() for t in TRAINERS])
    ax.set_ylim(max(0.0, every.min() - 0.05), min(1.0, every.max() + 0.05))
    ax.grid(alpha=0.3)
    ax.legend(loc="lower right", fontsize=8)
    fig.tight_layout()
    buf = io.BytesIO()
    fig.savefig(buf, format="png")
    plt.close(fig)
    from PIL import Image

    Image.open(buf).convert("RGB").quantize(24).save(path, optimize=True)  # a palette: docs/ keeps plots small


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--records", required=True, help="the records folder (docs/results/trl_peer)")
    p.add_argument("--collect", default=None, help="run.sh's OUT: copy its curves into the records first")
    a = p.parse_args(argv)
    records = Path(a.records)
    if a.collect:
        collect(Path(a.collect), records)
    runs = load(records)
    s = summarize(runs)
    (records / "summary.json").write_text(json.dumps(s, indent=1) + "\n")
    text = table(s)
    (records / "table.md").write_text(text)
    plot(runs, s, records / "reward.png")
    print(text, end="")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
