"""The fallback runs side by side: per SFT draw, SciGLM-6B's share of the science calls, EM and cost with it
offered minus without (paired over the 300 test questions), and who the science hops went to.

    python -m experiments.gemma_unseen.summarize [--dir DIR]   # writes table.txt, summary.json, fallback.png there

DIR: the records folder, default docs/results/h200/gemma_unseen/fallback.

"probe": GeoMind-3B's share of the validation geography calls, for runs made with PROBE=1 (else "-"); "bad names":
route actions naming no listed model, on the test with SciGLM-6B offered. Below the table: choosing among the probed
draws by their probe share alone (no test question), how often the chosen draw meets the target; then each draw's
other pairs (the probe's, and with CONSTRAIN=1 the constrained decodings'), each against the seen listing.

Each draws/NAME holds what docs/ keeps of one run_gemma_unseen.sh output: its pairs (paired_*.json), prompt templates,
oracle/ and sft/ summaries and console (run.txt.gz); only p3d1 keeps its evaluations (eval_seen, eval_unseen, ...), and
../think (the run before --fallback listed) is read the same way. A run without eval_unseen trajectories (the other
draws, whose evaluations left docs/, and the first ten fallback runs fb, bk, r8s, kept in a git-ignored runs/ folder and
lost) has its row carried over from summary.json as it was summarised then.
"""
from __future__ import annotations

import argparse
import itertools
import json
import re
from collections import Counter
from pathlib import Path

from tools.analysis.paired_evals import compare, load

RECORDS = Path(__file__).resolve().parents[2] / "docs/results/h200/gemma_unseen/fallback"


def runs(here: Path) -> dict[str, tuple[Path, str]]:
    """name -> (directory, shown recipe), in the order of the table and the plot."""
    out = {"think": (here.parent / "think", "fallback best, rival 0.5, bank 96, seed 0")}
    out.update({name: (here / "runs" / name, recipe) for name, recipe in (
        ("fb0", "rival 0.5, bank 96, seed 0"), ("fb1", "rival 0.5, bank 96, seed 1"),
        ("bk0", "rival 0.5, bank 1000, seed 0"), ("bk1", "rival 0.5, bank 1000, seed 1"),
        *((f"r8s{s}", f"rival 0.8, bank 1000, seed {s}") for s in range(6)))})
    out.update({f"p3s{s}": (here / "draws" / f"p3s{s}", f"r8s + styled bank, rival cheaper 0.3, seed {s}")
                for s in range(9)})
    out.update({f"p3m{s}": (here / "draws" / f"p3m{s}", f"p3s + misname drill 0.1, seed {s}") for s in range(4)})
    out["p3d1"] = (here / "draws" / "p3d1", "p3m1 again (no probe; hf engine unconstrained)")
    return out


# (label, seen listing's evaluation, offered listing's, the new model and its domain) of the pairs a draw may hold
PAIRS = (("probe", "eval_val_seen", "eval_probe", ("GeoMind-3B", "geography")),
         ("test, names constrained", "eval_seen", "eval_unseen_constrained", ("SciGLM-6B", "science")),
         ("probe, names constrained", "eval_val_seen", "eval_probe_constrained", ("GeoMind-3B", "geography")),
         ("test, hf engine", "eval_seen", "eval_unseen_hf", ("SciGLM-6B", "science")))
MET = "EM within noise, cheaper"  # paired_vs's verdict when the EM CI holds 0 and the cost CI lies below it


def science_calls(eval_dir: Path) -> Counter:
    """Calls on science hops by model; a call after a reply without an answer counts as "then <model>"."""
    calls: Counter = Counter()
    for record in (r for records in load(eval_dir)[1].values() for r in records):
        for t in record["turns"]:
            if t.get("action") == "route" and t.get("domain") == "science":
                retry = t["generated"].startswith("<think>No answer.")
                calls[("then " if retry else "") + t["model"]] += 1
    return calls


