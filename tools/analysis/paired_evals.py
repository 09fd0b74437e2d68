"""Two evaluations of the same runs on the same questions, paired: each run's EM and cost in B minus A
(bootstrap CIs over questions) and each unseen model's share of its domains' calls in both.

    python -m tools.analysis.paired_evals outputs/eval_seen outputs/eval_unseen --out outputs/unseen_diff.json

A and B are output directories of router_r1.eval.evaluate (summary.json, trajectories.jsonl or .jsonl.gz), e.g. one
without and one with --include-unseen; runs are matched by label (--routers: the one router run of each, e.g. a fixed-alpha
router against the conditioned one told that alpha; --cross: every run of B against every run of A, e.g. routers
evaluated on the GPU against baselines evaluated here on the same questions), questions by uid.
"""
from __future__ import annotations

import argparse
import gzip
import json
import sys
from pathlib import Path

from router_r1.eval.report import paired_vs


def load(eval_dir: Path) -> tuple[dict, dict[str, list[dict]]]:
    """(summary runs by label, trajectory records by run label) of one evaluation directory."""
    try:
        runs = {r["label"]: r for r in json.loads((eval_dir / "summary.json").read_text())["runs"]}
        records: dict[str, list[dict]] = {}
        plain, packed = eval_dir / "trajectories.jsonl", eval_dir / "trajectories.jsonl.gz"  # docs/results keeps .gz
        text = plain.read_text() if plain.exists() else gzip.decompress(packed.read_bytes()).decode()
        for line in text.splitlines():
            if line.strip():
                r = json.loads(line)
                records.setdefault(r["run"], []).append(r)
    except (OSError, ValueError, KeyError) as e:
        raise SystemExit(f"error: {eval_dir}: not an evaluation directory of router_r1.eval.evaluate "
                         f"({type(e).__name__}: {e})") from None
    return runs, records


def router_label(runs: dict, where: Path) -> str:
    labels = [label for label, r in runs.items() if r.get("kind") == "router"]
    if len(labels) != 1:
        raise SystemExit(f"error: {where}: --routers needs exactly one router run, found {len(labels)}")
    return labels[0]


def compare(a_dir: Path, b_dir: Path, routers: bool = False, cross: bool = False) -> dict[str, dict]:
    """{key: {"against": A's label, "paired": B - A (paired_vs), "unseen_a", "unseen_b"}} for the runs both evaluated
    (routers: the one router run of each; cross: every pair of runs, keyed "B's label vs A's label", else B's label)."""
    runs_a, rec_a = load(a_dir)
    runs_b, rec_b = load(b_dir)
    if routers:
        pairs = [(router_label(runs_a, a_dir), router_label(runs_b, b_dir))]
    elif cross:
        pairs = [(la, lb) for lb in runs_b for la in runs_a]
    else:
        pairs = [(x, x) for x in runs_a if x in runs_b]
    out = {}
    for la, lb in pairs:
        if la in rec_a and lb in rec_b:
            out[f"{lb} vs {la}" if cross else lb] = {
                "run": lb, "against": la, "paired": paired_vs(rec_a[la], rec_b[lb], f"{la} in {a_dir}"),
                "unseen_a": runs_a[la].get("unseen", {}), "unseen_b": runs_b[lb].get("unseen", {})}
    return out


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("a", help="the reference evaluation directory (e.g. without --include-unseen)")
    p.add_argument("b", help="the compared evaluation directory (e.g. with --include-unseen)")
    p.add_argument("--routers", action="store_true",
                   help="pair the one router run of A with the one of B (their labels differ) instead of by label")
    p.add_argument("--cross", action="store_true",
                   help="pair every run of B with every run of A (e.g. routers here against baselines there)")
    p.add_argument("--out", default=None, help="write the comparison as JSON here")
    a = p.parse_args(argv)
    if a.routers and a.cross:
        p.error("--routers and --cross are exclusive")
    result = compare(Path(a.a), Path(a.b), a.routers, a.cross)
    if not result:
        print(f"error: {a.a} and {a.b} share no run label", file=sys.stderr)
        return 2
    for c in result.values():
        label, v = c["run"], c["paired"]
        (el, eh), (cl, ch) = v["em_diff_ci95"], v["cost_diff_1e6_ci95"]
        print(f"{label} - {c['against']} on {v['n']} questions: EM {v['em_diff']:+.3f} [{el:+.3f}, {eh:+.3f}], cost "
              f"{v['cost_diff_1e6']:+.2f} [{cl:+.2f}, {ch:+.2f}] 1e-6 USD ({v['verdict'].replace('the router', 'A')})")
        for model, per in c["unseen_b"].items():
            for d, s in per.items():
                before = c["unseen_a"].get(model, {}).get(d, {}).get("share", 0.0)
                print(f"  unseen {model} on {d}: share of calls {before:.2f} -> {s['share']:.2f} ({s['calls']} calls)")
    if a.out:
        Path(a.out).write_text(json.dumps(result, indent=2, default=float))
    return 0


if __name__ == "__main__":
    sys.exit(main())
