"""How sure a router is of its routes: the policy's probability of each listed model's name at the point where a
greedy trajectory names one, averaged per hop domain.

    python -m tools.analysis.route_probs --checkpoint RUN/hf --data RUN/data/test.parquet \
        --trajectories RUN/eval/trajectories.jsonl [--run NAME] [--pool configs/pool/sim.yaml] [--out probs.md]

A greedy routing table (routing_vs_accuracy) counts each hop's argmax, so a flat distribution with a small lead
looks there like a learned rule. Here each route of the chosen run's trajectories is replayed: the prompt (from the
data file, by uid) and the trajectory's text up to the routed name, then every listed name scored as a continuation
(the sum of its tokens' log-probs) and normalised over the listed names. The text is re-tokenized whole, so where a
tokenizer merges across the pieces a rollout joined, the context differs from the rollout's by those merges. A route
is read (`--at`) as the decision (default): the probability of each name at the `<search>`, averaged over the names
the turn's think could have written before it ("Ask X", each weighted by its probability there), so it holds
whether a router decides in its think and copies, or routes apart from its think; at the route alone (`route`: the
trajectory's own think as context); or at the turn's first mention of the routed name (`first`: the think's
"Ask X" where there is one, what records before session 14 read). A route written with an alias only is left out.
"""
from __future__ import annotations

import argparse
import json
import math
import sys
from pathlib import Path

import torch

from router_r1.pool.registry import ModelRegistry


def name_log_probs(model, tok, prefix: str, names: list[str]) -> list[float]:
    """log P(name | prefix) for each name: one forward over the candidates, scoring the tokens after their shared
    start (so a name whose first tokens merge with the prefix is scored from where the candidates part)."""
    seqs = [tok(prefix + n, add_special_tokens=False)["input_ids"] for n in names]
    shared = 0
    while all(len(s) > shared + 1 for s in seqs) and len({s[shared] for s in seqs}) == 1:
        shared += 1
    if shared == 0:
        raise ValueError("route_probs: the names part at the first token; score them after a non-empty prefix")
    width = max(len(s) for s in seqs)
    pad = tok.pad_token_id if tok.pad_token_id is not None else 0
    ids = torch.tensor([s + [pad] * (width - len(s)) for s in seqs])  # (C, width)
    attn = torch.tensor([[1] * len(s) + [0] * (width - len(s)) for s in seqs])  # (C, width)
    with torch.no_grad():
        logp = model(input_ids=ids, attention_mask=attn).logits.float().log_softmax(-1)  # (C, width, V)
    out = []
    for c, s in enumerate(seqs):
        pos = torch.arange(shared, len(s))
        out.append(float(logp[c, pos - 1, torch.tensor(s[shared:])].sum()))
    return out


def _route_turns(traj: dict):
    """(offset in traj['text'] where the turn starts, its generated text, the turn) per route turn naming a model."""
    at = 0
    for turn in traj.get("turns", []):
        gen = turn.get("generated") or ""
        start = traj["text"].find(gen, at)
        if start < 0:
            return
        at = start + len(gen)
        if turn.get("action") == "route" and turn.get("model"):
            yield start, gen, turn


def _routed_name_at(gen: str, model: str, at_route: bool) -> int:
    """Offset in a turn's text of the routed name: inside its `<search>` (at_route), else its first mention; -1."""
    return gen.find(model, max(gen.find("<search>"), 0) if at_route else 0)


def route_points(traj: dict, at_route: bool = True) -> list[tuple[int, str, str | None]]:
    """(character offset in traj['text'] where the routed name starts, the model, the hop's domain) per route: the
    name inside the turn's `<search>` (at_route), else the turn's first mention of it."""
    points = []
    for start, gen, turn in _route_turns(traj):
        name_at = _routed_name_at(gen, turn["model"], at_route)
        if name_at >= 0:
            points.append((start + name_at, turn["model"], turn.get("domain")))
    return points


