"""Failure diagnosis into a small taxonomy, and an experience bank of deduplicated advice.

    python -m gramma.experience --trajectories OUT/eval_val/trajectories_sft.jsonl --out OUT/advice.json
    python -m gramma.experience --bank OUT/advice.json --data OUT/test.parquet --out OUT/test_advice.parquet

Honest protocol: build the bank from trajectories on a split (train or val) that is not the
one the advice is later evaluated on (test). The second form writes a copy of a question file
whose prompts carry the top advice (gramma.prompt.with_advice): per question kind with
--per-kind (the advice learned from failures on questions of the same kind), else global.
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
    by_question: dict = field(default_factory=dict)  # question kind (data_source) -> Counter of advice

    def add(self, kind: str | None, gt: dict, question_kind: str | None = None) -> None:
        if kind is None:
            return
        if kind not in TAXONOMY:
            raise ValueError(f"unknown failure class {kind!r}; expected one of {TAXONOMY}")
        self.kinds[kind] += 1
        text = advice_for(kind, gt)
        self.counts[text] += 1
        if question_kind:
            self.by_question.setdefault(question_kind, Counter())[text] += 1

    def top(self, n: int = 3, question_kind: str | None = None) -> list[str]:
        """The n most frequent advice lines, with their counts (ties: alphabetical, so stable);
        with `question_kind`, only advice from failures on questions of that kind."""
        counts = self.counts if question_kind is None else self.by_question.get(question_kind, Counter())
        best = sorted(counts.items(), key=lambda kv: (-kv[1], kv[0]))[:n]
        return [f"{text} (seen {c} times)" for text, c in best]

    def to_json(self) -> dict:
        return {"kinds": dict(self.kinds), "advice": dict(self.counts),
                "by_question": {k: dict(v) for k, v in self.by_question.items()}}

    @classmethod
    def from_json(cls, d: dict) -> "ExperienceBank":
        return cls(Counter(d.get("advice", {})), Counter(d.get("kinds", {})),
                   {k: Counter(v) for k, v in (d.get("by_question") or {}).items()})


def bank_from_records(records: list[dict]) -> ExperienceBank:
    """Records as gramma.graph_eval writes them (gt, answer, em, visited, cross_checked, evidence_ok)."""
    bank = ExperienceBank()
    for i, r in enumerate(records):
        try:
            bank.add(diagnose(r["gt"], r["answer"], r["em"], r["visited"], r["cross_checked"], r["evidence_ok"]),
                     r["gt"], r.get("kind"))
        except KeyError as e:
            raise ValueError(f"record {i}: missing field {e}") from e
    return bank


def apply_advice(data: str | Path, bank: ExperienceBank, out: str | Path, n: int = 3, per_kind: bool = False) -> int:
    """Write a copy of the question parquet `data` whose prompts carry the bank's top advice; returns rows."""
    import pandas as pd

    from gramma.prompt import with_advice
    from verl.trainer.dataset import to_python

    frame = pd.read_parquet(data)
    prompts = []
    for r in frame.to_dict("records"):
        advice = bank.top(n, r["data_source"] if per_kind else None)
        prompts.append(with_advice([dict(m) for m in to_python(r["prompt"])], advice))
    frame = frame.copy()
    frame["prompt"] = prompts
    frame.to_parquet(out, index=False)
    return len(frame)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m gramma.experience", description=__doc__.split("\n\n")[0])
    src = p.add_mutually_exclusive_group(required=True)
    src.add_argument("--trajectories", help="JSONL from gramma.graph_eval on the advice split (train or val)")
    src.add_argument("--bank", help="advice JSON written by the first form: put its advice into --data's prompts")
    p.add_argument("--data", help="with --bank: the question parquet to copy with advice")
    p.add_argument("--out", required=True, help="output file (the advice JSON, or the parquet with advice)")
    p.add_argument("--top", type=int, default=3, help="pieces of advice per question")
    p.add_argument("--per-kind", action="store_true", help="with --bank: advice from the same question kind")
    args = p.parse_args(argv)
    if args.bank:
        if not args.data:
            p.error("--bank needs --data")
        bank = ExperienceBank.from_json(json.loads(Path(args.bank).read_text()))
        rows = apply_advice(args.data, bank, args.out, args.top, args.per_kind)
        print(f"wrote {args.out}: {rows} rows with advice ({'per kind' if args.per_kind else 'global'}, "
              f"top {args.top})")
        return 0
    records = [json.loads(x) for x in Path(args.trajectories).read_text().splitlines() if x.strip()]
    try:
        bank = bank_from_records(records)
    except ValueError as e:
        print(f"error: {args.trajectories}: {e}", file=sys.stderr)
        return 1
    out = bank.to_json() | {"top": bank.top(args.top), "source": args.trajectories,
                            "top_by_question": {k: bank.top(args.top, k) for k in sorted(bank.by_question)}}
    Path(args.out).write_text(json.dumps(out, indent=2) + "\n")
    print(json.dumps(out, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
