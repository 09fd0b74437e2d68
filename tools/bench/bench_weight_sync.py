"""The actor -> rollout weight sync, side by side: through a CPU copy of every weight (the path before
rollout_weights) against the engine reading the actor's own tensors one at a time (the path now).

    python -m tools.bench.bench_weight_sync --shape qwen2.5-3b     # GPU: fp32 actor, bf16 engine, one device
    python -m tools.bench.bench_weight_sync --tiny                 # CPU smoke

Random-init Qwen2.5 shape (tools/bench/bench_rollout.build); the engine is an HFRollout (StaticRollout's
update_weights is the same). Both paths must leave the engine with the same weights (checked).
"""
from __future__ import annotations

import argparse
import json

import torch

from tools.bench.bench_rollout import SHAPES, _Tok, build, timed
from verl.workers.rollout.hf_rollout import HFRollout


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--shape", default="qwen2.5-3b", choices=list(SHAPES), help="model shape to sync")
    p.add_argument("--tiny", action="store_true", help="CPU smoke run")
    p.add_argument("--repeats", type=int, default=3, help="timed syncs per path (the best is reported)")
    p.add_argument("--out", default=None, help="write the results as JSON here")
    args = p.parse_args()
    device = "cuda" if torch.cuda.is_available() and not args.tiny else "cpu"
    shape = "tiny" if args.tiny else args.shape
    actor = build(shape, device, torch.float32)                # the trainer's fp32 master weights
    engine = HFRollout(build(shape, device, torch.bfloat16 if device == "cuda" else torch.float32), _Tok(),
                       device=device, eos_token_ids=[])
    with torch.no_grad():
        for q in actor.parameters():
            q.add_(1.0)  # so a sync that did nothing would show

    def via_cpu():
        engine.update_weights({k: v.detach().to("cpu", copy=True) for k, v in actor.state_dict().items()})

    def direct():
        engine.update_weights(actor.state_dict())

    results = {}
    for name, fn in (("via_cpu", via_cpu), ("direct", direct)):
        fn()  # warm: allocator, pinned pages
        results[name] = min(timed(fn, device) for _ in range(args.repeats))
        for n, q in engine.model.named_parameters():
            torch.testing.assert_close(q.float(), dict(actor.named_parameters())[n].detach().to(q.dtype).float())
    gb = sum(t.numel() * t.element_size() for t in actor.state_dict().values()) / 1e9
    print(f"{shape}, {device}: {gb:.1f} GB of actor weights -> engine: via CPU {results['via_cpu']:.3f} s, "
          f"direct {results['direct']:.3f} s ({results['via_cpu'] / results['direct']:.1f}x)", flush=True)
    if args.out:
        with open(args.out, "w") as f:
            json.dump({"shape": shape, "device": torch.cuda.get_device_name() if device == "cuda" else "cpu",
                       "actor_gb": gb, **{f"{k}_s": v for k, v in results.items()}}, f, indent=1)


if __name__ == "__main__":
    main()
