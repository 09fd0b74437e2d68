"""Do `hf_static` and `hf` decode a checkpoint alike? Greedy tokens and log-probs of both backends on the
first prompts of a data file, and their wall times; run it before switching a new model to hf_static.

    python -m tools.check.check_rollout_backends --model CKPT --tokenizer TOK --data test.parquet [--compile]

In float32 (the default) the two agree token for token; in bf16 near-ties may part them (see
docs/results/h200/README.md), so compare log-probs there. `hf` also runs a second time with the cuDNN
attention backend left out (`hf_no_cudnn`): on the H200 hf wrote wrong first tokens in one chunk per
call, and cuDNN's masked attention is the suspect (it is the default there; hf_static passes no mask).
"""
import argparse
import time

import pandas as pd
import torch
from torch.nn.attention import SDPBackend, sdpa_kernel

from verl.utils.tokenizer import load_tokenizer
from verl.workers.model_loader import load_model, to_dtype
from verl.workers.rollout.base import SamplingParams
from verl.workers.rollout.hf_rollout import HFRollout
from verl.workers.rollout.static_rollout import StaticRollout


class WithoutCudnn:
    """A backend whose generate runs with every sdpa kernel but cuDNN's."""

    def __init__(self, inner):
        self.inner = inner

    def generate(self, prompts, sampling):
        with sdpa_kernel([SDPBackend.FLASH_ATTENTION, SDPBackend.EFFICIENT_ATTENTION, SDPBackend.MATH]):
            return self.inner.generate(prompts, sampling)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", required=True, help="HF model dir or hub id")
    p.add_argument("--tokenizer", default=None, help="default: the model")
    p.add_argument("--data", required=True, help="a parquet with a chat 'prompt' column")
    p.add_argument("--n", type=int, default=8, help="prompts")
    p.add_argument("--new-tokens", type=int, default=48, help="tokens generated per prompt")
    p.add_argument("--dtype", default="float32", help="weights' dtype (float32 compares exactly)")
    p.add_argument("--compile", action="store_true", help="hf_static with rollout.compile=true")
    p.add_argument("--hf-batch", type=int, default=64, help="hf's max_batch_size (rows per chunk)")
    args = p.parse_args(argv)
    device = "cuda" if torch.cuda.is_available() else "cpu"
    tok = load_tokenizer(args.tokenizer or args.model)
    model = load_model(args.model, dtype=to_dtype(args.dtype)).to(device).eval()
    rows = pd.read_parquet(args.data).head(args.n)
    prompts = [tok(tok.apply_chat_template([dict(m) for m in r], add_generation_prompt=True, tokenize=False),
                   add_special_tokens=False)["input_ids"] for r in rows["prompt"]]
    sp = SamplingParams(greedy=True, max_new_tokens=args.new_tokens, return_logprobs=True)
    width = max(map(len, prompts)) + args.new_tokens + StaticRollout.bucket
    hf = HFRollout(model, tok, device=device, eos_token_ids=[], max_batch_size=args.hf_batch)
    backends = {"hf": hf, "hf_no_cudnn": WithoutCudnn(hf),
                "hf_static": StaticRollout(model, tok, device=device, eos_token_ids=[], max_model_len=width,
                                           compile=args.compile)}
    outs = {}
    for name, backend in backends.items():
        backend.generate(prompts[:1], sp)  # warm: graphs, compilation
        t0 = time.perf_counter()
        outs[name] = backend.generate(prompts, sp)
        print(f"{name:11s} {time.perf_counter() - t0:6.2f} s for {len(prompts)} prompts x {args.new_tokens} tokens")
    same = 0
    for i, (a, b) in enumerate(zip(outs["hf"], outs["hf_static"])):
        split = next((j for j, (x, y) in enumerate(zip(a.token_ids, b.token_ids)) if x != y), len(a.token_ids))
        n = min(split, len(a.logprobs), len(b.logprobs))
        diff = max((abs(x - y) for x, y in zip(a.logprobs[:n], b.logprobs[:n])), default=0.0)
        same += a.token_ids == b.token_ids
        print(f"prompt {i} ({len(prompts[i])} tokens): first difference at {split}, max |log-prob diff| before it "
              f"{diff:.2e}; {tok.decode(b.token_ids)[:60]!r}")
    print(f"{same} of {len(prompts)} prompts decoded identically")
    # hf decodes longest first in chunks of --hf-batch rows: a fault tied to one chunk shows up here
    order = sorted(range(len(prompts)), key=lambda i: -len(prompts[i]))
    chunks = [order[k:k + args.hf_batch] for k in range(0, len(order), args.hf_batch)]
    for name in ("hf", "hf_no_cudnn"):
        first = [sum(outs[name][i].token_ids[:1] == outs["hf_static"][i].token_ids[:1] for i in c) for c in chunks]
        per_chunk = ", ".join(f"{f}/{len(c)}" for f, c in zip(first, chunks))
        print(f"{name}: first tokens equal to hf_static per chunk: {per_chunk}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
