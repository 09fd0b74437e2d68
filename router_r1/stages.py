"""Where a router loses EM, stage by stage: one trajectory's diagnosis, and their rates over a batch.

Each stage is a 0/1 value per trajectory, or None where it does not apply:

    format_ok      the trajectory passes the format check
    copy_ok        the first sub-question keeps every named entity of the question (whole words, any
                   case); entities from the world's parse on a simulated pool, else runs of capitalised
                   words (capitalised_entities). None without a pool call or entity.
    expert_ok      every call whose sub-question the world can read went to an expert that knows it
    expert_best    ... and to the cheapest such expert (the oracle's pick)
    gold_in_info   a gold answer appears (normalised, whole words) in an <information> the router got
    em_given_gold  EM, among trajectories with gold_in_info: 1 - this is the share lost after the pool
                   had given the answer
    decomposed     a two-fact question was split: two or more calls with different sub-questions
                   (two-fact questions known from the world's parse; None for the rest)

expert_ok, expert_best and decomposed need a simulated pool: its world's answer key judges them
(router_r1/pool/world.py; the simulated world's rule is sim/stages.py). A pool without a world leaves them
None. A trajectory is its turn records (a pool call's turn has "ok", "model", "query", "information").
"""
from __future__ import annotations

import math
import re

from router_r1.pool.world import WORLD_STAGES, Truth
from router_r1.reward.qa_em import normalize_answer, usable_golds

STAGES = ("format_ok", "copy_ok", "expert_ok", "expert_best", "gold_in_info", "em_given_gold", "decomposed")


_CAPITALISED = re.compile(r"\b[A-Z][\w'-]*(?:\s+[A-Z][\w'-]*)*")


def capitalised_entities(question: str) -> list[str]:
    """Named entities of a question without a world: runs of capitalised words, the first word of the
    question left out (it is capitalised as a sentence start: "Who", "In")."""
    out = []
    for m in _CAPITALISED.finditer(question or ""):
        words = m.group().split()
        if m.start() == len(question) - len(question.lstrip()):
            words = words[1:]
        if words:
            out.append(" ".join(words))
    return out


def _calls(turns: list[dict]) -> list[dict]:
    return [t for t in turns if "ok" in t]  # "ok" is set once the pool was called


def _has_words(text: str, phrase: str) -> bool:
    words = phrase.lower().split()
    return bool(words) and re.search(r"\b" + r"\s+".join(map(re.escape, words)) + r"\b", text.lower()) is not None


def trajectory_stages(question: str | None, golds, turns: list[dict], em: float, format_ok: bool,
                      truth: Truth | None = None, routable: list[str] | None = None) -> dict[str, float | None]:
    """The stages of one trajectory (see the module docstring); `truth`: the pool's answer key (None: the
    world-free stages); `routable` limits the experts it compares."""
    calls = _calls(turns)
    out: dict[str, float | None] = dict.fromkeys(STAGES)
    out["format_ok"] = float(bool(format_ok))
    entities = (truth.entities(question) if truth is not None and question else None) or \
        capitalised_entities(question or "")
    if calls and entities:
        first = calls[0].get("query") or ""
        out["copy_ok"] = float(all(_has_words(first, e) for e in entities))
    if truth is not None:
        judged = truth.call_stages(question, calls, routable)
        if set(judged) != set(WORLD_STAGES):
            raise ValueError(f"the world's call_stages gave {sorted(judged)}, not {list(WORLD_STAGES)}")
        out.update(judged)
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
