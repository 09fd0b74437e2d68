"""Rollout throughput: StaticRollout (static cache + CUDA graphs) against transformers `generate`.

Same random-init model, same prompts, side by side in one run; prints new tokens per second
for each path and the ratio, the decode step against its HBM floor (weights plus the average KV
cache read once per step), then checks that the fast path samples from the same
distribution: its returned log-probs against a teacher-forced forward of the HF model over
the same tokens, and greedy agreement with the plain loop.

    python -m tools.bench.bench_rollout --shape qwen2.5-3b --batch 64 256 --out results.json   # GPU
    python -m tools.bench.bench_rollout --compile ...   # also StaticRollout with rollout.compile=true
    python -m tools.bench.bench_rollout --compile --attention triton matmul --profile ...  # both decode attentions
    python -m tools.bench.bench_rollout --tiny                                                 # CPU smoke
"""
from __future__ import annotations

import argparse
import functools
import json
import math
import subprocess
import time

import torch
from transformers import Qwen2Config, Qwen2ForCausalLM

from verl.workers.rollout.base import SamplingParams
from verl.workers.rollout.hf_rollout import HFRollout
from verl.workers.rollout.static_rollout import StaticRollout

# Qwen2.5 shapes (hidden, layers, heads, kv heads, intermediate); vocab 151,936, tied embeddings
SHAPES = {
    "tiny": (64, 2, 4, 2, 128),
    "qwen2.5-0.5b": (896, 24, 14, 2, 4864),
    "qwen2.5-3b": (2048, 36, 16, 2, 11008),
}


class _Tok:
    """Just enough tokenizer for the decode loops: the benchmark uses no stop strings."""
    pad_token_id, eos_token_id = 0, None

    def decode(self, ids, **kw):
        return " ".join(map(str, ids))


def build(shape: str, device: str, dtype: torch.dtype) -> Qwen2ForCausalLM:
    hidden, layers, heads, kv, inter = SHAPES[shape]
    vocab = 512 if shape == "tiny" else 151936
    cfg = Qwen2Config(vocab_size=vocab, hidden_size=hidden, num_hidden_layers=layers, num_attention_heads=heads,
                      num_key_value_heads=kv, intermediate_size=inter, tie_word_embeddings=True,
                      max_position_embeddings=4096, use_sliding_window=False, eos_token_id=None,
                      attn_implementation="sdpa")
    torch.manual_seed(0)
    with torch.device(device):
        model = Qwen2ForCausalLM(cfg).to(dtype)
    model.generation_config.eos_token_id = None  # run every row the full length
    model.generation_config.pad_token_id = 0
    return model.eval()


# Datasheet HBM bandwidths (bytes/s), by the CUDA device name's words, most specific first: the floor is a bound,
# not a measurement. The device tool lends H100 SXM (3.35 TB/s) as well as H200 (4.8 TB/s).
HBM_DATASHEET = [("H100 PCIe", 2.0e12), ("H100 NVL", 3.9e12), ("H100", 3.35e12), ("H200", 4.8e12)]
HBM_BYTES_PER_S = 4.8e12  # a device not in the table (and the CPU smoke runs): the H200's


@functools.cache  # the card does not change within a run; hbm_floor is called per shape and batch
def hbm_bytes_per_s() -> float:
    """GPU 0's datasheet HBM bandwidth (HBM_BYTES_PER_S where unknown or with no GPU). Asked of nvidia-smi, not
    torch: CUDA initialised in this process would force vLLM's workers (bench_rollout_vllm) to spawn."""
    try:
        name = subprocess.run(["nvidia-smi", "--query-gpu=name", "--format=csv,noheader", "-i", "0"],
                              capture_output=True, text=True, timeout=30).stdout
    except (OSError, subprocess.SubprocessError):
        name = ""
    return next((bw for key, bw in HBM_DATASHEET if key in name), HBM_BYTES_PER_S)


