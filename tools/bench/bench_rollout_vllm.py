"""Rollout throughput, same run: vLLM (our VLLMRollout) vs hf_static (compiled) vs transformers `generate`.

Random-init Qwen2.5 shapes (tools/bench/bench_rollout.py's), saved once as an HF directory for vLLM;
prompts of random tokens, sampling at T=1, no stop, every row the full length. Also: one weight sync
into vLLM (seconds; then vLLM's returned log-probs against a teacher-forced forward of the synced
model, and of the model it had before: a sync that did nothing shows up as a large diff) and GPU
memory around sleep/wake (torch.cuda.mem_get_info). Every figure is printed beside the shape's HBM floor
(bench_rollout.hbm_floor: the tokens/s at which one step's weight and KV reads would take the whole step).

    python -m tools.bench.bench_rollout_vllm --shape qwen2.5-0.5b qwen2.5-3b --batch 128 --prompt-len 1024 \
        --new-tokens 512 --skip-generate --out bench.json
"""
from __future__ import annotations

import json
import os
import time

import torch

from verl.workers.rollout.base import SamplingParams
from verl.workers.rollout.static_rollout import StaticRollout
from verl.workers.rollout.vllm_rollout import VLLMRollout
from tools.bench.bench_rollout import _Tok, build, hf_generate, teacher_forced_logprobs, timed, workload_parser
from tools.bench import bench_rollout

GIB = 1 << 30


def free_gib() -> float:
    return torch.cuda.mem_get_info()[0] / GIB


def logprob_gap(model, prompts, outs) -> float:
    """Mean |engine log-prob - teacher-forced log-prob of `model`| over all generated tokens."""
    d = [(torch.tensor(o.logprobs, device="cuda") - teacher_forced_logprobs(model, p, o.token_ids)).abs()
         for p, o in zip(prompts, outs)]
    return float(torch.cat(d).mean())


def floors(shapes: list[str], batches: list[int], prompt_len: int, new_tokens: int) -> dict:
    """bench_rollout.hbm_floor for every (shape, batch), computed before any engine starts so a missing or
    failing floor costs no GPU time."""
    return {(s, b): bench_rollout.hbm_floor(s, b, prompt_len, new_tokens) for s in shapes for b in batches}


def add_ratios(row: dict, floor: dict) -> dict:
    """The row with the floor and each engine's distance from it (floor tok/s / measured tok/s: 1.0 is the floor)."""
    row.update(hbm_bytes_per_step=floor["bytes_per_step"], hbm_floor_tok_s=floor["floor_tok_s"],
               vllm_vs_hf_static=row["vllm_tok_s"] / row["hf_static_compiled_tok_s"])
    for name in ("vllm", "hf_static_compiled", "generate"):
        if f"{name}_tok_s" in row:
            row[f"{name}_x_floor"] = floor["floor_tok_s"] / row[f"{name}_tok_s"]
    return row


def row_line(row: dict) -> str:
    """One printed line: whole-call tok/s (prefill included) of each engine with its distance from the decode
    step's HBM floor, the ratio, the floor."""
    line = (f"{row['shape']:13s} batch {row['batch']:4d}, prompt {row['prompt_len']} + {row['new_tokens']} new: "
            f"vLLM {row['vllm_tok_s']:9.0f} tok/s ({row['vllm_x_floor']:.1f}x the floor) | hf_static compiled "
            f"{row['hf_static_compiled_tok_s']:9.0f} tok/s ({row['hf_static_compiled_x_floor']:.1f}x the floor)")
    if "generate_tok_s" in row:
        line += f" | generate {row['generate_tok_s']:8.0f} tok/s ({row['generate_x_floor']:.1f}x the floor)"
    line += f" | vLLM/hf_static {row['vllm_vs_hf_static']:.2f}x"
    if "generate_tok_s" in row:
        line += (f", vLLM/generate {row['vllm_vs_generate']:.1f}x, hf_static/generate "
                 f"{row['hf_static_vs_generate']:.1f}x")
    return line + (f" | HBM floor {row['hbm_floor_tok_s']:,.0f} tok/s (decode only, "
                   f"{row['hbm_bytes_per_step'] / 1e9:.1f} GB a step; every figure here includes the prefill)")


