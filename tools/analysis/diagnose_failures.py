"""Why a router run lost or won answers: failure types per run from an evaluation's trajectories.jsonl.

    python -m tools.analysis.diagnose_failures OUT/eval/trajectories.jsonl [--world-seed 0]

Each trajectory is replayed against the simulated world (the question's true fact chain) and
given the first failure it shows, in this order:
  format      the response breaks the format (reward -1)
  no_route    answered without asking anyone
  bad_query   a route whose query does not ask the hop's fact (an entity or relation copy slip)
  wrong_hop1  the first hop's reply was wrong and the next route asked the second hop of the entity it named
              (a routing miss on hop 1, not a copy slip; that route shows as hop "after wrong" in the table)
  no_answer   the pool replies held no answer / the episode ended unanswered
  wrong_reply the last reply's answer is wrong (an expert that does not know the fact)
  copy_slip   the last reply held the gold answer but the final answer differs from it
  ok          right (EM 1)
Then a table per run: EM per source and per hop domain, the failure counts, the expert each hop
went to (and how often that expert was right), and for two runs the per-question switches
and a paired bootstrap CI of the EM difference.
"""
from __future__ import annotations

import argparse
import collections
import json
import sys
from pathlib import Path

import numpy as np

from sim.world import SimWorld
from router_r1.reward.qa_em import em_score

KINDS = ("ok", "format", "no_route", "bad_query", "wrong_hop1", "no_answer", "wrong_reply", "copy_slip")


def reply_head(text: str | None) -> str | None:
    """The answer an expert put first (as the oracle reads it), or None."""
    if not text:
        return None
    low = text.lower()
    if any(m in low for m in ("i don't know", "i'm sorry", "i know of")):
        return None
    return text.split(". ", 1)[0].strip().rstrip(".").strip() or None


def chain(world: SimWorld, question: str):
    """The question's facts in hop order (None if the question does not parse)."""
    p = world.parse(question)
    if p is None or not p.relations:
        return None
    facts, subj = [], p.entity.name
    for r in p.relations:
        f = world.fact(r.name, subj)
        facts.append(f)
        subj = f.object
    return facts


def classify(world: SimWorld, rec: dict) -> dict:
    facts = chain(world, rec["question"])
    routes = [t for t in rec["turns"] if t.get("action") == "route" and "ok" in t]
    out = {"hops": [], "kind": None}
    if rec.get("em", 0) >= 1:
        out["kind"] = "ok"
    elif not rec.get("format_ok", True):
        out["kind"] = "format"
    elif not routes:
        out["kind"] = "no_route"
    # Per route: which fact did it ask (by the world's parser), was that hop's reply right?
    wrong_heads = set()  # entities that wrong replies to hop 1 named
    for t in routes:
        p = world.parse(t.get("query") or "")
        asked = None
        if p is not None and p.relations:
            asked = "+".join(r.name for r in p.relations)
        hop = None
        if facts and p is not None:
            for i, f in enumerate(facts):
                if p.entity.name == f.subject and asked == f.relation:
                    hop = i
            if len(facts) == 2 and p.entity.name == facts[0].subject and asked == f"{facts[0].relation}+{facts[1].relation}":
                hop = "whole"
            if hop is None and len(facts) == 2 and asked == facts[1].relation and p.entity.name in wrong_heads:
                hop = "after_wrong"
        gold = facts[-1].object if hop == "whole" else (facts[hop].object if isinstance(hop, int) else None)
        head = reply_head(t.get("information"))
        right = gold is not None and head is not None and em_score(head, [gold]) >= 1
        if hop == 0 and head is not None and not right:
            wrong_heads.add(head)
        out["hops"].append({"model": t["model"], "hop": hop, "domain": facts[hop].domain if isinstance(hop, int) else None,
                            "right": right})
    if out["kind"] is None:
        last = routes[-1]
        head = reply_head(last.get("information"))
        hops = [h["hop"] for h in out["hops"]]
        if None in hops:
            out["kind"] = "bad_query"
        elif "after_wrong" in hops and 1 not in hops:
            out["kind"] = "wrong_hop1"
        elif head is None:
            out["kind"] = "no_answer"
        elif em_score(head, rec["golds"]) >= 1:
            out["kind"] = "copy_slip"
        else:
            out["kind"] = "wrong_reply"
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("trajectories", help="trajectories.jsonl of an evaluation")
    ap.add_argument("--world-seed", type=int, default=0, help="seed of the simulated world the data came from")
    args = ap.parse_args(argv)
    world = SimWorld(seed=args.world_seed)
    runs: dict[str, list[dict]] = collections.defaultdict(list)
    for line in Path(args.trajectories).read_text().splitlines():
        rec = json.loads(line)
        rec["diag"] = classify(world, rec)
        runs[rec["run"]].append(rec)
    for run, recs in runs.items():
        n = len(recs)
        print(f"\n== {run}: {n} questions, EM {sum(r['em'] for r in recs) / n:.3f}")
        for src in sorted({r["data_source"] for r in recs}):
            rs = [r for r in recs if r["data_source"] == src]
            kinds = collections.Counter(r["diag"]["kind"] for r in rs)
            print(f"  {src:<9} n={len(rs):<4} EM {sum(r['em'] for r in rs) / len(rs):.3f}  "
                  + "  ".join(f"{k} {kinds.get(k, 0)}" for k in KINDS))
        dom = collections.defaultdict(list)
        for r in recs:
            facts = chain(world, r["question"])
            if facts:
                dom[">".join(f.domain for f in facts)].append(r["em"])
        print("  EM by domain: " + "  ".join(f"{d} {sum(v) / len(v):.2f}({len(v)})" for d, v in sorted(dom.items())))
        hop_use = collections.defaultdict(collections.Counter)
        hop_right = collections.defaultdict(collections.Counter)
        for r in recs:
            for h in r["diag"]["hops"]:
                key = h["domain"] or {"whole": "whole", "after_wrong": "after wrong"}.get(h["hop"], "bad")
                hop_use[key][h["model"].split("-Instruct")[0]] += 1
                hop_right[key][h["model"].split("-Instruct")[0]] += h["right"]
        for key in sorted(hop_use):
            print(f"  hop {key:<10} " + "  ".join(f"{m} {c}({hop_right[key][m] / c:.2f})"
                                                  for m, c in hop_use[key].most_common()))
    names = list(runs)
    if len(names) == 2:
        a, b = ({r["uid"]: r for r in runs[x]} for x in names)
        lost = collections.Counter(b[u]["diag"]["kind"] for u in a if a[u]["em"] >= 1 and b[u]["em"] < 1)
        won = collections.Counter(a[u]["diag"]["kind"] for u in a if a[u]["em"] < 1 and b[u]["em"] >= 1)
        print(f"\n{names[1]} vs {names[0]}: lost {sum(lost.values())} ({dict(lost)}), "
              f"won {sum(won.values())} (were {dict(won)})")
        # paired bootstrap of the EM difference on the same questions (tighter than the two CIs)
        uids = sorted(a)
        diff = np.array([b[u]["em"] - a[u]["em"] for u in uids])
        rng = np.random.default_rng(0)
        boots = diff[rng.integers(0, len(diff), (2000, len(diff)))].mean(axis=1)
        print(f"EM difference {diff.mean():+.3f}, paired bootstrap 95% CI [{np.quantile(boots, 0.025):+.3f}, "
              f"{np.quantile(boots, 0.975):+.3f}]")
    return 0


if __name__ == "__main__":
    sys.exit(main())
