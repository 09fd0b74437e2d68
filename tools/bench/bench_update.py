"""Actor update + log-prob pass throughput: the reference path vs ours, side by side, in one run.

reference: fixed micro-batches of --ref-micro-batch-size padded rows, gradient checkpointing
           on, full (batch, len, vocab) float32 logits.
ours:      rows packed without padding into token-budget micro-batches, log-probs from
           hidden states in chunks, checkpointing on or off (--ours, several variants allowed;
           the fastest update that ran is reported as "ours").
Both run through the real ActorWorker (compute_log_prob, then update_actor) on one
random-init model, so the weights, data and optimizer are the same.

MFU = 6 * params * real tokens / time / peak for the update (2 * params * tokens for the
log-prob pass), attention excluded, as is usual; "+attn" adds the causal attention matmuls
(6 * L^2 * hidden * layers per sequence of length L for the update, 2 * L^2 * ... forward).

    python -m tools.bench.bench_update --shape qwen2.5-3b --out docs/results/bench_update_3b.json
    python -m tools.bench.bench_update --tiny          # a CPU smoke run in seconds

--lora-rank R compares full fine-tuning with LoRA rank R instead (both on --lora-variant of ours,
one worker after the other on the same data): peak memory, training state (weights + grads +
optimizer state), tokens/s and MFU. LoRA's update needs no weight gradients of the frozen base:
its model FLOPs are 4 * params * tokens (forward + input gradients) plus 6 * adapter params * tokens.

    python -m tools.bench.bench_update --shape qwen2.5-3b --lora-rank 64 --out lora_3b.json
"""
from __future__ import annotations

import argparse
import gc
import json
import os
import re
import time

import torch

from verl.protocol import DataProto
from verl.workers.actor import ActorWorker
from verl.workers.config import worker_config
from verl.workers.lora import LoraConfig, trainable_parameters
from verl.workers.model_loader import compile_decoder_layers, set_checkpointing

QWEN2 = dict(model_type="qwen2", vocab_size=151936, max_position_embeddings=32768, rope_theta=1000000.0,
             rms_norm_eps=1e-6, tie_word_embeddings=True)
SHAPES = {
    "qwen2.5-3b": dict(QWEN2, hidden_size=2048, num_hidden_layers=36, num_attention_heads=16, num_key_value_heads=2,
                       intermediate_size=11008),
    "qwen2.5-0.5b": dict(QWEN2, hidden_size=896, num_hidden_layers=24, num_attention_heads=14, num_key_value_heads=2,
                         intermediate_size=4864),
    # Qwen3-4B: per-head q/k norms, head_dim 128 (q_proj 2560 -> 4096), tied embeddings
    "qwen3-4b": dict(model_type="qwen3", vocab_size=151936, max_position_embeddings=40960, rope_theta=1000000.0,
                     rms_norm_eps=1e-6, tie_word_embeddings=True, hidden_size=2560, num_hidden_layers=36,
                     num_attention_heads=32, num_key_value_heads=8, head_dim=128, intermediate_size=9728),
    "tiny-qwen3": dict(model_type="qwen3", vocab_size=512, hidden_size=64, num_hidden_layers=2, num_attention_heads=4,
                       num_key_value_heads=2, head_dim=32, intermediate_size=128, max_position_embeddings=256,
                       tie_word_embeddings=True),
    "tiny": dict(model_type="qwen2", vocab_size=512, hidden_size=64, num_hidden_layers=2, num_attention_heads=4,
                 num_key_value_heads=2, intermediate_size=128, max_position_embeddings=256, tie_word_embeddings=True),
}


# Kernel groups of a profile, read from kernel names (cuBLAS/CUTLASS GEMMs, flash attention, Triton, ATen's
# elementwise and reduction kernels, the fused optimizer, copies), so eager and compiled runs read the same.
# First match wins: order from the most specific name pattern to the most generic.
GROUPS: list[tuple[str, re.Pattern]] = [
    ("optimizer", re.compile(r"adam|multi_tensor|foreach|fused_optim", re.I)),
    ("attention", re.compile(r"flash|fmha|attention|sdpa|_attn|decode_attention", re.I)),
    ("gemm", re.compile(r"gemm|cutlass|nvjet|xmma|sm\d+_.*(?:tensorop|hmma)|splitkreduce|cublas", re.I)),
    ("loss/softmax", re.compile(r"softmax|log_softmax|cross_entropy|nll_loss|logsumexp", re.I)),
    ("triton (fused)", re.compile(r"triton", re.I)),
    ("reduction/norm", re.compile(r"reduce|norm|sum_kernel|mean|welford", re.I)),
    ("copy/cast", re.compile(r"copy|memcpy|memset|cat|index|gather|scatter|fill", re.I)),
    ("elementwise", re.compile(r"elementwise|vectorized|unrolled|pointwise", re.I)),
]


