"""The fallback runs side by side: per SFT draw, SciGLM-6B's share of the science calls, EM and cost with it
offered minus without (paired over the 300 test questions), and who the science hops went to.

    python docs/results/h200/gemma_unseen/fallback/summarize.py   # writes table.txt, summary.json, fallback.png

"probe": GeoMind-3B's share of the validation geography calls, for runs made with PROBE=1 (else "-").

Each runs/NAME holds one run_gemma_unseen.sh output (eval_seen, eval_unseen, run.txt); ../think is the run before
--fallback listed, read the same way.
"""
from __future__ import annotations

import json
import re
import sys
from collections import Counter
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parents[4]))
sys.path.insert(0, str(HERE.parents[4] / "scripts"))

from paired_evals import compare, load  # noqa: E402

# name -> (directory, shown recipe); the order of the table and the plot
RUNS = {"think": (HERE.parent / "think", "fallback best, rival 0.5, bank 96, seed 0")}
RUNS.update({name: (HERE / "runs" / name, recipe) for name, recipe in (
    ("fb0", "rival 0.5, bank 96, seed 0"), ("fb1", "rival 0.5, bank 96, seed 1"),
    ("bk0", "rival 0.5, bank 1000, seed 0"), ("bk1", "rival 0.5, bank 1000, seed 1"),
    *((f"r8s{s}", f"rival 0.8, bank 1000, seed {s}") for s in range(6)))})
MIXTRAL = "Mixtral-8x22B-Instruct"


def science_calls(eval_dir: Path) -> Counter:
    """Calls on science hops by model; a call after a reply without an answer counts as "then <model>"."""
    calls: Counter = Counter()
    for record in (r for records in load(eval_dir)[1].values() for r in records):
        for t in record["turns"]:
            if t.get("action") == "route" and t.get("domain") == "science":
                retry = t["generated"].startswith("<think>No answer.")
                calls[("then " if retry else "") + t["model"]] += 1
    return calls


def main() -> None:
    rows = []
    for name, (where, recipe) in RUNS.items():
        got = next(iter(compare(where / "eval_seen", where / "eval_unseen").values()))
        p, share = got["paired"], got["unseen_b"]["SciGLM-6B"]["science"]
        seen_em = json.loads((where / "eval_seen" / "summary.json").read_text())["runs"][0]["overall"]["em"]
        calls = science_calls(where / "eval_unseen")
        probe = None  # run_gemma_unseen.sh PROBE=1: GeoMind-3B's share of the validation geography calls
        if (where / "eval_probe").exists():
            got_probe = next(iter(compare(where / "eval_val_seen", where / "eval_probe").values()))
            probe = got_probe["unseen_b"]["GeoMind-3B"]["geography"]["share"]
        rows.append({"run": name, "recipe": recipe, "sciglm_share": share["share"], "science_calls": share["calls"],
                     "probe_share": probe,
                     "em_seen": seen_em, "em_diff": p["em_diff"], "em_diff_ci95": p["em_diff_ci95"],
                     "cost_diff_1e6": p["cost_diff_1e6"], "cost_diff_1e6_ci95": p["cost_diff_1e6_ci95"],
                     "verdict": p["verdict"], "science_calls_unseen": dict(calls)})
    (HERE / "summary.json").write_text(json.dumps(rows, indent=1) + "\n")
    head = f"{'run':<6} {'recipe':<42} {'SciGLM share':>12} {'EM seen':>7} {'EM diff [95% CI]':>24} " \
           f"{'cost diff 1e-6 [95% CI]':>26} {'probe':>5}  science calls offered SciGLM-6B"
    lines = [head, "-" * len(head)]
    for r in rows:
        (el, eh), (cl, ch) = r["em_diff_ci95"], r["cost_diff_1e6_ci95"]
        calls = ", ".join(f"{m} {n}" for m, n in sorted(r["science_calls_unseen"].items(), key=lambda x: -x[1]))
        lines.append(f"{r['run']:<6} {r['recipe']:<42} {r['sciglm_share']:>12.2f} {r['em_seen']:>7.3f} "
                     f"{r['em_diff']:>+8.3f} [{el:+.3f}, {eh:+.3f}] {r['cost_diff_1e6']:>+8.2f} [{cl:+.2f}, {ch:+.2f}] "
                     f"{'-' if r['probe_share'] is None else format(r['probe_share'], '.2f'):>5}  {calls}")
    (HERE / "table.txt").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))
    plot(rows)


def plot(rows: list[dict]) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(9, 4.2))
    for i, r in enumerate(rows):
        lo, hi = r["cost_diff_1e6_ci95"]
        colour = plt.cm.viridis(r["sciglm_share"])
        ax.errorbar(i, r["cost_diff_1e6"], yerr=[[r["cost_diff_1e6"] - lo], [hi - r["cost_diff_1e6"]]], fmt="o",
                    color=colour, ecolor=colour, capsize=4, markersize=8)
        ax.annotate(f"{r['sciglm_share']:.2f}", (i, hi), textcoords="offset points", xytext=(0, 5), ha="center",
                    fontsize=8)
    ax.axhline(0, color="grey", lw=0.8)
    ax.set_xticks(range(len(rows)), [re.sub(r"^r8", "r8\n", r["run"]) for r in rows], fontsize=8)
    ax.set_xlabel("run (think: before --fallback listed; fb: rival 0.5, bank 96; bk: bank 1000; r8: rival 0.8, bank 1000)")
    ax.set_ylabel("cost with SciGLM-6B offered minus without\n(1e-6 USD per question, 95% CI; below 0: cheaper)")
    ax.set_title("Gemma 3 270M SFT, 300 test questions: the unseen model's effect per SFT draw\n"
                 "(number above a bar: SciGLM-6B's share of the science calls)", fontsize=10)
    fig.tight_layout()
    fig.savefig(HERE / "fallback.png", dpi=130)


if __name__ == "__main__":
    main()
