"""Failure diagnosis into a small taxonomy, and an experience bank of deduplicated advice.

    python -m gramma.experience --trajectories OUT/eval/trajectories_sft.jsonl --out OUT/advice.json

Honest protocol: build the bank from trajectories on a split (val) that is not the one
the advice is later evaluated on (test). gramma.prompt.with_advice adds the top advice to prompts.
"""
from __future__ import annotations

import argparse
import json
import sys
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path


TAXONOMY = ("lost", "early stop", "wrong entity", "wrong relation", "missed visual check", "unsupported answer")
ADVICE = {
    "lost": "Stop with an answer before the turns run out.",
    "early stop": "Follow every hop the question needs ({relations}) before STOP.",
    "wrong entity": "Expand the neighbour linked by {relations}, not another one.",
    "wrong relation": "Answer with the neighbour linked by {last}, not by another relation.",
    "missed visual check": "Use CROSS_MODAL on the candidates before saying what a picture shows.",
    "unsupported answer": "Give the entity path from the start to the answer as evidence.",
}


def diagnose(gt: dict, answer: str | None, em: float, visited: list[str], cross_checked: list[str],
             evidence_ok: bool) -> str | None:
    """The failure class of one trajectory (None: right and supported)."""
    path = list(gt.get("path") or [])
    if answer is None:
        return "lost"
    if em >= 1.0:
        return None if evidence_ok else "unsupported answer"
    if gt.get("visual") and path and path[-1] not in cross_checked:
        return "missed visual check"
    needed = path[:-1]
    if not all(p in visited for p in needed):
        off_path = [v for v in visited if v not in path]
        return "wrong entity" if off_path else "early stop"
    return "wrong relation"


def advice_for(kind: str, gt: dict) -> str:
    rels = list(gt.get("relations") or [])
    return ADVICE[kind].format(relations=" then ".join(rels) or "the asked relation", last=rels[-1] if rels else "it")


@dataclass
class ExperienceBank:
    counts: Counter = field(default_factory=Counter)  # advice text -> times seen
    kinds: Counter = field(default_factory=Counter)  # taxonomy class -> times seen

    def add(self, kind: str | None, gt: dict) -> None:
        if kind is None:
            return
        if kind not in TAXONOMY:
            raise ValueError(f"unknown failure class {kind!r}; expected one of {TAXONOMY}")
        self.kinds[kind] += 1
        self.counts[advice_for(kind, gt)] += 1

    def top(self, n: int = 3) -> list[str]:
        """The n most frequent advice lines, with their counts (ties: alphabetical, so stable)."""
        best = sorted(self.counts.items(), key=lambda kv: (-kv[1], kv[0]))[:n]
        return [f"{text} (seen {c} times)" for text, c in best]

    def to_json(self) -> dict:
        return {"kinds": dict(self.kinds), "advice": dict(self.counts)}

    @classmethod
    def from_json(cls, d: dict) -> "ExperienceBank":
        return cls(Counter(d.get("advice", {})), Counter(d.get("kinds", {})))


def bank_from_records(records: list[dict]) -> ExperienceBank:
    """Records as gramma.evaluate writes them (gt, answer, em, visited, cross_checked, evidence_ok)."""
    bank = ExperienceBank()
    for i, r in enumerate(records):
        try:
            bank.add(diagnose(r["gt"], r["answer"], r["em"], r["visited"], r["cross_checked"], r["evidence_ok"]),
                     r["gt"])
        except KeyError as e:
            raise ValueError(f"record {i}: missing field {e}") from e
    return bank


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m gramma.experience", description=__doc__.split("\n\n")[0])
    p.add_argument("--trajectories", required=True, help="JSONL from gramma.evaluate on the advice split (val)")
    p.add_argument("--out", required=True)
    p.add_argument("--top", type=int, default=3)
    args = p.parse_args(argv)
    records = [json.loads(x) for x in Path(args.trajectories).read_text().splitlines() if x.strip()]
    try:
        bank = bank_from_records(records)
    except ValueError as e:
        print(f"error: {args.trajectories}: {e}", file=sys.stderr)
        return 1
    out = bank.to_json() | {"top": bank.top(args.top), "source": args.trajectories}
    Path(args.out).write_text(json.dumps(out, indent=2) + "\n")
    print(json.dumps(out, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