def group_of(kernel_name: str) -> str:
    """The group a kernel belongs to ("other" when no pattern matches)."""
    for group, pattern in GROUPS:
        if pattern.search(kernel_name):
            return group
    return "other"


def breakdown(events) -> dict[str, dict]:
    """Kernel seconds and launches per group from a profiler's key_averages() (CUDA events only)."""
    out: dict[str, dict] = {}
    for e in events:
        if getattr(e, "device_type", None) is None or "CUDA" not in str(e.device_type):
            continue
        slot = out.setdefault(group_of(e.key), dict(seconds=0.0, launches=0))
        slot["seconds"] += e.self_device_time_total / 1e6
        slot["launches"] += e.count
    return dict(sorted(out.items(), key=lambda kv: -kv[1]["seconds"]))


def format_breakdown(groups: dict[str, dict], wall_s: float) -> str:
    """One line per group: ms, share of kernel time, launches; then kernel time against the wall."""
    total = sum(g["seconds"] for g in groups.values())
    lines = [f"{name:16} {g['seconds'] * 1e3:10.1f} ms {g['seconds'] / total:6.1%} {g['launches']:7d} launches"
             for name, g in groups.items()] if total else []
    lines.append(f"{'kernel time':16} {total * 1e3:10.1f} ms of {wall_s * 1e3:.1f} ms wall "
                 f"(gaps {max(wall_s - total, 0.0) * 1e3:.1f} ms)")
    return "\n".join(lines)


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--shape", choices=sorted(SHAPES), default="qwen2.5-3b", help="model shape to time")
    p.add_argument("--tiny", action="store_true", help="tiny model and batch; runs on CPU in seconds")
    p.add_argument("--rows", type=int, default=64, help="trajectories in the batch (the reference: 64 per step)")
    p.add_argument("--mini-batch", type=int, default=32, help="rows per optimizer step")
    p.add_argument("--prompt", type=int, nargs=2, default=(256, 1024), metavar=("MIN", "MAX"),
                   help="prompt length range (tokens)")
    p.add_argument("--response", type=int, nargs=2, default=(64, 1024), metavar=("MIN", "MAX"),
                   help="response length range (tokens)")
    p.add_argument("--ref-micro-batch-size", type=int, default=8, help="the reference implementation's micro-batch")
    p.add_argument("--ours", default="1:32768:65536,1:16384:65536,0:8192:65536,0:12288:65536",
                   help="variants of ours, comma-separated CKPT:TRAIN_TOKENS:LOG_PROB_TOKENS[:COMPILE] (CKPT, "
                        "COMPILE 1/0)")
    p.add_argument("--chunk", type=int, default=2048, help="ours: positions per float32 logits chunk")
    p.add_argument("--warmup", type=int, default=1, help="untimed warm-up updates")
    p.add_argument("--iters", type=int, default=2, help="timed updates")
    p.add_argument("--peak-tflops", type=float, default=989.0, help="dense bf16 peak (H200 SXM: 989)")
    p.add_argument("--device", default="auto", help="auto | cpu | cuda")
    p.add_argument("--seed", type=int, default=0, help="seed of the lengths and weights")
    p.add_argument("--out", default=None, help="write the results as JSON here")
    p.add_argument("--profile", action="store_true",
                   help="profile one update of the fastest variant: kernel time by group (GEMM, attention, ...) "
                        "and the top kernels")
    p.add_argument("--lora-rank", type=int, default=0, help="> 0: compare full fine-tuning with LoRA of this rank")
    p.add_argument("--lora-alpha", type=float, default=None, help="LoRA alpha (default 2 * rank)")
    p.add_argument("--lora-targets", default="all-linear", help="comma-separated Linear names, or all-linear")
    p.add_argument("--lora-variant", default="1:16384:65536", help="the variant of ours both runs use (as --ours)")
    args = p.parse_args(argv)
    if args.tiny:
        args.shape = args.shape if args.shape.startswith("tiny") else "tiny"
        args.rows, args.mini_batch = 8, 4
        args.prompt, args.response, args.ref_micro_batch_size = (8, 24), (4, 24), 2
        args.ours, args.warmup, args.iters = "1:64:256,0:48:256", 0, 1
        args.lora_variant = "1:64:256"
    if args.device == "auto":
        args.device = "cuda" if torch.cuda.is_available() else "cpu"
    return args


