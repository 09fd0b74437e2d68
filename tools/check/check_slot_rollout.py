"""Does hf_static's continuous-batching path (SlotRollout.generate_one, CUDA-graph slot step) decode as
its batch path does, and how fast? Run it once on a GPU before relying on `env.schedule=continuous`.

Greedy, two turns per prompt: turn 1 through the slots (fewer slots than prompts, so slots are freed
and taken again), then each prompt's context + its turn + a fixed observation, which continues in the
slot that holds it (only the observation is prefilled). Both turns are compared token for token with
StaticRollout.generate on the full contexts; log-prob differences are printed (bf16 near-ties may part
the two paths, as hf and hf_static part in docs/results/h200).

    python -m tools.check.check_slot_rollout --model '{"model_type": "llama", ...}' --tokenizer TOK --dtype bfloat16
    python -m tools.check.check_slot_rollout --model outputs/gpu_pipeline/sft --dtype bfloat16 --n 64 --slots 32
"""
from __future__ import annotations

import argparse
import asyncio
import time

import torch

from verl.utils.tiny import tiny_tokenizer
from verl.utils.tokenizer import load_tokenizer
from verl.workers.model_loader import load_model, to_dtype
from verl.workers.rollout.base import SamplingParams
from verl.workers.rollout.slot_rollout import SlotRollout
from verl.workers.rollout.static_rollout import StaticRollout

OBSERVATION = "<information>The answer is in the second paragraph of the reply.</information>"


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", required=True, help="an HF directory or a JSON model config (random init)")
    p.add_argument("--tokenizer", default=None, help="default: the model's; 'tiny' for the test tokenizer")
    p.add_argument("--dtype", default="float32", help="weights' dtype")
    p.add_argument("--n", type=int, default=16, help="prompts")
    p.add_argument("--slots", type=int, default=8, help="slots of the slot engine")
    p.add_argument("--new-tokens", type=int, default=48, help="tokens generated per prompt")
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu", help="torch device")
    args = p.parse_args(argv)
    tok = tiny_tokenizer() if args.tokenizer == "tiny" else load_tokenizer(args.tokenizer or args.model)
    model = load_model(args.model, dtype=to_dtype(args.dtype)).to(args.device).eval()
    prompts = [tok(f"Question {i}: who directed the film that won award number {i * 7}? Think, then answer.",
                   add_special_tokens=False)["input_ids"] for i in range(args.n)]
    obs = tok(OBSERVATION, add_special_tokens=False)["input_ids"]
    sp = SamplingParams(greedy=True, max_new_tokens=args.new_tokens, return_logprobs=True)
    width = max(map(len, prompts)) + 2 * args.new_tokens + len(obs) + 2 * StaticRollout.bucket
    batch = StaticRollout(model, tok, device=args.device, eos_token_ids=[], max_model_len=width)
    slots = SlotRollout(model, tok, device=args.device, eos_token_ids=[], max_model_len=width,
                        max_batch_size=args.slots)

    def run_slots(contexts):
        async def go():
            return await asyncio.gather(*(slots.generate_one(c, sp) for c in contexts))
        return asyncio.run(go())

    batch.generate(prompts[:1], sp)  # warm-up: graphs
    run_slots(prompts[:1])
    slots.release(prompts[0])
    t0 = time.perf_counter()
    ref1 = batch.generate(prompts, sp)
    t_batch = time.perf_counter() - t0
    t0 = time.perf_counter()
    out1 = run_slots(prompts)
    t_slots = time.perf_counter() - t0
    turn2 = [p + o.token_ids + obs for p, o in zip(prompts, ref1)]
    ref2 = batch.generate(turn2, sp)
    before = slots.engine.stats.prefill_tokens
    out2 = run_slots(turn2)
    prefilled = slots.engine.stats.prefill_tokens - before
    same = 0
    for turn, refs, outs in ((1, ref1, out1), (2, ref2, out2)):
        for i, (a, b) in enumerate(zip(refs, outs)):
            split = next((j for j, (x, y) in enumerate(zip(a.token_ids, b.token_ids)) if x != y), len(a.token_ids))
            diff = max((abs(x - y) for x, y in zip(a.logprobs[:split], b.logprobs[:split])), default=0.0)
            same += a.token_ids == b.token_ids
            if a.token_ids != b.token_ids or i < 2:
                print(f"turn {turn} prompt {i}: first difference at {split}, max |log-prob diff| before it {diff:.2e}")
    st = slots.engine.stats
    print(f"{same} of {2 * len(prompts)} turns decoded identically by the slots and the batch path")
    print(f"turn 1: batch path {t_batch:.2f} s, slots {t_slots:.2f} s ({args.n} prompts, {args.slots} slots, "
          f"{args.new_tokens} tokens); turn 2 prefilled {prefilled} tokens, the batch path {sum(map(len, turn2))}")
    print(f"slot engine: {st.requests} requests, {st.steps} steps, max {st.max_busy} busy slots, "
          f"{st.evictions} evictions, {st.busy_s:.2f} s busy")
    return 0 if same == 2 * len(prompts) or args.dtype != "float32" else 1


if __name__ == "__main__":
    raise SystemExit(main())
