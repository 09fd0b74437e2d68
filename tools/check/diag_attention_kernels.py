"""Which CUDA attention kernel (inference and training forward) disagrees with the CPU on a Gemma 3 270M-shaped model (head_dim 256,
GQA 4:1, sliding window 512)? Random init, seeded; rows right-padded to 700/650/500/300 tokens.
Prints, per path, max |logit diff| and mean KL(cpu || path) over the real positions, against the
float32 CPU forward of the same weights, and the greedy continuation of each path.
Its output on the H200: docs/results/h200/diag_attention.txt.

    python -m tools.check.diag_attention_kernels                     # on the GPU machine (needs its CPU too)
    python -m tools.check.diag_attention_kernels --device cpu --tiny # the same checks, a 2-layer model, CPU only
"""
import argparse
import contextlib
import time

import torch
from torch.nn.attention import SDPBackend, sdpa_kernel
from transformers import AutoConfig, AutoModelForCausalLM



def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--device", default="cuda",
                    help="the device whose kernels are compared with the CPU float32 forward")
    ap.add_argument("--tiny", action="store_true",
                    help="a 2-layer model with short rows (a smoke run, not a diagnosis)")
    return ap.parse_args(argv)


def shapes(tiny: bool) -> tuple[dict, list[int], int, int, int]:
    """The model's config fields, the row lengths, the token id bound, the decoding prompt's length and new tokens."""
    if tiny:
        shape = dict(vocab_size=512, hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
                     num_key_value_heads=1, head_dim=16, query_pre_attn_scalar=16, sliding_window=16,
                     max_position_embeddings=256, layer_types=["sliding_attention", "full_attention"])
        return shape, [70, 65, 50, 30] * 2, 500, 60, 8
    shape = dict(vocab_size=32768, hidden_size=640, intermediate_size=2048, num_hidden_layers=18, num_attention_heads=4,
                 num_key_value_heads=1, head_dim=256, query_pre_attn_scalar=256, sliding_window=512,
                 max_position_embeddings=32768, layer_types=(["sliding_attention"] * 5 + ["full_attention"]) * 3)
    return shape, [700, 650, 500, 300] * 4, 20000, 600, 24  # 16 rows, as an SFT batch


def refused(name: str, e: Exception) -> None:  # a backend that refuses these inputs says so
    print(f"{name:40s} refused: {type(e).__name__}: {str(e).splitlines()[0][:120]}", flush=True)


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    dev = args.device
    torch.manual_seed(0)
    shape, lens, vocab_hi, prompt_len, new = shapes(args.tiny)
    cfg = AutoConfig.for_model("gemma3_text", **shape)
    model = AutoModelForCausalLM.from_config(cfg, attn_implementation="sdpa").eval()
    ids = torch.randint(3, vocab_hi, (len(lens), max(lens)), generator=torch.Generator().manual_seed(1))
    attn = (torch.arange(max(lens))[None] < torch.tensor(lens)[:, None]).long()
    ids = ids * attn
    real = attn.bool()
    device_type = torch.device(dev).type

    def report(name: str, out: torch.Tensor) -> None:
        lp = out.log_softmax(-1)
        kl = (ref_lp.exp() * (ref_lp - lp)).sum(-1)[real].mean()
        print(f"{name:40s} max|dlogit| {float((out - ref).abs()[real].max()):8.4f}  mean KL {float(kl):.2e}  "
              f"argmax agree {float((out.argmax(-1) == ref.argmax(-1))[real].float().mean()):.3f}", flush=True)

    with torch.no_grad():
        t = time.time()
        ref = model(input_ids=ids, attention_mask=attn).logits.float()  # CPU float32
        print(f"cpu fp32 forward {time.time() - t:.1f}s", flush=True)
        ref_lp = ref.log_softmax(-1)
        gpu = model.to(dev)
        paths = {f"{device_type} fp32 default": (None, None)}
        for dtype in (torch.bfloat16,):
            paths[f"{device_type} bf16-autocast default"] = (dtype, None)
            for b in (SDPBackend.MATH, SDPBackend.EFFICIENT_ATTENTION, SDPBackend.FLASH_ATTENTION,
                      SDPBackend.CUDNN_ATTENTION):
                paths[f"{device_type} bf16-autocast {b.name}"] = (dtype, b)
        for name, (dtype, backend) in paths.items():
            try:
                kernels = sdpa_kernel([backend]) if backend is not None else contextlib.nullcontext()
                with torch.autocast(device_type, dtype=dtype or torch.bfloat16, enabled=dtype is not None), kernels:
                    out = gpu(input_ids=ids.to(dev), attention_mask=attn.to(dev)).logits.float().cpu()
            except Exception as e:
                refused(name, e)
                continue
            report(name, out)
        # the training forward (autograd on, as SFT and the actor run it): cuDNN and flash keep softmax
        # statistics for the backward there, a different kernel than the inference forward above
        gpu.train()
        for backend in (None, SDPBackend.MATH, SDPBackend.EFFICIENT_ATTENTION, SDPBackend.CUDNN_ATTENTION):
            name = f"train-mode bf16 {backend.name if backend is not None else 'default'}"
            kernels = sdpa_kernel([backend]) if backend is not None else contextlib.nullcontext()
            try:
                with torch.enable_grad(), torch.autocast(device_type, dtype=torch.bfloat16), kernels:
                    out = gpu(input_ids=ids.to(dev), attention_mask=attn.to(dev)).logits
                    out.float().logsumexp(-1).mean().backward()
            except Exception as e:
                refused(name, e)
                continue
            report(name, out.detach().float().cpu())
            gpu.zero_grad(set_to_none=True)
        gpu.eval()
        # decoding with a cache (the rollout's path): greedy tokens vs the CPU's
        prompt = ids[:1, :prompt_len]
        cpu_model = AutoModelForCausalLM.from_config(cfg, attn_implementation="sdpa").eval()
        cpu_model.load_state_dict({k: v.cpu() for k, v in gpu.state_dict().items()})
        want = cpu_model.generate(prompt, max_new_tokens=new, do_sample=False)[0, prompt_len:].tolist()
        for dtype in (torch.float32, torch.bfloat16):
            got = gpu.to(dtype).generate(prompt.to(dev), max_new_tokens=new, do_sample=False)[0, prompt_len:].tolist()
            same = sum(a == b for a, b in zip(got, want))
            print(f"generate {device_type} {str(dtype):15s} tokens equal to cpu: {same}/{new}", flush=True)


if __name__ == "__main__":
    main()
