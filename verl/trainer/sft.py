"""`python -m verl.trainer.sft <flags>`: the supervised warm start's flags, mapped onto trainer.mode=sft.

SFT is a mode of the one trainer (verl/trainer/main_ppo.py, configs/sft.yaml); this module only keeps
the flags that scripts call it with. The same run as a config:

    python -m verl.trainer.main_ppo --config-name sft "data.sft_files=[FILE]" model.path=SPEC \
        model.tokenizer=DIR trainer.output_dir=OUT trainer.hf_dir=OUT trainer.total_epochs=E ...

Flags (-> config key; a flag left out keeps configs/sft.yaml's value):
  --data FILE          data.sft_files: parquet or .jsonl with prompt + segments (response_text, if present, is checked)
  --model SPEC         model.path: a JSON file or inline JSON of a config (random init, vocab_size filled from
                       the tokenizer), or an HF model directory / hub id / GGUF file to fine-tune
  --tokenizer DIR      model.tokenizer (default: the --model directory)
  --prompt-template F  data.prompt_template: the template the data was built with, saved beside the model
  --out DIR            trainer.output_dir and trainer.hf_dir: the HF model + tokenizer, run_config.yaml,
                       metrics.jsonl, checkpoints/ and sft_summary.json (loadable as model.path)
  --epochs E           trainer.total_epochs (default 1)
  --max-steps N        trainer.total_steps: stop after N optimizer steps (the schedule is planned for min(N, epochs))
  --time-limit-s S     trainer.time_limit_s: stop early after S seconds of training (the model is saved)
  --lr, --min-lr-ratio actor.lr, actor.min_lr_ratio: cosine decay from lr to lr * min_lr_ratio after a linear warmup
  --warmup-ratio R     actor.warmup_ratio: warmup steps as a share of all steps
  --batch-size B       data.train_batch_size: sequences per step (sorted by length into buckets to limit padding)
  --max-length L       data.sft_max_length: longest allowed sequence in tokens; a longer row is an error naming it
  --context-loss-weight W  actor.sft_context_loss_weight: add W x the next-token loss on prompt and environment
                       tokens (default 0: policy tokens only). A model trained from scratch needs it (W=1) to
                       learn to copy names within a few hundred steps; RL never trains those tokens.
  --weight-decay, --grad-clip  actor.weight_decay, actor.grad_clip
  --seed               model.seed and data.seed (the init of a config-built model, the batches' order)
  --device             trainer.device (auto|cpu|cuda)
  --log-every          accepted for old scripts; every step is logged (metrics.jsonl, one console line)

The embedded default (a 2-layer model from scratch, 2,000 oracle trajectories, 2 CPU cores):
  --epochs 6 --lr 5e-3 --batch-size 16 --context-loss-weight 1.0   (750 steps, ~2.5 minutes)
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from omegaconf import DictConfig

from verl.trainer.sft_data import SFTDataError
from verl.workers.model_loader import parse_model_spec


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """The flags; a flag left out keeps configs/sft.yaml's value (the one home of the recipe's defaults)."""
    p = argparse.ArgumentParser(prog="python -m verl.trainer.sft", description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter, epilog=__doc__.split("\n\n", 1)[1])
    p.add_argument("--data", required=True, help="data.sft_files: parquet or .jsonl rows of prompt + segments")
    p.add_argument("--model", required=True, help="model.path: a JSON config (random init) or an HF dir, hub id, GGUF")
    p.add_argument("--tokenizer", default=None, help="model.tokenizer (default: the --model directory)")
    p.add_argument("--out", required=True, help="trainer.output_dir and trainer.hf_dir")
    p.add_argument("--prompt-template", default=None,
                   help="data.prompt_template: the template the data was built with, saved beside the model")
    p.add_argument("--epochs", type=int, default=None, help="trainer.total_epochs (default: configs/sft.yaml's)")
    p.add_argument("--max-steps", type=int, default=None, help="trainer.total_steps: stop after N optimizer steps")
    p.add_argument("--time-limit-s", type=float, default=None, help="trainer.time_limit_s: stop after S seconds")
    p.add_argument("--lr", type=float, default=None, help="actor.lr (default: configs/sft.yaml's)")
    p.add_argument("--min-lr-ratio", type=float, default=None, help="actor.min_lr_ratio: the cosine's floor")
    p.add_argument("--warmup-ratio", type=float, default=None, help="actor.warmup_ratio: warmup share of the steps")
    p.add_argument("--batch-size", type=int, default=None, help="data.train_batch_size: sequences per step")
    p.add_argument("--max-length", type=int, default=None, help="data.sft_max_length: longest sequence in tokens")
    p.add_argument("--weight-decay", type=float, default=None, help="actor.weight_decay")
    p.add_argument("--grad-clip", type=float, default=None, help="actor.grad_clip")
    p.add_argument("--seed", type=int, default=None, help="model.seed and data.seed (init and batch order)")
    p.add_argument("--device", default="auto", choices=["auto", "cpu", "cuda"], help="trainer.device")
    p.add_argument("--log-every", type=int, default=10, help="accepted for old scripts; every step is logged")
    p.add_argument("--context-loss-weight", type=float, default=None,
                   help="actor.sft_context_loss_weight: W x the loss on prompt and environment tokens")
    args = p.parse_args(argv)
    for name in ("epochs", "batch_size", "max_length", "log_every", "max_steps"):
        if getattr(args, name) is not None and getattr(args, name) < 1:
            p.error(f"--{name.replace('_', '-')} must be >= 1")
    return args


def to_config(args: argparse.Namespace) -> DictConfig:
    """configs/sft.yaml with the flags set (typed: a wrong value fails naming its key)."""
    from verl.trainer.main_ppo import load_config

    spec = parse_model_spec(args.model)
    tokenizer = args.tokenizer or (spec if isinstance(spec, str) else None)
    if tokenizer is None:
        raise ValueError("--tokenizer is required when --model is a config")
    cfg = load_config("sft")
    # Set on the typed config, not as hydra override strings: paths and inline JSON need no quoting.
    cfg.data.sft_files = [args.data]
    cfg.model.path = spec
    cfg.model.tokenizer = str(tokenizer)
    t = cfg.trainer
    t.total_steps, t.time_limit_s = args.max_steps, args.time_limit_s
    t.output_dir = t.hf_dir = args.out
    t.device = args.device
    t.resume = "none"  # as before: each call trains afresh into --out
    flags = {"prompt_template": (cfg.data, "prompt_template"), "max_length": (cfg.data, "sft_max_length"),
             "batch_size": (cfg.data, "train_batch_size"), "epochs": (t, "total_epochs"), "lr": (cfg.actor, "lr"),
             "min_lr_ratio": (cfg.actor, "min_lr_ratio"), "warmup_ratio": (cfg.actor, "warmup_ratio"),
             "weight_decay": (cfg.actor, "weight_decay"), "grad_clip": (cfg.actor, "grad_clip"),
             "context_loss_weight": (cfg.actor, "sft_context_loss_weight")}
    for flag, (section, key) in flags.items():  # a flag left out keeps configs/sft.yaml's value
        if getattr(args, flag) is not None:
            section[key] = getattr(args, flag)
    if args.seed is not None:
        cfg.data.seed = cfg.model.seed = args.seed
    return cfg


def main(argv: list[str] | None = None) -> int:
    from verl.trainer.main_ppo import run
    from verl.trainer.ppo_trainer import TrainingDivergedError
    from verl.trainer.preflight import PreflightError

    args = parse_args(argv)
    try:
        run(to_config(args))
    except (SFTDataError, TrainingDivergedError, PreflightError, ValueError, OSError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    s = json.loads((Path(args.out) / "sft_summary.json").read_text())
    print(f"sft: {s['steps']} steps, loss {s['first_loss']:.3f} -> {s['final_loss']:.3f}, "
          f"{s['tokens_per_s']:.0f} tokens/s, {s['train_s']:.1f}s ({s['stopped']}); saved {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