def parse_variants(text: str) -> list[dict]:
    out = []
    for item in text.split(","):
        fields = item.split(":")
        try:
            ckpt, train, log_prob, compiled = (int(x) for x in (fields + ["0"])[:4])
            assert len(fields) in (3, 4)
        except (ValueError, AssertionError):
            raise SystemExit(f"--ours: {item!r} is not CKPT:TRAIN_TOKENS:LOG_PROB_TOKENS[:COMPILE]")
        out.append(dict(checkpointing=bool(ckpt), max_tokens=train, log_prob_max_tokens=log_prob,
                        compile=bool(compiled)))
    return out


def make_batch(args, vocab: int) -> DataProto:
    """Variable-length trajectories in our layout: left-padded prompt, right-padded response."""
    g = torch.Generator().manual_seed(args.seed)
    n, (p_lo, p_hi), (r_lo, r_hi) = args.rows, args.prompt, args.response
    p_len = torch.randint(p_lo, p_hi + 1, (n,), generator=g)
    r_len = torch.randint(r_lo, r_hi + 1, (n,), generator=g)
    cols = torch.arange(p_hi + r_hi)
    attn = ((cols >= p_hi - p_len[:, None]) & (cols < p_hi + r_len[:, None])).long()  # (n, p_hi + r_hi)
    ids = torch.randint(3, vocab, attn.shape, generator=g) * attn
    response_mask = attn[:, p_hi:].clone()
    response_mask[:, 16:32] = 0  # an <information> block: attended, not trained
    return DataProto.from_dict({
        "input_ids": ids, "attention_mask": attn, "position_ids": (attn.cumsum(-1) - 1).clamp(min=0),
        "responses": ids[:, p_hi:], "response_mask": response_mask,
        "advantages": torch.randn(n, r_hi, generator=g) * response_mask,
    }, meta={"temperature": 1.0})


def configure(worker: ActorWorker, args, variant: dict | None) -> None:
    """Switch the worker between the reference path (variant None) and a variant of ours."""
    cfg = worker.config.actor
    if variant is None:
        cfg.use_remove_padding, cfg.logprob_chunk_size = False, None
        cfg.max_tokens_per_micro_batch = cfg.log_prob_max_tokens_per_micro_batch = None
        cfg.ppo_micro_batch_size = args.ref_micro_batch_size
        set_checkpointing(worker.model, True)
        compile_decoder_layers(worker.model, False)
    else:
        cfg.use_remove_padding, cfg.logprob_chunk_size = True, args.chunk
        cfg.max_tokens_per_micro_batch = variant["max_tokens"]
        cfg.log_prob_max_tokens_per_micro_batch = variant["log_prob_max_tokens"]
        set_checkpointing(worker.model, variant["checkpointing"])
        compile_decoder_layers(worker.model, variant["compile"])


def sync(device: str) -> None:
    if device == "cuda":
        torch.cuda.synchronize()


def peak_gib(device: str) -> float | None:
    return torch.cuda.max_memory_allocated() / 2**30 if device == "cuda" else None


def reset_peak(device: str) -> None:
    if device == "cuda":
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats()


def time_run(worker: ActorWorker, data: DataProto, args) -> dict:
    """Seconds and peak memory of compute_log_prob and update_actor (mean over --iters)."""
    for _ in range(args.warmup):
        worker.update_actor(data.union(worker.compute_log_prob(data)))
    lp_s = up_s = 0.0
    lp_mem = up_mem = None
    for _ in range(args.iters):
        reset_peak(args.device)
        sync(args.device)
        t0 = time.perf_counter()
        old = worker.compute_log_prob(data)
        sync(args.device)
        t1 = time.perf_counter()
        lp_mem = peak_gib(args.device)
        reset_peak(args.device)
        sync(args.device)
        t2 = time.perf_counter()
        worker.update_actor(data.union(old))
        sync(args.device)
        up_s += time.perf_counter() - t2
        lp_s += t1 - t0
        up_mem = peak_gib(args.device)
    return dict(log_prob_s=lp_s / args.iters, update_s=up_s / args.iters, log_prob_peak_gib=lp_mem,
                update_peak_gib=up_mem)


