"""RL against its own warm start: each arm's greedy validation EM per step and its paired test EM against the SFT model.

    python -m experiments.rl_warm_start.summarize --collect /tmp/rl --records docs/results/rl_warm_start
    python -m experiments.rl_warm_start.summarize --records docs/results/rl_warm_start     # rebuild from records

--collect copies each arm's metrics and evaluation summary (gzipped) from a run of run.sh into the records; the
table (table.md), summary.json and the plot (val_em.png) are then built from the records alone.
"""
from __future__ import annotations

import argparse
import gzip
import json
import shutil
from pathlib import Path

from verl.trainer.tracking import read_jsonl

METRICS, EVAL = "metrics.jsonl.gz", "eval_summary.json.gz"
# What the records keep of a step's metrics (the run keeps them all): the update's own, and the means of the
# rewards, routing and stages, sampled and greedy (val/).
UPDATE = ("actor/", "critic/")
MEANS = ("reward/", "em/", "format_ok/", "route_count/", "cost_usd/", "stage/")


def kept(key: str) -> bool:
    return key == "step" or key.startswith(UPDATE) or (
        key.endswith("/mean") and key.removeprefix("val/").startswith(MEANS))


def collect(run_dir: Path, records: Path) -> None:
    """OUT/<arm>/{ppo/metrics.jsonl, eval/summary.json} -> records/<arm>/{metrics.jsonl.gz, eval_summary.json}."""
    for arm in sorted(p.parent.parent for p in run_dir.glob("*/eval/summary.json")):
        dest = records / arm.name
        dest.mkdir(parents=True, exist_ok=True)
        rows = [{k: v for k, v in r.items() if kept(k)} for r in read_jsonl(arm / "ppo" / "metrics.jsonl")]
        with gzip.open(dest / METRICS, "wt", compresslevel=9) as gz:
            gz.writelines(json.dumps(r, separators=(",", ":")) + "\n" for r in rows)
        with open(arm / "eval" / "summary.json", "rb") as src, gzip.GzipFile(dest / EVAL, "wb", 9, mtime=0) as gz:
            shutil.copyfileobj(src, gz)


def arm_summary(arm: Path) -> dict:
    rows = read_jsonl(arm / METRICS)
    val = [(r["step"], r["val/em/mean"]) for r in rows if "val/em/mean" in r]
    with gzip.open(arm / EVAL, "rt") as f:
        runs = json.load(f)["runs"]
    routers = [r for r in runs if r.get("kind", "router") == "router"]
    sft, rl = routers[0], routers[-1]  # the warm start first, the RL checkpoint next; baselines (if any) after
    paired = sft["vs_router"]  # the warm start minus the RL router: negated below
    return {"arm": arm.name, "steps": max(r["step"] for r in rows), "val_em": val,
            "val_em_start": val[0][1], "val_em_min": min(v for _, v in val), "val_em_end": val[-1][1],
            "test_em_sft": sft["overall"]["em"], "test_em_rl": rl["overall"]["em"],
            "rl_minus_sft": -paired["em_diff"], "rl_minus_sft_ci95": sorted(-x for x in paired["em_diff_ci95"]),
            "cost_rl_minus_sft_1e6": -paired["cost_diff_1e6"], "n": paired["n"]}


def table(arms: list[dict]) -> str:
    lines = ["| arm | steps | greedy val EM: start / lowest / end | test EM: SFT / RL | RL - SFT [95% CI] | cost RL - SFT (1e-6 USD) |",
             "|---|---|---|---|---|---|"]
    for a in arms:
        lo, hi = (x + 0.0 for x in a["rl_minus_sft_ci95"])  # + 0.0: no "-0.000" for a zero difference
        lines.append(f"| {a['arm']} | {a['steps']} | {a['val_em_start']:.2f} / {a['val_em_min']:.2f} / {a['val_em_end']:.2f} "
                     f"| {a['test_em_sft']:.3f} / {a['test_em_rl']:.3f} | {a['rl_minus_sft'] + 0.0:+.3f} [{lo:+.3f}, {hi:+.3f}] "
                     f"| {a['cost_rl_minus_sft_1e6']:+.2f} |")
    return "\n".join(lines) + "\n"


def plot(arms: list[dict], out: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(8.0, 3.6), dpi=100)
    for a in arms:
        steps, ems = zip(*a["val_em"])
        ax.plot(steps, ems, marker="o", ms=3, label=a["arm"])
    ax.set_xlabel("PPO step")
    ax.set_ylabel("greedy validation EM (100 questions)")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8, loc="center left", bbox_to_anchor=(1.01, 0.5))  # beside the plot: lines cross
    fig.tight_layout()
    save_small(fig, out)


def save_small(fig, out: Path) -> None:
    """Save a figure as a 32-colour PNG: docs/ has a size budget."""
    import matplotlib.pyplot as plt
    from PIL import Image  # matplotlib's own dependency

    fig.savefig(out)
    plt.close(fig)
    Image.open(out).convert("RGB").quantize(colors=32).save(out, optimize=True)


def records_from_cli(argv, doc: str, default: str) -> Path:
    """The records folder of `--records`, after copying a run.sh output's runs into it when `--collect` names one."""
    p = argparse.ArgumentParser(description=doc, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--records", default=default, help="records folder, one subfolder per run")
    p.add_argument("--collect", default=None, metavar="RUN_DIR", help="copy the runs of a run.sh output first")
    a = p.parse_args(argv)
    if a.collect:
        collect(Path(a.collect), Path(a.records))
    return Path(a.records)


def main(argv=None) -> int:
    records = records_from_cli(argv, __doc__, "docs/results/rl_warm_start")
    arms = [arm_summary(d) for d in sorted(records.iterdir()) if (d / EVAL).exists()]
    if not arms:
        raise SystemExit(f"{records}: no arm folder with {EVAL}")
    (records / "summary.json").write_text(json.dumps(arms, indent=1) + "\n")
    (records / "table.md").write_text(table(arms))
    plot(arms, records / "val_em.png")
    print(table(arms), end="")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