def think_names(traj: dict, names: list[str]) -> list[tuple[int, str] | None]:
    """Per route turn of route_points(traj): (offset in traj['text'], name) of the first listed name its think writes
    before the `<search>`, or None."""
    out = []
    for start, gen, turn in _route_turns(traj):
        if _routed_name_at(gen, turn["model"], at_route=True) < 0:
            continue  # route_points leaves this route out too
        end = gen.find("<search>") if "<search>" in gen else len(gen)
        hits = [(gen.find(n), -len(n), n) for n in names if 0 <= gen.find(n) < end]
        out.append((start + min(hits)[0], min(hits)[2]) if hits else None)
    return out


def _normalised(lp: list[float]) -> list[float]:
    mass = sum(math.exp(x) for x in lp)
    return [math.exp(x) / mass for x in lp]


def decision_probs(model, tok, context: str, text: str, offset: int, think: tuple[int, str] | None,
                   names: list[str]) -> list[float]:
    """P(the route names each listed name), summed over the names the think could write first: sum over x of
    P(think writes x) * P(route name | the think with x). Without a think name, the route's own distribution."""
    if think is None:
        return _normalised(name_log_probs(model, tok, context + text[:offset], names))
    t_at, t_name = think
    p_think = _normalised(name_log_probs(model, tok, context + text[:t_at], names))
    between = text[t_at + len(t_name):offset]
    out = [0.0] * len(names)
    for w, x in zip(p_think, names):
        for i, p in enumerate(_normalised(name_log_probs(model, tok, context + text[:t_at] + x + between, names))):
            out[i] += w * p
    return out


def probe(model, tok, prompts: dict[str, str], trajectories: list[dict], names: list[str],
          at: str = "decision") -> list[dict]:
    """One record per replayed route: domain, the model the trajectory named, and P(name) over the listed names, read
    as `at` says (decision, route or first: the module's docstring)."""
    records = []
    for traj in trajectories:
        prompt = prompts.get(traj["uid"])
        if prompt is None:
            raise SystemExit(f"route_probs: uid {traj['uid']} of the trajectories is not in the data file")
        points = route_points(traj, at_route=at != "first")
        thinks = think_names(traj, names) if at == "decision" else [None] * len(points)
        for (offset, chosen, domain), think in zip(points, thinks):
            lp = name_log_probs(model, tok, prompt + traj["text"][:offset], names)
            probs = (decision_probs(model, tok, prompt, traj["text"], offset, think, names) if think is not None
                     else _normalised(lp))
            records.append({"uid": traj["uid"], "domain": domain, "chosen": chosen,
                            "mass": sum(math.exp(x) for x in lp), "probs": dict(zip(names, probs))})
    return records


def table(records: list[dict], names: list[str], best: dict[str, str] | None = None) -> str:
    """Markdown: per domain, the mean probability of each listed name, and how much of it the chosen name had; with
    `best` (domain -> the world's best listed model), its probability per domain and over all hops."""
    by: dict[str, list[dict]] = {}
    for r in records:
        by.setdefault(r["domain"] or "-", []).append(r)
    best = best or {}
    extra = " P(best) |" if best else ""
    lines = ["| domain | hops | " + " | ".join(names) + " | P(chosen) | listed names' mass |" + extra,
             "|---|---|" + "---|" * len(names) + "---|---|" + ("---|" if best else "")]
    for domain in sorted(by):
        rs = by[domain]
        mean = [sum(r["probs"][n] for r in rs) / len(rs) for n in names]
        chosen = sum(r["probs"][r["chosen"]] for r in rs if r["chosen"] in r["probs"]) / len(rs)
        mass = sum(r["mass"] for r in rs) / len(rs)
        row = f"| {domain} | {len(rs)} | " + " | ".join(f"{m:.2f}" for m in mean) + f" | {chosen:.2f} | {mass:.2f} |"
        if best:
            row += f" {sum(r['probs'][best[domain]] for r in rs) / len(rs):.2f} |" if domain in best else " - |"
        lines.append(row)
    if best:
        scored = [r for r in records if r["domain"] in best]
        p = sum(r["probs"][best[r["domain"]]] for r in scored) / max(len(scored), 1)
        lines += ["", f"P(best) over {len(scored)} hops of a known domain: {p:.2f} (the domain's best model: the most "
                      "accurate listed one, the cheaper on a tie)"]
    return "\n".join(lines)