def profile_update(worker: ActorWorker, data: DataProto, args) -> dict:
    """One update_actor under the profiler (its old log-probs computed before): kernel time per group, top kernels."""
    from torch.profiler import ProfilerActivity, profile as torch_profile
    acts = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if args.device == "cuda" else [])
    old = worker.compute_log_prob(data)
    sync(args.device)
    with torch_profile(activities=acts) as prof:
        t0 = time.perf_counter()
        worker.update_actor(data.union(old))
        sync(args.device)
        wall = time.perf_counter() - t0
    events = prof.key_averages()
    groups = breakdown(events)
    sort = "cuda_time_total" if args.device == "cuda" else "cpu_time_total"
    print("update kernels by group:\n" + format_breakdown(groups, wall) + "\n"
          + events.table(sort_by=sort, row_limit=25), flush=True)
    return dict(wall_s=wall, groups=groups)


def figures(run: dict, tokens: int, flops: dict, peak: float) -> dict:
    up, lp = run["update_s"], run["log_prob_s"]
    return dict(
        update_tokens_per_s=tokens / up, log_prob_tokens_per_s=tokens / lp,
        update_mfu=flops["update"] / up / peak, update_mfu_with_attn=(flops["update"] + flops["update_attn"]) / up / peak,
        log_prob_mfu=flops["log_prob"] / lp / peak,
        log_prob_mfu_with_attn=(flops["log_prob"] + flops["log_prob_attn"]) / lp / peak,
    )


def logprob_difference(worker: ActorWorker, data: DataProto, args, variant: dict) -> tuple[float, float]:
    """Max and mean |log p| difference between the reference path and ours on the same weights."""
    configure(worker, args, None)
    ref = worker.compute_log_prob(data).batch["old_log_probs"]
    configure(worker, args, variant)
    ours = worker.compute_log_prob(data).batch["old_log_probs"]
    real = data.batch["attention_mask"][:, -ref.shape[1] :].bool()
    diff = (ref - ours)[real].abs()
    return float(diff.max()), float(diff.mean())


def train_state_gib(worker: ActorWorker) -> float:
    """Bytes held for training: parameters, their gradients and the optimizer's state (local shard)."""
    n = sum(p.numel() * p.element_size() for p in worker.model.parameters())
    n += sum(p.grad.numel() * p.grad.element_size() for p in worker.model.parameters() if p.grad is not None)
    for state in worker.optimizer.state.values():
        n += sum(t.numel() * t.element_size() for t in state.values() if torch.is_tensor(t))
    return n / 2**30