def hbm_floor(shape: str, batch: int, prompt_len: int, new_tokens: int) -> dict:
    """The decode step's memory floor: bf16 weights (tied embeddings once) plus the KV cache of the
    average context (prompt + half the generation) read once, at this card's datasheet bandwidth."""
    bw = hbm_bytes_per_s()
    hidden, layers, heads, kv, inter = SHAPES[shape]
    vocab = 512 if shape == "tiny" else 151936
    head_dim = hidden // heads
    params = vocab * hidden + layers * (hidden * (heads + 2 * kv) * head_dim + (heads + 2 * kv) * head_dim
                                        + heads * head_dim * hidden + 3 * hidden * inter + 2 * hidden) + hidden
    kv_bytes = layers * 2 * kv * head_dim * 2 * batch * (prompt_len + new_tokens / 2)
    step_bytes = 2 * params + kv_bytes
    return {"params": params, "bytes_per_step": step_bytes, "hbm_bytes_per_s": bw, "floor_step_s": step_bytes / bw,
            "floor_tok_s": batch * bw / step_bytes}


def workload_parser(doc: str) -> argparse.ArgumentParser:
    """A rollout benchmark's parser with the workload flags: shapes, batch sizes, prompt and generated lengths."""
    p = argparse.ArgumentParser(description=doc.splitlines()[0])
    p.add_argument("--shape", nargs="+", default=["qwen2.5-0.5b", "qwen2.5-3b"], choices=list(SHAPES),
                   help="model shapes to time")
    p.add_argument("--batch", nargs="+", type=int, default=[64, 256], help="batch sizes to time")
    p.add_argument("--prompt-len", type=int, default=512, help="prompt tokens per row")
    p.add_argument("--new-tokens", type=int, default=256, help="tokens generated per row")
    return p


def sync(device: str) -> None:
    if device == "cuda":
        torch.cuda.synchronize()


def timed(fn, device: str) -> float:
    sync(device)
    t0 = time.perf_counter()
    fn()
    sync(device)
    return time.perf_counter() - t0


def hf_generate(model, prompts: list[list[int]], new: int):
    """The reference path: transformers `generate` with its default (dynamic) cache, sampling at T=1."""
    ids = torch.tensor(prompts, device=model.device)  # equal lengths: no padding needed
    return model.generate(input_ids=ids, attention_mask=torch.ones_like(ids), do_sample=True, temperature=1.0,
                          top_p=1.0, top_k=0, max_new_tokens=new, min_new_tokens=new)


@torch.no_grad()
def teacher_forced_logprobs(model, prompt: list[int], generated: list[int]) -> torch.Tensor:
    ids = torch.tensor([prompt + generated], device=model.device)
    logits = model(input_ids=ids).logits[0, len(prompt) - 1:-1].float()  # (len(generated), vocab)
    return torch.log_softmax(logits, -1).gather(-1, torch.tensor(generated, device=model.device)[:, None])[:, 0]


def profile(fast: StaticRollout, prompts, sp: SamplingParams, device: str, kernels: bool, floor: dict) -> dict:
    """Where the time of one call goes: prefill, one replayed decode step at the average context (prompt +
    half the generation, the floor's), and (kernels) the top kernels."""
    width, half = len(prompts[0]), sp.max_new_tokens // 2
    with torch.inference_mode():
        fast._prefill(prompts, width)  # warm (a compiled prefill compiles here)
        t_pre = timed(lambda: fast._prefill(prompts, width), device)
        st = fast._state
        st["col"].fill_(width + half)  # as if half the tokens were out: both attentions read that much cache
        st["pos"][:len(prompts)] += half
        span = math.ceil((width + half + 1) / fast.bucket) * fast.bucket
        step = fast._step_fn(len(prompts), span, sp)
        t_step = timed(lambda: [step() for _ in range(32)], device) / 32
        st["col"].fill_(width + half)
    out = {"prefill_s": t_pre, "decode_step_s": t_step, "decode_tok_s": len(prompts) / t_step,
           "decode_x_floor": t_step / floor["floor_step_s"]}
    print(f"  prefill {t_pre * 1e3:.1f} ms; decode step {t_step * 1e3:.2f} ms at span {span} = "
          f"{out['decode_tok_s']:,.0f} tok/s, {out['decode_x_floor']:.2f}x the HBM floor "
          f"({floor['floor_step_s'] * 1e3:.2f} ms, {floor['floor_tok_s']:,.0f} tok/s)", flush=True)
    if kernels:
        out["kernel_s"] = print_top_kernels(fast, prompts, sp, device, span)
        out["launch_gaps_s"] = t_step - out["kernel_s"]
        print(f"  replayed step {t_step * 1e3:.2f} ms - kernel time {out['kernel_s'] * 1e3:.2f} ms = "
              f"{out['launch_gaps_s'] * 1e3:.2f} ms between kernels", flush=True)
    return out


