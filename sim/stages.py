"""The stages only the simulated world can judge (router_r1/stages.py has the rest and the definitions).

    expert_ok    every call whose sub-question the world can read went to an expert that knows it
                 (P(right) within KNOW_MARGIN of the best routable expert, sim/truth.py)
    expert_best  ... and to the cheapest such expert (the oracle's pick)
    decomposed   a two-fact question was split: two or more calls with different sub-questions
                 (None for a one-fact question or one the world cannot read)
"""
from __future__ import annotations

from router_r1.reward.qa_em import normalize_answer
from sim.truth import SimTruth


def call_stages(truth: SimTruth, question: str | None, calls: list[dict],
                routable: list[str] | None = None) -> dict[str, float | None]:
    """expert_ok, expert_best and decomposed of one trajectory's pool calls; `routable` limits the experts
    compared (default: all of the truth's)."""
    out: dict[str, float | None] = {"expert_ok": None, "expert_best": None, "decomposed": None}
    among = [m for m in (routable or truth.experts) if m in truth.experts]
    judged = []
    for c in calls:
        facts = truth.facts(c.get("query") or "")
        if facts is None or c.get("model") not in truth.experts:
            continue
        knowing = truth.knowing(facts, among)
        judged.append((c["model"] in knowing, c["model"] == knowing[0]))
    if judged:
        out["expert_ok"] = float(all(ok for ok, _ in judged))
        out["expert_best"] = float(all(best for _, best in judged))
    facts = truth.facts(question) if question else None
    if facts is not None and len(facts) > 1:
        asked = {normalize_answer(c.get("query") or "") for c in calls}
        out["decomposed"] = float(len(calls) >= 2 and len(asked) >= 2)
    return out
