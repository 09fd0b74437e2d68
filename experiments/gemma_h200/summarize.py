"""Tables and a plot from the records of the fourth-session Gemma 3 270M run on the H200
(docs/results/h200/pipeline_gemma_s4: its summary.txt and val_curves.png were made by this script).

    python -m experiments.gemma_h200.summarize [DIR]     # prints the tables, writes DIR/val_curves.png

1. The validation passes inside training (200 val questions, greedy, hf_static: the backend the runs
   trained with) at steps 0, 10, ..., 40 of both runs: EM, format, cost, calls per model.
2. The separate test evaluation (300 questions) ran with the plain hf backend, which on the H200 wrote a
   wrong first token in the first chunk of each generate call (see docs/results/h200/README.md). Its table is given
   whole and on the questions none of whose turns, in any run, starts with anything but a tag.
"""
import argparse
import gzip
import json
from collections import defaultdict
from pathlib import Path

import matplotlib
import numpy as np

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

RECORDS = Path(__file__).resolve().parents[2] / "docs/results/h200/pipeline_gemma_s4"
RUNS = {"alpha 0": "ppo_alpha0", "alpha 0.6": "ppo_alpha0.6"}
MODELS = ("Mixtral-8x22B-Instruct", "LLaMA-3.1-70B-Instruct", "Mistral-7B-Instruct", "Qwen2.5-7B-Instruct")


def val_rows(here: Path, run: str) -> dict[int, dict]:
    """The validation rows of one run's metrics (.jsonl, or .jsonl.gz as docs/results may keep it), by step."""
    path = here / f"{run}_metrics.jsonl"
    text = path.read_text() if path.exists() else gzip.decompress(path.with_suffix(".jsonl.gz").read_bytes()).decode()
    rows = [json.loads(line) for line in text.splitlines()]
    return {r["step"]: r for r in rows if "val/em/mean" in r}


def val_table(here: Path) -> None:
    print("validation inside training (200 questions, greedy, hf_static)")
    print(f"{'run':10s} {'step':>4s} {'EM':>6s} {'fmt':>5s} {'cost 1e-6$':>10s} {'reward':>7s} "
          + " ".join(f"{m.split('-')[0][:8]:>8s}" for m in MODELS))
    for label, run in RUNS.items():
        for step, r in sorted(val_rows(here, run).items()):
            calls = " ".join(f"{r.get(f'val/calls/{m}/mean', 0.0):8.3f}" for m in MODELS)
            print(f"{label:10s} {step:4d} {r['val/em/mean']:6.3f} {r['val/format_ok/mean']:5.2f} "
                  f"{r['val/cost_usd/mean'] * 1e6:10.2f} {r['val/reward/mean']:7.3f} {calls}")


def broken(turns: list[dict]) -> bool:
    """A generated turn that does not open with a tag: the first-token fault of the hf backend."""
    return any(not t["generated"].lstrip().startswith("<") for t in turns if t.get("generated"))


def eval_tables(here: Path) -> None:
    with gzip.open(here / "eval_hf_trajectories.jsonl.gz", "rt") as f:
        trajs = [json.loads(line) for line in f]
    bad_uids = {t["uid"] for t in trajs if broken(t["turns"])}
    for title, keep in (("all 300 test questions", lambda t: True),
                        (f"the {len({t['uid'] for t in trajs} - bad_uids)} questions clean in every run",
                         lambda t: t["uid"] not in bad_uids)):
        print(f"\ntest evaluation (hf backend), {title}")
        print(f"{'run':14s} {'n':>4s} {'1-hop':>6s} {'2-hop':>6s} {'EM':>6s} {'fmt':>5s} {'cost 1e-6$':>10s} "
              f"{'calls':>5s} {'broken':>6s}")
        by_run = defaultdict(list)
        for t in trajs:
            if keep(t):
                by_run[t["run"]].append(t)
        for run, ts in by_run.items():
            em = {s: np.mean([t["em"] for t in ts if t["data_source"] == s] or [np.nan])
                  for s in ("sim_1hop", "sim_2hop")}
            print(f"{run:14s} {len(ts):4d} {em['sim_1hop']:6.3f} {em['sim_2hop']:6.3f} "
                  f"{np.mean([t['em'] for t in ts]):6.3f} {np.mean([t['format_ok'] for t in ts]):5.2f} "
                  f"{np.mean([t['cost_usd'] for t in ts]) * 1e6:10.2f} {np.mean([t['route_count'] for t in ts]):5.2f} "
                  f"{sum(broken(t['turns']) for t in ts):6d}")


def plot(here: Path) -> Path:
    fig, axes = plt.subplots(1, 3, figsize=(13, 3.6))
    for label, run in RUNS.items():
        v = val_rows(here, run)
        steps = sorted(v)
        axes[0].plot(steps, [v[s]["val/em/mean"] for s in steps], marker="o", label=label)
        axes[1].plot(steps, [v[s]["val/cost_usd/mean"] * 1e6 for s in steps], marker="o", label=label)
        axes[2].plot(steps, [v[s].get("val/calls/LLaMA-3.1-70B-Instruct/mean", 0.0) for s in steps], marker="o",
                     label=f"{label}: LLaMA-3.1-70B")
        axes[2].plot(steps, [v[s].get("val/calls/Mixtral-8x22B-Instruct/mean", 0.0) for s in steps], marker="x",
                     linestyle="--", label=f"{label}: Mixtral-8x22B")
    for ax, title in zip(axes, ("val EM", "val cost per question (1e-6 USD)", "val calls per question")):
        ax.set_title(title)
        ax.set_xlabel("PPO step")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7)
    fig.suptitle("Gemma 3 270M router on the H200: PPO from one SFT warm start, alpha 0 vs 0.6")
    fig.tight_layout()
    out = here / "val_curves.png"
    fig.savefig(out, dpi=110)
    return out


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("dir", type=Path, nargs="?", default=RECORDS,
                   help="the run's records (its two metrics files and eval_hf_trajectories.jsonl.gz)")
    here = p.parse_args(argv).dir
    val_table(here)
    eval_tables(here)
    print(f"\nwrote {plot(here)}")


if __name__ == "__main__":
    main()
