"""Where a sampled trajectory leaves the greedy one, and what it costs: the sampled-vs-greedy gap of a router.

    python -m experiments.rl_warm_start.diagnose_gap --checkpoint outputs/embedded/sft \
        --data outputs/embedded/data/val.parquet --temperature 1.0 --samples 4 --out gap.json

Plays each question greedily and `--samples` times at the temperature, on the simulated pool in process; then a
teacher-forced forward of every trajectory gives, per policy token, its probability, whether it is the arg-max
and the entropy, at the sampling temperature. Tokens are labelled by where they stand: think, route name,
sub-question, answer, glue (tags and text between blocks). Printed: EM greedy and sampled, per segment the tokens,
off-mode tokens and entropy, and the sampled EM grouped by the segment of a trajectory's first off-mode token.
"""
from __future__ import annotations

import argparse
import json
import re
from collections import defaultdict
from pathlib import Path

import numpy as np
import torch

SEGMENTS = ("think", "name", "query", "answer", "glue")
_TAG = re.compile(r"</?(think|search|answer|information)>")


def segment_at(text: str) -> str:
    """The segment a token starting after `text` (the response so far) belongs to."""
    last = None
    for m in _TAG.finditer(text):
        last = m
    if last is None or last.group(0).startswith("</"):
        return "glue"
    tag = last.group(1)
    if tag == "search":
        return "query" if ":" in text[last.end():] else "name"
    return {"think": "think", "answer": "answer"}.get(tag, "glue")


@torch.no_grad()
def token_stats(model, prompt: list[int], response: list[int], temperature: float):
    """Per response token: (log-prob, is arg-max, entropy) under the model at `temperature`."""
    ids = torch.tensor([prompt + response])
    logits = model(input_ids=ids).logits[0, len(prompt) - 1:-1].float() / temperature  # (resp, vocab)
    logp = torch.log_softmax(logits, -1)
    taken = torch.tensor(response)
    lp = logp.gather(-1, taken[:, None]).squeeze(-1)
    top = logits.argmax(-1) == taken
    ent = -(logp.exp() * logp).sum(-1)
    return lp.numpy(), top.numpy(), ent.numpy()


def labels(tokenizer, response: list[int], mask: list[int]) -> list[str | None]:
    """Each response token's segment (None for environment tokens)."""
    out = []
    for i, m in enumerate(mask):
        out.append(segment_at(tokenizer.decode(response[:i], skip_special_tokens=False)) if m else None)
    return out


def play(env, rows, generate, sampling):
    """One episode per row (PromptRow), validation mode; (the rollout, each episode's EM)."""
    result = env.rollout(rows, generate, sampling, validate=True)
    _, metrics = env.score(result, rows, validate=True)
    return result, np.asarray(metrics["em"], dtype=float)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--checkpoint", required=True)
    p.add_argument("--data", required=True)
    p.add_argument("--temperature", type=float, default=1.0)
    p.add_argument("--top-p", type=float, default=1.0)
    p.add_argument("--top-k", type=int, default=-1)
    p.add_argument("--samples", type=int, default=4)
    p.add_argument("--limit", type=int, default=100)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out", default=None, help="JSON file for the numbers")
    a = p.parse_args(argv)

    import pyarrow.parquet as pq
    from transformers import AutoModelForCausalLM

    from router_r1.runtime import episode_config, episode_env, load_policy, open_pool, tokenize_prompt, trained_env
    from verl.trainer.dataset import PromptRow
    from verl.workers.rollout.base import SamplingParams

    records = pq.read_table(a.data).slice(0, a.limit).to_pylist()
    policy = load_policy(a.checkpoint, device="cpu", rollout="hf")
    model = AutoModelForCausalLM.from_pretrained(a.checkpoint).eval()
    env_cfg = episode_config(trained_env(a.checkpoint).env)
    rows = [PromptRow(tokenize_prompt(policy.tokenizer, r["prompt"]), str(i), r) for i, r in enumerate(records)]
    out = {"checkpoint": a.checkpoint, "temperature": a.temperature, "top_p": a.top_p, "top_k": a.top_k, "questions": len(rows)}
    with open_pool(sim=True) as pool:
        env = episode_env(env_cfg, policy, pool)
        _, greedy_em = play(env, rows, policy.generate, SamplingParams(greedy=True))
        out["em_greedy"] = float(greedy_em.mean())
        per_seg = {s: defaultdict(float) for s in SEGMENTS}
        by_first = defaultdict(list)
        ems = []
        for k in range(a.samples):
            sampling = SamplingParams(temperature=a.temperature, top_p=a.top_p, top_k=a.top_k, seed=a.seed * 1000 + k)  # the env sets stops and length
            res, em = play(env, rows, policy.generate, sampling)
            ems.append(em)
            for j in range(len(rows)):
                resp, mask = res.response_ids[j], res.response_mask[j]
                _, top, ent = token_stats(model, res.prompt_ids[j], resp, a.temperature)
                first = "none"
                for seg, t, h, m in zip(labels(policy.tokenizer, resp, mask), top, ent, mask):
                    if not m:
                        continue
                    d = per_seg[seg]
                    d["tokens"] += 1
                    d["off_mode"] += float(not t)
                    d["entropy"] += float(h)
                    if not t and first == "none":
                        first = seg
                by_first[first].append(float(em[j]))
        out["em_sampled"] = float(np.mean(ems))
        n_traj = a.samples * len(rows)
        out["segments"] = {s: {"tokens_per_trajectory": d["tokens"] / n_traj,
                               "off_mode_per_trajectory": d["off_mode"] / n_traj,
                               "off_mode_rate": d["off_mode"] / max(d["tokens"], 1),
                               "mean_entropy": d["entropy"] / max(d["tokens"], 1)} for s, d in per_seg.items()}
        out["em_by_first_off_mode"] = {s: {"share": len(v) / n_traj, "em": float(np.mean(v))}
                                       for s, v in sorted(by_first.items())}
    print(json.dumps(out, indent=1))
    if a.out:
        Path(a.out).write_text(json.dumps(out, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