def print_top_kernels(fast: StaticRollout, prompts, sp: SamplingParams, device: str, span: int) -> float:
    """The most expensive kernels of one prefill and of one decode step, both launched eagerly.

    A replayed CUDA graph hides its kernels from the profiler, so the step runs once outside the
    graph here: the same kernels (compiled ones included), each with its own launch."""
    from torch.profiler import ProfilerActivity, profile as torch_profile
    sort = "cuda_time_total" if device == "cuda" else "cpu_time_total"
    acts = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device == "cuda" else [])
    with torch.inference_mode():
        with torch_profile(activities=acts) as prof:
            fast._prefill(prompts, len(prompts[0]))
            sync(device)
        print("prefill kernels:\n" + prof.key_averages().table(sort_by=sort, row_limit=20), flush=True)
        fast._decode_step(len(prompts), span, sp)  # warm: compiled kernels exist
        sync(device)
        with torch_profile(activities=acts) as prof:
            fast._decode_step(len(prompts), span, sp)
            sync(device)
        events = [e for e in prof.key_averages() if getattr(e, "device_type", None) == torch.autograd.DeviceType.CUDA]
        n_kernels = sum(e.count for e in events)
        print(f"decode step kernels: {n_kernels} launches, "
              f"{sum(e.self_device_time_total for e in events) / 1e3:.2f} ms of kernel time\n"
              + prof.key_averages().table(sort_by=sort, row_limit=25), flush=True)
    return sum(e.self_device_time_total for e in events) / 1e6


def best_tile(path: str, shape: str) -> dict | None:
    """A shape's fastest correct tile from bench_decode_attention (block, target, num_warps[, num_stages]), if any."""
    with open(path) as f:
        rows = [r for r in json.load(f) if r.get("shape") == shape and "best" in r]
    return {k: v for k, v in rows[0]["best"].items() if k != "us"} if rows else None