def lora_main(args, spec: dict, data: DataProto, lengths: torch.Tensor) -> dict:
    """Full fine-tuning vs LoRA on the same data and variant of ours, one worker at a time."""
    tokens = int(lengths.sum())
    variant = parse_variants(args.lora_variant)[0]
    attn_unit = float((lengths**2).sum()) * spec["hidden_size"] * spec["num_hidden_layers"]
    peak = args.peak_tflops * 1e12
    runs = []
    for rank in (0, args.lora_rank):
        lora = LoraConfig(rank=rank, alpha=args.lora_alpha or 2.0 * rank, target_modules=args.lora_targets.split(","))
        config = worker_config(model=spec, device=args.device, dtype="bfloat16", lr=1e-7, grad_clip=1.0,
                               ppo_mini_batch_size=args.mini_batch, ppo_micro_batch_size=args.ref_micro_batch_size,
                               use_remove_padding=True, gradient_checkpointing=True, seed=args.seed, lora=lora)
        worker = ActorWorker(config)
        reset_peak(args.device)
        t0 = time.perf_counter()
        with torch.device(args.device):
            worker.init_model()
        init_s = time.perf_counter() - t0
        params = sum(p.numel() for p in worker.model.parameters())
        trainable = sum(p.numel() for p in trainable_parameters(worker.model))
        base = params - trainable
        # full: 6N per token; LoRA: no weight gradients for the frozen base (2N forward + 2N input grads)
        flops = dict(update=(6.0 * trainable + (4.0 * base if rank else 0.0)) * tokens, log_prob=2.0 * params * tokens,
                     update_attn=6.0 * attn_unit, log_prob_attn=2.0 * attn_unit)
        configure(worker, args, variant)
        name = f"lora r{rank}" if rank else "full"
        try:
            run = time_run(worker, data, args)
            run.update(figures(run, tokens, flops, peak))
            run["train_state_gib"] = train_state_gib(worker)
        except torch.cuda.OutOfMemoryError as e:
            run = {"error": f"out of memory: {str(e).splitlines()[0]}"}
        run.update(name=name, params=params, trainable_params=trainable, init_s=init_s, real_tokens=tokens)
        runs.append(run)
        print(f"{name}: " + ", ".join(f"{k}={v:.4g}" for k, v in run.items() if isinstance(v, float)), flush=True)
        del worker
        gc.collect()
        reset_peak(args.device)
    full, lora_run = runs
    if "error" in full and "error" in lora_run:
        raise SystemExit(f"neither run finished: {json.dumps(runs, default=str)}")
    result = dict(
        shape=args.shape, device=args.device,
        device_name=torch.cuda.get_device_name() if args.device == "cuda" else "cpu", torch=torch.__version__,
        rows=args.rows, real_tokens=tokens, variant=variant, lora_rank=args.lora_rank, peak_tflops=args.peak_tflops,
        mfu_note="mfu: model FLOPs / time / peak; full 6*params*tokens, LoRA 4*base params*tokens + "
                 "6*adapter params*tokens (no weight gradients for the frozen base); log-prob 2*params*tokens",
        runs=runs, args=vars(args))
    rows = [("trainable params", "trainable_params", "{:,.0f}"), ("update tokens/s", "update_tokens_per_s", "{:,.0f}"),
            ("update MFU", "update_mfu", "{:.1%}"), ("update peak GiB", "update_peak_gib", "{:.1f}"),
            ("train state GiB", "train_state_gib", "{:.2f}"), ("log-prob tokens/s", "log_prob_tokens_per_s", "{:,.0f}"),
            ("log-prob peak GiB", "log_prob_peak_gib", "{:.1f}")]
    print(f"\n{args.shape} ({full['params'] / 1e9:.2f}B params), {args.rows} rows, {tokens:,} real tokens; "
          f"variant {variant}")
    print_side_by_side(rows, ("full", full), (lora_run["name"], lora_run))
    for key in ("update_tokens_per_s", "update_peak_gib", "train_state_gib"):
        if full.get(key) and lora_run.get(key) is not None:
            result[f"ratio_{key}"] = lora_run[key] / full[key]
    return result


def write(result: dict, path: str | None) -> None:
    if path:
        os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
        with open(path, "w") as f:
            json.dump(result, f, indent=1, default=str)
        print(f"wrote {path}")



def print_side_by_side(rows: list[tuple[str, str, str]], left: tuple[str, dict], right: tuple[str, dict]) -> None:
    """One table line per (label, key, format): the two runs' values and right / left."""
    (a_name, a_run), (b_name, b_run) = left, right
    print(f"{'':22}{a_name:>14}{b_name:>14}{'ratio':>9}")
    for label, key, fmt in rows:
        a, b = a_run.get(key), b_run.get(key)
        cell = lambda v: fmt.format(v) if v is not None else "-"  # noqa: E731
        ratio = f"{b / a:.2f}x" if a and b is not None else "-"
        print(f"{label:22}{cell(a):>14}{cell(b):>14}{ratio:>9}")

