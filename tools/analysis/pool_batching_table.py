"""The table of docs/results/pool_batching_cpu/README.md from RUNS_DIR/*/summary.json, and whether the two
patient runs (before and after batching) got the same pool replies.

    python -m tools.analysis.pool_batching_table [RUNS_DIR]      # default docs/results/pool_batching_cpu/runs
"""
import argparse
import gzip
import json
from pathlib import Path

RUNS = Path(__file__).resolve().parents[2] / "docs/results/pool_batching_cpu/runs"


def replies(runs: Path, run: str) -> dict:
    path = runs / run / "trajectories.jsonl"
    text = path.read_text() if path.exists() else gzip.open(f"{path}.gz", "rt").read()  # the record keeps it gzipped
    recs = [json.loads(x) for x in text.splitlines()]
    return {r["uid"]: r["turns"][0]["information"] for r in recs}


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("runs", nargs="?", type=Path, default=RUNS, metavar="RUNS_DIR", help="one folder per run")
    runs = p.parse_args(argv).runs
    print(f"{'run':16} {'wall s':>7} {'calls':>5} {'failed':>6} {'errors':18} {'p50 s':>6} {'p95 s':>6} {'F1':>6} "
          f"{'cost 1e-6$':>10}")
    for d in sorted(runs.iterdir()):
        r = json.loads((d / "summary.json").read_text())["runs"][0]
        o = r["overall"]
        errors = ",".join(f"{k} {n}" for k, n in o["pool_errors"].items()) or "-"
        print(f"{d.name:16} {r['wall_s']:7.1f} {o['pool_calls']:5d} {o['pool_failed']:6d} {errors:18} "
              f"{o['pool_latency_p50_s']:6.1f} {o['pool_latency_p95_s']:6.1f} {o['f1']:6.3f} {o['cost_1e6_usd']:10.3f}")
    a, b = replies(runs, "before_patient"), replies(runs, "after_patient")
    print(f"before_patient vs after_patient: {sum(a[k] == b[k] for k in a)} of {len(a)} pool replies identical")


if __name__ == "__main__":
    main()
