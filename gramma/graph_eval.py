"""Evaluate GraMMA checkpoints on a question file: accuracy overall and per question kind.

    python -m gramma.graph_eval --data OUT/test.parquet --graph OUT/graph --checkpoint OUT/sft --checkpoint OUT/hf

Greedy decoding through the transformers rollout backend and the same GraphEnv as
training; writes OUT/summary.json and OUT/trajectories.jsonl when --out is given.
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import numpy as np

from gramma.graph_env import GraphEnv, GraphEnvConfig
from gramma.ranking import RankConfig
from verl.trainer.dataset import PromptDataset, eval_batches
from verl.workers.rollout.base import SamplingParams

METRICS = ("em", "f1", "format_ok", "evidence_ok", "turns", "invalid_actions", "cross_modal", "hit_budget")


def evaluate(checkpoint: str, env_cfg: GraphEnvConfig, data: str, batch_size: int = 64,
             limit: int | None = None) -> tuple[dict, list[dict]]:
    """Summary {metric: mean, per_kind: {kind: em}} and one record per question."""
    import torch
    from transformers import AutoModelForCausalLM

    from verl.utils.tokenizer import load_tokenizer
    from verl.workers.rollout.hf_rollout import HFRollout

    tok = load_tokenizer(checkpoint)
    model = AutoModelForCausalLM.from_pretrained(checkpoint, dtype=torch.float32)
    rollout = HFRollout(model, tok, device="cpu", max_batch_size=batch_size)
    env = GraphEnv(env_cfg, tok)
    ds = PromptDataset([data], tok, max_prompt_length=1024, limit=limit)
    sampling = SamplingParams(greedy=True, temperature=0.0, max_new_tokens=env_cfg.response_length)
    records, scores, per = [], [], {k: [] for k in METRICS}
    for idx in eval_batches(len(ds), batch_size):
        rows = [ds.rows[i] for i in idx]
        res = env.rollout(rows, rollout.generate, sampling, validate=True)
        s, m = env.score(res, rows, validate=True)
        scores += s.tolist()
        for k in METRICS:
            per[k] += m[k]
        for j, r in enumerate(rows):
            records.append({"uid": r.uid, "kind": r.fields.get("data_source"), "score": float(s[j]),
                            "em": m["em"][j], "evidence_ok": bool(m["evidence_ok"][j]), "answer": res.info["answer"][j],
                            "gt": r.fields["reward_model"]["ground_truth"], "visited": res.info["visited"][j],
                            "cross_checked": res.info["cross_checked"][j], "text": res.info["text"][j]})
    summary = {"checkpoint": checkpoint, "n": len(records), "reward": float(np.mean(scores))}
    summary.update({k: float(np.mean(v)) for k, v in per.items()})
    kinds = sorted({r["kind"] for r in records})
    summary["per_kind_em"] = {k: float(np.mean([r["em"] for r in records if r["kind"] == k])) for k in kinds}
    return summary, records


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m gramma.graph_eval", description=__doc__.split("\n\n")[0])
    p.add_argument("--data", required=True, help="question parquet")
    p.add_argument("--graph", required=True, help="graph directory (entities + triples)")
    p.add_argument("--checkpoint", action="append", required=True, help="HF model dir (repeat to compare)")
    p.add_argument("--out", default=None, help="write trajectories JSONL and summary here")
    p.add_argument("--max-turns", type=int, default=6, help="generations per episode (the last must STOP)")
    p.add_argument("--top-k", type=int, default=8, help="neighbours shown per EXPAND")
    p.add_argument("--response-length", type=int, default=48, help="tokens per generated turn")
    p.add_argument("--max-response-length", type=int, default=512, help="tokens of all turns and observations")
    p.add_argument("--max-obs-tokens", type=int, default=192, help="tokens per observation")
    p.add_argument("--limit", type=int, default=None, help="first N questions")
    args = p.parse_args(argv)
    cfg = GraphEnvConfig(graph_dir=args.graph, max_turns=args.max_turns, response_length=args.response_length,
                         max_response_length=args.max_response_length, max_obs_tokens=args.max_obs_tokens,
                         rank=RankConfig(top_k=args.top_k))
    summaries = []
    for ckpt in args.checkpoint:
        summary, records = evaluate(ckpt, cfg, args.data, limit=args.limit)
        summaries.append(summary)
        kinds = " ".join(f"{k}={v:.3f}" for k, v in summary["per_kind_em"].items())
        print(f"{ckpt}: n={summary['n']} em={summary['em']:.3f} format_ok={summary['format_ok']:.3f} "
              f"evidence_ok={summary['evidence_ok']:.3f} turns={summary['turns']:.2f} {kinds}", flush=True)
        if args.out:
            out = Path(args.out)
            out.mkdir(parents=True, exist_ok=True)
            with open(out / f"trajectories_{Path(ckpt).name}.jsonl", "w") as f:
                for r in records:
                    f.write(json.dumps(r) + "\n")
    if args.out:
        (Path(args.out) / "summary.json").write_text(json.dumps(summaries, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