def main(argv=None) -> dict:
    args = parse_args(argv)
    spec = SHAPES[args.shape]
    variants = parse_variants(args.ours)
    data = make_batch(args, spec["vocab_size"])
    lengths = data.batch["attention_mask"].sum(-1).double()
    tokens = int(lengths.sum())
    if args.lora_rank:
        result = lora_main(args, spec, data, lengths)
        write(result, args.out)
        return result
    config = worker_config(model=spec, device=args.device, dtype="bfloat16", lr=1e-7, grad_clip=1.0,
                           ppo_mini_batch_size=args.mini_batch, ppo_micro_batch_size=args.ref_micro_batch_size,
                           use_remove_padding=True, gradient_checkpointing=True, seed=args.seed)
    worker = ActorWorker(config)
    t0 = time.perf_counter()
    with torch.device(args.device):  # random init straight on the device
        worker.init_model()
    init_s = time.perf_counter() - t0
    params = sum(p.numel() for p in worker.model.parameters())  # tied embedding counted once
    attn_unit = float((lengths**2).sum()) * spec["hidden_size"] * spec["num_hidden_layers"]  # causal: L^2/2 * 2 matmuls * 2
    flops = dict(update=6.0 * params * tokens, log_prob=2.0 * params * tokens,
                 update_attn=6.0 * attn_unit, log_prob_attn=2.0 * attn_unit)
    peak = args.peak_tflops * 1e12
    max_diff, mean_diff = logprob_difference(worker, data, args, variants[0])

    runs, ours_variants = [], []
    for variant in [None] + variants:
        name = "reference" if variant is None else "ours[ckpt={checkpointing:d},tokens={max_tokens},lp_tokens={log_prob_max_tokens},compile={compile:d}]".format(**variant)
        configure(worker, args, variant)
        try:
            run = time_run(worker, data, args)
            run.update(figures(run, tokens, flops, peak))
        except torch.cuda.OutOfMemoryError as e:  # a variant too big for the device; the others still run
            run = {"error": f"out of memory: {str(e).splitlines()[0]}"}
            worker.optimizer.zero_grad(set_to_none=True)
            reset_peak(args.device)
        run.update(name=name, variant=variant)
        (runs if variant is None else ours_variants).append(run)
        print(f"{name}: " + ", ".join(f"{k}={v:.4g}" for k, v in run.items() if isinstance(v, float)), flush=True)

    ok = [r for r in ours_variants if "error" not in r]
    if not ok or "error" in runs[0]:
        raise SystemExit(f"no comparable runs: {json.dumps(runs + ours_variants, default=str)}")
    best = dict(max(ok, key=lambda r: r["update_tokens_per_s"]), name="ours")
    runs.append(best)
    ref = runs[0]
    result = dict(
        shape=args.shape, device=args.device,
        device_name=torch.cuda.get_device_name() if args.device == "cuda" else "cpu",
        torch=torch.__version__, params=params, rows=args.rows, real_tokens=tokens,
        padded_tokens=int(data.batch["attention_mask"].numel()), init_s=init_s, peak_tflops=args.peak_tflops,
        max_abs_logprob_diff=max_diff, mean_abs_logprob_diff=mean_diff,
        ratio_update_tokens_per_s=best["update_tokens_per_s"] / ref["update_tokens_per_s"],
        ratio_log_prob_tokens_per_s=best["log_prob_tokens_per_s"] / ref["log_prob_tokens_per_s"],
        mfu_note="mfu: 6*params*real tokens (update) or 2*params*tokens (log-prob) / time / peak, attention "
                 "excluded; *_with_attn adds causal attention matmul FLOPs",
        runs=runs, ours_variants=ours_variants, args=vars(args),
    )
    for r in runs:
        r["real_tokens"] = tokens
    if args.profile:
        configure(worker, args, best["variant"])
        result["profile"] = profile_update(worker, data, args)

    rows = [("update tokens/s", "update_tokens_per_s", "{:,.0f}"), ("update MFU (6N)", "update_mfu", "{:.1%}"),
            ("update MFU (+attn)", "update_mfu_with_attn", "{:.1%}"), ("update peak GiB", "update_peak_gib", "{:.1f}"),
            ("log-prob tokens/s", "log_prob_tokens_per_s", "{:,.0f}"), ("log-prob MFU (2N)", "log_prob_mfu", "{:.1%}"),
            ("log-prob peak GiB", "log_prob_peak_gib", "{:.1f}")]
    print(f"\n{args.shape} ({params / 1e9:.2f}B params), {args.rows} rows, {tokens:,} real of "
          f"{result['padded_tokens']:,} padded tokens; ours = {best['variant']}")
    print_side_by_side(rows, ("reference", ref), ("ours", best))
    print(f"log-prob |ref - ours|: max {max_diff:.3g}, mean {mean_diff:.3g}")
    write(result, args.out)
    return result


if __name__ == "__main__":
    main()