def main() -> None:
    p = workload_parser(__doc__)
    p.add_argument("--gpu-memory-utilization", type=float, default=0.35, help="vLLM's share of GPU memory")
    p.add_argument("--skip-generate", action="store_true", help="do not time transformers generate")
    p.add_argument("--workdir", default="/tmp/bench_vllm", help="where the random-weight models are written")
    p.add_argument("--out", default=None, help="write the timings as JSON here")
    args = p.parse_args()
    floor = floors(args.shape, args.batch, args.prompt_len, args.new_tokens)
    results = []
    for shape in args.shape:
        torch._dynamo.reset()  # compiled functions are shared between StaticRollouts: fresh per shape
        model = build(shape, "cuda", torch.bfloat16)
        path = os.path.join(args.workdir, shape)
        model.save_pretrained(path)  # vLLM starts from this, as it starts from model.path in training
        t0 = time.perf_counter()
        engine = VLLMRollout(path, device="cuda:0", gpu_memory_utilization=args.gpu_memory_utilization,
                             max_model_len=args.prompt_len + args.new_tokens + 16, skip_tokenizer_init=True,
                             max_num_seqs=max(args.batch))
        start_s = time.perf_counter() - t0
        static = StaticRollout(model, _Tok(), device="cuda", max_batch_size=max(args.batch), eos_token_ids=[],
                               compile=True, max_model_len=args.prompt_len + args.new_tokens + StaticRollout.bucket)
        sp = SamplingParams(temperature=1.0, max_new_tokens=args.new_tokens, seed=0)
        print(f"{shape}: vLLM engine up in {start_s:.1f} s", flush=True)
        for batch in args.batch:
            g = torch.Generator().manual_seed(batch)
            prompts = torch.randint(1, model.config.vocab_size, (batch, args.prompt_len), generator=g).tolist()
            n_new = batch * args.new_tokens
            row = {"shape": shape, "batch": batch, "prompt_len": args.prompt_len, "new_tokens": args.new_tokens,
                   "vllm_engine_start_s": start_s}
            for name, eng in (("vllm", engine), ("hf_static_compiled", static)):
                row[f"{name}_first_call_s"] = timed(lambda: eng.generate(prompts, sp), "cuda")
                outs = []
                row[f"{name}_s"] = timed(lambda: outs.extend(eng.generate(prompts, sp)), "cuda")
                assert all(len(o.token_ids) == args.new_tokens for o in outs), f"{name}: rows stopped early"
                row[f"{name}_tok_s"] = n_new / row[f"{name}_s"]
            if not args.skip_generate:
                row["generate_s"] = timed(lambda: hf_generate(model, prompts, args.new_tokens), "cuda")
                row["generate_tok_s"] = n_new / row["generate_s"]
                row["vllm_vs_generate"] = row["generate_s"] / row["vllm_s"]
                row["hf_static_vs_generate"] = row["generate_s"] / row["hf_static_compiled_s"]
            results.append(add_ratios(row, floor[shape, batch]))
            print(row_line(row), flush=True)
        static = None
        # sleep/wake memory, then a sync to a different model (seed 1) and the log-prob check
        g = torch.Generator().manual_seed(7)
        probe = torch.randint(1, model.config.vocab_size, (8, 128), generator=g).tolist()
        probe_sp = SamplingParams(temperature=1.0, max_new_tokens=32, seed=1, return_logprobs=True)
        old_outs = engine.generate(probe, probe_sp)
        before = logprob_gap(model, probe, old_outs)
        torch.cuda.synchronize()
        mem = {"free_awake_gib": free_gib()}
        engine.sleep()
        mem["free_asleep_gib"] = free_gib()
        other = model  # a different model of the same shape: every matrix re-drawn (the norms stay)
        g = torch.Generator(device="cuda").manual_seed(1)
        with torch.no_grad():
            for prm in other.parameters():
                if prm.dim() > 1:
                    prm.normal_(0, 0.02, generator=g)
        stale = logprob_gap(other, probe, old_outs)  # what the check reads if the sync did nothing
        t0 = time.perf_counter()
        engine.update_weights(other.state_dict())
        sync_s = time.perf_counter() - t0
        mem["free_after_sync_gib"] = free_gib()
        outs = engine.generate(probe, probe_sp)
        after = logprob_gap(other, probe, outs)
        check = {"shape": shape, "sync_s": sync_s, "logprob_gap_same_model_before_sync": before,
                 "logprob_gap_if_not_synced": stale,
                 "logprob_gap_synced_model_after_sync": after, **mem}
        results.append(check)
        print(f"{shape}: sync {sync_s:.2f} s; |logprob - teacher forced| before sync {before:.4f}, after sync to a "
              f"re-drawn model {after:.4f} (had the sync done nothing: {stale:.4f}); free GPU memory awake {mem['free_awake_gib']:.1f} GiB, asleep "
              f"{mem['free_asleep_gib']:.1f}, after sync+wake {mem['free_after_sync_gib']:.1f}", flush=True)
        engine.shutdown()
        model = other = engine = None
        torch.cuda.empty_cache()
    if args.out:
        with open(args.out, "w") as f:
            json.dump(results, f, indent=1)


if __name__ == "__main__":
    main()