def bad_names(eval_dir: Path) -> int:
    """Route actions that named no listed model (e.g. "SiliGLM-6B" for SciGLM-6B)."""
    return sum(t.get("reason") == "unknown_model" for records in load(eval_dir)[1].values()
               for r in records for t in r["turns"])


def offered(seen: Path, offer: Path, model: str, domain: str) -> dict:
    """A new model offered (`offer`) against the seen listing (`seen`), paired: its share of `domain`'s calls, the
    EM and cost differences with CIs, and the routes that named no listed model."""
    got = next(iter(compare(seen, offer).values()))
    p = got["paired"]
    return {"share": got["unseen_b"][model][domain]["share"], "em_diff": p["em_diff"],
            "em_diff_ci95": p["em_diff_ci95"], "cost_diff_1e6": p["cost_diff_1e6"], "bad_names": bad_names(offer)}


def recipe_of(row: dict) -> str:
    """The draws of one recipe share a name up to the seed: p3s0 ... p3s8 are "p3s"."""
    return row["run"].rstrip("0123456789")


def chosen_by_probe(rows: list[dict], k: int) -> tuple[int, int]:
    """Of all k-subsets of the probed draws, (how many, how many whose highest-probe draw meets the target)."""
    probed = [r for r in rows if r["probe_share"] is not None]
    subsets = list(itertools.combinations(probed, k))
    met = sum(max(sub, key=lambda r: r["probe_share"])["verdict"] == MET for sub in subsets)
    return len(subsets), met


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--dir", type=Path, default=RECORDS, help="the records folder (draws/, summary.json, ../think)")
    here = ap.parse_args(argv).dir
    old = {r["run"]: r for r in json.loads((here / "summary.json").read_text())}
    rows = []
    for name, (where, recipe) in runs(here).items():
        if not any(where.glob("eval_unseen/trajectories.jsonl*")):  # lost runs/, or evaluations left out of docs/
            rows.append(old[name])  # (its size budget): the row as summarised when the run was made
            continue
        got = next(iter(compare(where / "eval_seen", where / "eval_unseen").values()))
        p, share = got["paired"], got["unseen_b"]["SciGLM-6B"]["science"]
        seen_em = json.loads((where / "eval_seen" / "summary.json").read_text())["runs"][0]["overall"]["em"]
        calls = science_calls(where / "eval_unseen")
        probe = None  # run_gemma_unseen.sh PROBE=1: GeoMind-3B's share of the validation geography calls
        if (where / "eval_probe").exists():
            probe = offered(where / "eval_val_seen", where / "eval_probe", "GeoMind-3B", "geography")["share"]
        rows.append({"run": name, "recipe": recipe, "sciglm_share": share["share"], "science_calls": share["calls"],
                     "probe_share": probe,
                     "em_seen": seen_em, "em_diff": p["em_diff"], "em_diff_ci95": p["em_diff_ci95"],
                     "cost_diff_1e6": p["cost_diff_1e6"], "cost_diff_1e6_ci95": p["cost_diff_1e6_ci95"],
                     "verdict": p["verdict"], "science_calls_unseen": dict(calls),
                     "bad_names": bad_names(where / "eval_unseen"),
                     # the probe's and (CONSTRAIN=1) the constrained decodings' pairs, each against the seen listing
                     "pairs": {label: offered(where / a, where / b, *new)
                               for label, a, b, new in PAIRS if (where / b).exists()}})
    (here / "summary.json").write_text(json.dumps(rows, indent=1) + "\n")
    head = f"{'run':<6} {'recipe':<42} {'SciGLM share':>12} {'EM seen':>7} {'EM diff [95% CI]':>24} " \
           f"{'cost diff 1e-6 [95% CI]':>26} {'probe':>5} {'bad names':>9}  science calls offered SciGLM-6B"
    lines = [head, "-" * len(head)]
    for r in rows:
        (el, eh), (cl, ch) = r["em_diff_ci95"], r["cost_diff_1e6_ci95"]
        calls = ", ".join(f"{m} {n}" for m, n in sorted(r["science_calls_unseen"].items(), key=lambda x: -x[1]))
        lines.append(f"{r['run']:<6} {r['recipe']:<42} {r['sciglm_share']:>12.2f} {r['em_seen']:>7.3f} "
                     f"{r['em_diff']:>+8.3f} [{el:+.3f}, {eh:+.3f}] {r['cost_diff_1e6']:>+8.2f} [{cl:+.2f}, {ch:+.2f}] "
                     f"{'-' if r['probe_share'] is None else format(r['probe_share'], '.2f'):>5} "
                     f"{'-' if r['bad_names'] is None else r['bad_names']:>9}  {calls}")
    probed = [r for r in rows if r["probe_share"] is not None]
    for recipe in dict.fromkeys(recipe_of(r) for r in probed):  # each recipe's draws apart
        mine = [r for r in probed if recipe_of(r) == recipe]
        lines.append("")
        lines.append(f"{recipe}*: target met (verdict '{MET}') in {sum(r['verdict'] == MET for r in mine)} of "
                     f"{len(mine)} draws; keeping the highest probe share of k draws (every k-subset of them):")
        for k in range(1, min(3, len(mine)) + 1):
            n, met = chosen_by_probe(mine, k)
            lines.append(f"  k={k}: target met in {met} of {n} ({met / n:.2f})")
    lines += ["", "each draw's other pairs (the new model offered minus the seen listing):"]
    for r in rows:
        for label, q in r.get("pairs", {}).items():
            (el, eh) = q["em_diff_ci95"]
            lines.append(f"  {r['run']:<6} {label:<25} share {q['share']:.2f}  EM {q['em_diff']:+.3f} "
                         f"[{el:+.3f}, {eh:+.3f}]  cost {q['cost_diff_1e6']:+.2f}  bad names {q['bad_names']}")
    (here / "table.txt").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))
    plot(rows, here / "fallback.png")


