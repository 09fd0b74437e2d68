"""Where a router loses EM, stage by stage: one trajectory's diagnosis, and their rates over a batch.

Each stage is a 0/1 value per trajectory, or None where it does not apply:

    format_ok      the trajectory passes the format check
    copy_ok        the first sub-question keeps every named entity of the question (whole words, any
                   case); entities from the simulated world's parse, else runs of capitalised words
                   (sim/truth.capitalised_entities). None without a pool call or entity.
    expert_ok      every call whose sub-question the world can read went to an expert that knows it
                   (P(right) within KNOW_MARGIN of the best routable expert, sim/truth.py)
    expert_best    ... and to the cheapest such expert (the oracle's pick). Both need a simulated pool.
    gold_in_info   a gold answer appears (normalised, whole words) in an <information> the router got
    em_given_gold  EM, among trajectories with gold_in_info: 1 - this is the share lost after the pool
                   had given the answer
    decomposed     a two-fact question was split: two or more calls with different sub-questions
                   (two-fact questions known from the world's parse; None for the rest)

A trajectory is its turn records (a pool call's turn has "ok", "model", "query", "information").
"""
from __future__ import annotations

import math
import re

from sim.truth import SimTruth, capitalised_entities
from router_r1.reward.qa_em import normalize_answer, usable_golds

STAGES = ("format_ok", "copy_ok", "expert_ok", "expert_best", "gold_in_info", "em_given_gold", "decomposed")


def _calls(turns: list[dict]) -> list[dict]:
    return [t for t in turns if "ok" in t]  # "ok" is set once the pool was called


def _has_words(text: str, phrase: str) -> bool:
    words = phrase.lower().split()
    return bool(words) and re.search(r"\b" + r"\s+".join(map(re.escape, words)) + r"\b", text.lower()) is not None


def trajectory_stages(question: str | None, golds, turns: list[dict], em: float, format_ok: bool,
                      truth: SimTruth | None = None, routable: list[str] | None = None) -> dict[str, float | None]:
    """The stages of one trajectory (see the module docstring); `routable` limits the experts compared."""
    calls = _calls(turns)
    out: dict[str, float | None] = dict.fromkeys(STAGES)
    out["format_ok"] = float(bool(format_ok))
    entities = (truth.entities(question) if truth is not None and question else None) or \
        capitalised_entities(question or "")
    if calls and entities:
        first = calls[0].get("query") or ""
        out["copy_ok"] = float(all(_has_words(first, e) for e in entities))
    if truth is not None:
        judged = []
        for c in calls:
            facts = truth.facts(c.get("query") or "")
            if facts is None or c.get("model") not in truth.experts:
                continue
            among = [m for m in (routable or truth.experts) if m in truth.experts]
            knowing = truth.knowing(facts, among)
            judged.append((c["model"] in knowing, c["model"] == knowing[0]))
        if judged:
            out["expert_ok"] = float(all(ok for ok, _ in judged))
            out["expert_best"] = float(all(best for _, best in judged))
        facts = truth.facts(question) if question else None
        if facts is not None and len(facts) > 1:
            asked = {normalize_answer(c.get("query") or "") for c in calls}
            out["decomposed"] = float(len(calls) >= 2 and len(asked) >= 2)
    norm_golds = [normalize_answer(g) for g in usable_golds(golds)]
    info = [normalize_answer(c.get("information") or "") for c in calls if c.get("ok")]
    out["gold_in_info"] = float(any(_has_words(text, g) for text in info for g in norm_golds))
    if out["gold_in_info"]:
        out["em_given_gold"] = float(em)
    return out


def stage_rates(stages: list[dict]) -> dict[str, float]:
    """Mean of each stage over the trajectories it applies to (nan where it applies to none)."""
    out = {}
    for name in STAGES:
        vals = [s[name] for s in stages if s.get(name) is not None]
        out[name] = sum(vals) / len(vals) if vals else math.nan
    return out


def stage_metrics(stages: list[dict], prefix: str = "stage") -> dict[str, list[float]]:
    """Training metrics: `stage/<name>` with one value per trajectory the stage applies to (every key present,
    so the batches of one step agree on their keys)."""
    return {f"{prefix}/{name}": [s[name] for s in stages if s.get(name) is not None] for name in STAGES}


def main(argv: list[str] | None = None) -> int:
    """Diagnose recorded evaluation trajectories (trajectories.jsonl of router_r1.eval.evaluate, old ones too):
    the stage rates per run and data source, recomputed against the pool's simulated world."""
    import argparse
    import json
    import sys
    from pathlib import Path

    from router_r1.eval.report import OVERALL, format_stage_table
    from router_r1.pool.registry import ModelRegistry, RegistryError

    p = argparse.ArgumentParser(prog="python -m router_r1.stages", description=main.__doc__)
    p.add_argument("trajectories", nargs="+", help="trajectories.jsonl files")
    p.add_argument("--pool", default=str(Path(__file__).resolve().parents[1] / "configs" / "pool" / "sim.yaml"),
                   help="pool yaml the runs used (its sim: profiles say who knows what; default the sim pool)")
    p.add_argument("--sim-seed", type=int, default=0, help="world seed of the simulated pool")
    p.add_argument("--include-unseen", action="store_true", help="the router could call models marked unseen")
    a = p.parse_args(argv)
    try:
        full = ModelRegistry.from_yaml(a.pool)
    except RegistryError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    truth = SimTruth.from_registry(full, seed=a.sim_seed)
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