def best_per_domain(pool: Path, names: list[str]) -> dict[str, str]:
    """domain -> its best listed model, from a simulated pool's accuracies ({} for a pool without them)."""
    from tools.analysis.routing_vs_accuracy import best_model, pool_table
    try:
        _, acc, price = pool_table(pool)
    except ValueError:  # a real pool: no sim accuracies to rank by (domain_accuracy says so)
        return {}
    return {d: best_model(acc[d], price, names) for d in acc}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--checkpoint", type=Path, required=True, help="the HF model dir whose route probabilities to read")
    ap.add_argument("--data", type=Path, required=True, help="the parquet the trajectories were evaluated on (prompts by uid)")
    ap.add_argument("--trajectories", type=Path, required=True, help="trajectories.jsonl (or .jsonl.gz) of an evaluation")
    ap.add_argument("--run", default=None, help="which run's trajectories to replay (default: the file's first run)")
    ap.add_argument("--pool", type=Path, default=None,
                    help="pool yaml whose listed models are scored (default: the names the trajectories routed to); "
                         "a simulated pool also gives each domain's best model, whose probability the table adds")
    ap.add_argument("--at", choices=["decision", "route", "first"], default="decision",
                    help="how a route is read: the <search> name averaged over the names the think could write "
                         "before it (decision), the <search> name after the trajectory's own think (route), or the "
                         "turn's first mention of the routed name, the think's 'Ask X' where there is one (first; "
                         "records before session 14)")
    ap.add_argument("--limit", type=int, default=0, help="replay at most this many trajectories (0: all)")
    ap.add_argument("--out", type=Path, default=None, help="write the table (markdown) here as well as to stdout")
    ap.add_argument("--json", type=Path, default=None, help="write every replayed route's probabilities here")
    args = ap.parse_args(argv)

    import pandas as pd
    from transformers import AutoModelForCausalLM

    from verl.trainer.tracking import read_jsonl
    from verl.utils.tokenizer import load_tokenizer

    trajs = read_jsonl(args.trajectories)
    run = args.run or (trajs[0]["run"] if trajs else None)
    trajs = [t for t in trajs if t["run"] == run][: args.limit or None]
    if not trajs:
        raise SystemExit(f"route_probs: no trajectories of run {run!r} in {args.trajectories}")
    tok = load_tokenizer(str(args.checkpoint))
    model = AutoModelForCausalLM.from_pretrained(args.checkpoint).eval()
    wanted = {t["uid"] for t in trajs}
    prompts = {row.extra_info["uid"]: tok.apply_chat_template(list(row.prompt), add_generation_prompt=True, tokenize=False)
               for row in pd.read_parquet(args.data).itertuples() if row.extra_info["uid"] in wanted}
    if args.pool:
        names = list(ModelRegistry.from_yaml(args.pool).seen().models)
    else:
        names = sorted({p[1] for t in trajs for p in route_points(t)})
    records = probe(model, tok, prompts, trajs, names, at=args.at)
    best = best_per_domain(args.pool, names) if args.pool else {}
    text = f"{args.checkpoint}, routes of {run!r} read --at {args.at}: {len(records)}\n\n" + table(records, names, best)
    print(text)
    if args.out:
        args.out.write_text(text + "\n")
    if args.json:
        args.json.write_text(json.dumps(records))
    return 0


if __name__ == "__main__":
    sys.exit(main())