def main() -> None:
    p = workload_parser(__doc__)
    p.add_argument("--skip-loop", action="store_true", help="do not time the plain HFRollout loop")
    p.add_argument("--skip-generate", action="store_true", help="do not time transformers generate (slow at long shapes)")
    p.add_argument("--tiny", action="store_true", help="CPU smoke run: tiny shape, small batch")
    p.add_argument("--profile", action="store_true", help="time prefill and one decode step; top CUDA kernels")
    p.add_argument("--kernels", action="store_true", help="with --profile: top kernels of a prefill and a step")
    p.add_argument("--compile", action="store_true", help="also time StaticRollout(compile=True) (rollout.compile)")
    p.add_argument("--autotune", action="store_true",
                   help="with --compile: also time rollout.compile_mode=max-autotune-no-cudagraphs (variant "
                        "compiled+autotune: Inductor's Triton GEMMs where they beat cuBLAS)")
    p.add_argument("--linear", action="store_true",
                   help="also time rollout.decode_linear=triton (variant +linear: the split-K decode GEMM; compiled "
                        "with --compile)")
    p.add_argument("--linear-tiles", default=None,
                   help="bench_decode_gemm's JSON: with --linear, run the split-K kernel at each shape's best setting")
    p.add_argument("--attention", nargs="+", default=["auto"], choices=["auto", "triton", "matmul"],
                   help="decode attentions to time (rollout.decode_attention); the first one unsuffixed")
    p.add_argument("--tiles", default=None,
                   help="bench_decode_attention's JSON: also time the Triton path at each shape's best tile (variant "
                        "+tuned, compiled with --compile)")
    p.add_argument("--out", default=None, help="write the results as JSON here")
    args = p.parse_args()
    if args.tiny:
        args.shape, args.batch, args.prompt_len, args.new_tokens = ["tiny"], [4], 16, 8
    device = "cuda" if torch.cuda.is_available() else "cpu"
    dtype = torch.bfloat16 if device == "cuda" else torch.float32
    results = []
    for shape in args.shape:
        model = build(shape, device, dtype)
        vocab = model.config.vocab_size
        opts = dict(device=device, max_batch_size=max(args.batch), eos_token_ids=[],
                    max_model_len=args.prompt_len + args.new_tokens + StaticRollout.bucket)
        fasts = {}
        for i, attention in enumerate(args.attention):
            tag = "" if i == 0 else f"+{attention}"
            fasts["static" + tag] = StaticRollout(model, _Tok(), decode_attention=attention, **opts)
            if args.compile:
                fasts["compiled" + tag] = StaticRollout(model, _Tok(), compile=True, decode_attention=attention, **opts)
                if args.autotune:
                    fasts["compiled+autotune" + tag] = StaticRollout(
                        model, _Tok(), compile=True, compile_mode="max-autotune-no-cudagraphs",
                        decode_attention=attention, **opts)
        tile = best_tile(args.tiles, shape) if args.tiles else None
        if tile:
            fast = StaticRollout(model, _Tok(), compile=args.compile, decode_attention="triton", **opts)
            fast._triton_attn = functools.partial(fast._triton_attn, **tile)
            name = ("compiled" if args.compile else "static") + "+tuned"
            fasts[name] = fast
            print(f"{shape}: {name} uses the tile {tile}", flush=True)
        if args.linear:
            from verl.workers.rollout import triton_decode_linear
            setting = best_tile(args.linear_tiles, shape) if args.linear_tiles else None
            triton_decode_linear.TILE = {**triton_decode_linear.DEFAULT_TILE, **(setting or {})}  # this shape's
            name = ("compiled" if args.compile else "static") + "+linear"
            fasts[name] = StaticRollout(model, _Tok(), compile=args.compile, decode_attention=args.attention[0],
                                        decode_linear="triton", **opts)
            print(f"{shape}: {name} runs the split-K kernel at {triton_decode_linear.TILE}", flush=True)
        loop = HFRollout(model, _Tok(), device=device, max_batch_size=max(args.batch), eos_token_ids=[])
        sp = SamplingParams(temperature=1.0, max_new_tokens=args.new_tokens, seed=0)
        for batch in args.batch:
            g = torch.Generator().manual_seed(batch)
            prompts = torch.randint(1, vocab, (batch, args.prompt_len), generator=g).tolist()
            new_tokens = batch * args.new_tokens
            floor = hbm_floor(shape, batch, args.prompt_len, args.new_tokens)
            row = {"shape": shape, "batch": batch, "prompt_len": args.prompt_len, "new_tokens": args.new_tokens,
                   "hbm_floor": floor}
            for name, fast in fasts.items():
                row[f"{name}_first_call_s"] = timed(lambda: fast.generate(prompts, sp), device)  # graphs, compile
                row[f"{name}_s"] = timed(lambda: fast.generate(prompts, sp), device)
            t_ref = None if args.skip_generate else timed(lambda: hf_generate(model, prompts, args.new_tokens), device)
            t_loop = None if args.skip_loop else timed(lambda: loop.generate(prompts, sp), device)
            row.update(hf_generate_tok_s=t_ref and new_tokens / t_ref, hf_loop_tok_s=t_loop and new_tokens / t_loop)
            line = f"{shape:13s} batch {batch:4d}:" + (f" generate {new_tokens / t_ref:9.0f} tok/s |" if t_ref else "")
            if t_loop is not None:
                line += f"  plain loop {new_tokens / t_loop:9.0f} tok/s |"
            for name in fasts:
                row[f"{name}_tok_s"] = new_tokens / row[f"{name}_s"]
                row[f"{name}_speedup_vs_generate"] = t_ref and t_ref / row[f"{name}_s"]
                vs = f" x{row[f'{name}_speedup_vs_generate']:.1f}" if t_ref else ""
                line += (f"  {name} {row[f'{name}_tok_s']:9.0f} tok/s{vs}"
                         f" (first call {row[f'{name}_first_call_s']:.1f} s) |")
            results.append(row)
            print(line + f"  HBM floor {floor['floor_tok_s']:,.0f} tok/s (decode only, "
                  f"{floor['bytes_per_step'] / 1e9:.1f} GB a step; every figure here includes the prefill)", flush=True)
        if args.profile:
            for i, (name, fast) in enumerate(fasts.items()):
                print(f"{shape} {name} ({fast.decode_attention} attention), batch {len(prompts)}:", flush=True)
                results.append({"shape": shape, "variant": name, "batch": len(prompts),
                                **profile(fast, prompts, sp, device, args.kernels and not name.startswith("static"),
                                          hbm_floor(shape, len(prompts), args.prompt_len, args.new_tokens))})
        # same distribution: returned log-probs vs a teacher-forced forward; greedy vs the plain loop
        g = torch.Generator().manual_seed(1)
        prompts = torch.randint(1, vocab, (8, args.prompt_len), generator=g).tolist()
        greedy = SamplingParams(greedy=True, max_new_tokens=64)
        b = loop.generate(prompts, greedy)
        for name, fast in fasts.items():
            outs = fast.generate(prompts, SamplingParams(max_new_tokens=64, seed=3, return_logprobs=True))
            diffs = torch.cat([(torch.tensor(o.logprobs, device=device) - teacher_forced_logprobs(model, pr, o.token_ids)).abs()
                               for pr, o in zip(prompts, outs)])
            a = fast.generate(prompts, greedy)
            agree = sum(x == y for oa, ob in zip(a, b) for x, y in zip(oa.token_ids, ob.token_ids)) / (8 * 64)
            first_split = [next((i for i, (x, y) in enumerate(zip(oa.token_ids, ob.token_ids)) if x != y), 64)
                           for oa, ob in zip(a, b)]
            check = {"shape": shape, "variant": name, "logprob_abs_diff_max": float(diffs.max()),
                     "logprob_abs_diff_mean": float(diffs.mean()), "greedy_token_agreement": agree,
                     "greedy_first_divergence": first_split}
            results.append(check)
            print(f"{shape:13s} {name} check: |logprob - teacher forced| max {check['logprob_abs_diff_max']:.4f} "
                  f"mean {check['logprob_abs_diff_mean']:.5f}; greedy tokens equal to the plain loop {agree:.3f} "
                  f"(first divergence per row {first_split})", flush=True)
        model = fasts = fast = loop = None  # free the GPU before the next shape
        if device == "cuda":
            torch.cuda.empty_cache()
        # The compiled functions are shared by every StaticRollout: without a reset the next shape
        # recompiles them with dynamic sizes (slower kernels than a run of that shape alone).
        torch._dynamo.reset()
    if args.out:
        with open(args.out, "w") as f:
            json.dump({"device": torch.cuda.get_device_name() if device == "cuda" else "cpu",
                       "torch": torch.__version__, "results": results}, f, indent=1)


if __name__ == "__main__":
    main()
