"""The table of README.md from runs/*/summary.json, and whether two runs got the same pool replies.

    python docs/results/pool_batching_cpu/compare.py [RUNS_DIR]
"""
import json
import sys
from pathlib import Path

runs = Path(sys.argv[1] if len(sys.argv) > 1 else Path(__file__).parent / "runs")
print(f"{'run':16} {'wall s':>7} {'calls':>5} {'failed':>6} {'errors':18} {'p50 s':>6} {'p95 s':>6} {'F1':>6} "
      f"{'cost 1e-6$':>10}")
for d in sorted(runs.iterdir()):
    r = json.loads((d / "summary.json").read_text())["runs"][0]
    o = r["overall"]
    errors = ",".join(f"{k} {n}" for k, n in o["pool_errors"].items()) or "-"
    print(f"{d.name:16} {r['wall_s']:7.1f} {o['pool_calls']:5d} {o['pool_failed']:6d} {errors:18} "
          f"{o['pool_latency_p50_s']:6.1f} {o['pool_latency_p95_s']:6.1f} {o['f1']:6.3f} {o['cost_1e6_usd']:10.3f}")


def replies(run):
    recs = [json.loads(x) for x in (runs / run / "trajectories.jsonl").read_text().splitlines()]
    return {r["uid"]: r["turns"][0]["information"] for r in recs}


a, b = replies("before_patient"), replies("after_patient")
print(f"before_patient vs after_patient: {sum(a[k] == b[k] for k in a)} of {len(a)} pool replies identical")
