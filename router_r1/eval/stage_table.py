"""Diagnose recorded evaluation trajectories: the stage rates per run and data source (router_r1/stages.py).

    python -m router_r1.eval.stage_table outputs/eval/*/trajectories.jsonl --pool configs/pool/sim.yaml

Recomputes every record's stages (trajectories.jsonl of router_r1.eval.evaluate, old ones too) against the
pool's world; a pool without one gets the world-free stages.
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from router_r1.eval.report import OVERALL, format_stage_table
from router_r1.pool.registry import ModelRegistry, RegistryError
from router_r1.pool.world import SIM_POOL, answer_key
from router_r1.stages import stage_rates, trajectory_stages


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m router_r1.eval.stage_table", description=__doc__.splitlines()[0])
    p.add_argument("trajectories", nargs="+", help="trajectories.jsonl files")
    p.add_argument("--pool", default=str(SIM_POOL),
                   help="pool yaml the runs used (its world says who knows what; default the sim pool)")
    p.add_argument("--sim-seed", type=int, default=0, help="world seed of the simulated pool")
    p.add_argument("--include-unseen", action="store_true", help="the router could call models marked unseen")
    a = p.parse_args(argv)
    try:
        full = ModelRegistry.from_yaml(a.pool)
        truth = answer_key(full, a.sim_seed)
    except RegistryError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    routable = (full if a.include_unseen else full.seen()).names
    groups: dict[str, dict[str, list[dict]]] = {}
    for path in a.trajectories:
        for i, line in enumerate(Path(path).read_text().splitlines()):
            try:
                r = json.loads(line)
                st = trajectory_stages(r.get("question"), r["golds"], r["turns"], r["em"], r["format_ok"], truth,
                                       routable)
            except (ValueError, KeyError, TypeError) as e:
                print(f"error: {path} line {i + 1}: not a scored trajectory record ({type(e).__name__}: {e})",
                      file=sys.stderr)
                return 2
            run = groups.setdefault(r.get("run", path), {})
            for source in (r.get("data_source", "unknown"), OVERALL):
                run.setdefault(source, []).append(st)
    runs = [{"label": label, "sources": {s: {"n": len(v), "stages": stage_rates(v)} for s, v in by.items()
                                         if s != OVERALL},
             OVERALL: {"n": len(by[OVERALL]), "stages": stage_rates(by[OVERALL])}} for label, by in groups.items()]
    print(format_stage_table(runs))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
