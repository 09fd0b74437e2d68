"""Replay one evaluation's second-turn prompts through the hf engine and hf_static, 64 rows at a time, and print
where their first tokens part: the check for the hf engine's stray first tokens (docs/results/h200/gemma_unseen/fallback,
p3d1's rows 192-255).

    D=docs/results/h200/gemma_unseen/fallback/draws/p3d1
    python -m experiments.gemma_unseen.replay_batches $D/eval_unseen_hf $D/prompt_template_unseen.txt \\
      --model $GGUF --tokenizer $TOKENIZER --device cuda

The prompts are rebuilt from the trajectories' text (chat template, first turn, its information), so a row's ids can
differ from the evaluation's by a merge at a seam; the batches are the rows in file order, as the continuous
schedule sent most of them.
"""
from __future__ import annotations

import argparse
import gzip
import json
from pathlib import Path

import torch

from verl.utils.tokenizer import load_tokenizer
from verl.workers.model_loader import load_model
from verl.workers.rollout.base import SamplingParams
from verl.workers.rollout.hf_rollout import HFRollout
from verl.workers.rollout.static_rollout import StaticRollout


def second_turn_prompts(eval_dir: Path, template: str, tok) -> list[list[int]]:
    """Each trajectory's prompt before its second turn, as ids."""
    path = next(p for p in (eval_dir / "trajectories.jsonl.gz", eval_dir / "trajectories.jsonl") if p.exists())
    opener = gzip.open if path.suffix == ".gz" else open
    prompts = []
    with opener(path, "rt") as f:
        for line in f:
            row = json.loads(line)
            first = row["turns"][0]
            text = tok.apply_chat_template([{"role": "user", "content": template.replace("{question}", row["question"])}],
                                           add_generation_prompt=True, tokenize=False)
            text += first["generated"] + f"\n\n<information>{first.get('information') or ''}</information>\n\n"
            prompts.append(tok(text, add_special_tokens=False)["input_ids"])
    return prompts


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("eval_dir", type=Path, help="an evaluation's output folder (trajectories.jsonl[.gz])")
    ap.add_argument("template", type=Path, help="the prompt template that evaluation used")
    ap.add_argument("--model", required=True, help="checkpoint folder or GGUF file")
    ap.add_argument("--tokenizer", help="tokenizer (default: the model's)")
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--dtype", default="float32")
    ap.add_argument("--batch", type=int, default=64)
    a = ap.parse_args()
    tok = load_tokenizer(a.tokenizer or a.model)
    prompts = second_turn_prompts(a.eval_dir, a.template.read_text(), tok)
    model = load_model(a.model, dtype=a.dtype, role="rollout")
    hf = HFRollout(model, tok, device=a.device, max_batch_size=a.batch)
    static = StaticRollout(model, tok, device=a.device, max_batch_size=a.batch)
    sampling = SamplingParams(greedy=True, max_new_tokens=1, return_logprobs=True)
    for start in range(0, len(prompts), a.batch):
        batch = prompts[start:start + a.batch]
        ours, theirs = hf.generate(batch, sampling), static.generate(batch, sampling)
        parted = [start + i for i, (x, y) in enumerate(zip(ours, theirs)) if x.token_ids != y.token_ids]
        gap = max(abs(x.logprobs[0] - y.logprobs[0]) for x, y in zip(ours, theirs))
        print(f"rows {start}-{start + len(batch) - 1}: width {max(map(len, batch))}, first tokens part in "
              f"{len(parted)} {parted[:8]}, max |log-prob gap| {gap:.4f}", flush=True)


if __name__ == "__main__":
    main()