def plot(rows: list[dict], out: Path) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(12, 4.4))
    for i, r in enumerate(rows):
        lo, hi = r["cost_diff_1e6_ci95"]
        colour = plt.cm.viridis(r["sciglm_share"])
        ax.errorbar(i, r["cost_diff_1e6"], yerr=[[r["cost_diff_1e6"] - lo], [hi - r["cost_diff_1e6"]]], fmt="o",
                    color=colour, ecolor=colour, capsize=4, markersize=8)
        ax.annotate(f"{r['sciglm_share']:.2f}", (i, hi), textcoords="offset points", xytext=(0, 5), ha="center",
                    fontsize=8)
        if r["em_diff_ci95"][1] < 0:  # cheaper is no gain where the answers are lost
            ax.annotate(f"EM {r['em_diff']:+.2f}", (i, lo), textcoords="offset points", xytext=(0, -12),
                        ha="center", fontsize=8, color="red")
    ax.axhline(0, color="grey", lw=0.8)
    ax.set_ylim(bottom=min(r["cost_diff_1e6_ci95"][0] for r in rows) - 0.4)  # room for the red EM labels
    ax.set_xticks(range(len(rows)), [re.sub(r"^(r8|p3)", r"\1\n", r["run"]) for r in rows], fontsize=8)
    ax.set_xlabel("run (think: before --fallback listed; fb: rival 0.5, bank 96; bk: bank 1000; r8: rival 0.8, "
                  "bank 1000; p3s: r8 + styled bank names, rival cheaper 0.3;\np3m: p3s + misname drill 0.1; "
                  "p3d1: p3m1's seed again)")
    ax.set_ylabel("cost with SciGLM-6B offered minus without\n(1e-6 USD per question, 95% CI; below 0: cheaper)")
    ax.set_title("Gemma 3 270M SFT, 300 test questions: the unseen model's effect per SFT draw\n"
                 "(number above a bar: SciGLM-6B's share of the science calls; red: EM lower with it offered, 95% CI)", fontsize=10)
    fig.tight_layout()
    fig.savefig(out, dpi=130)


if __name__ == "__main__":
    main()
