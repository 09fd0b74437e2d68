"""Supervised fine-tuning on multi-turn trajectories: the warm start before RL.

    python -m verl.trainer.sft --data oracle.parquet --model model.json --tokenizer TOKDIR --out OUT

A row (parquet or JSONL) holds `prompt` (chat messages) and `segments` ([{text,
by_policy}]). It is tokenized as the RL rollout builds a trajectory: the chat-templated
prompt, then every segment tokenized on its own and the ids concatenated (the rollout
tokenizes each generated turn and each observation separately). The loss is the
token-mean cross-entropy over policy tokens only; environment text is context.

Flags:
  --data FILE          parquet or .jsonl with prompt + segments (response_text, if present, is checked)
  --model SPEC         JSON file or inline JSON of a config (random init, vocab_size filled from the
                       tokenizer), or an HF model directory / hub id to fine-tune
  --tokenizer DIR      HF tokenizer directory (default: the --model directory)
  --out DIR            where the HF model + tokenizer and metrics.jsonl go
  --epochs E           passes over the data (default 1)
  --max-steps N        stop after N optimizer steps (the schedule is planned for min(N, epochs))
  --time-limit-s S     stop early after S seconds of training (a safety net; the model is saved)
  --lr, --min-lr-ratio cosine decay from lr to lr * min_lr_ratio after a linear warmup
  --warmup-ratio R     warmup steps as a share of all steps
  --batch-size B       sequences per step (sorted by length into buckets to limit padding)
  --max-length L       longest allowed sequence in tokens; a longer row is an error naming it
  --weight-decay, --grad-clip, --seed, --device (auto|cpu|cuda), --log-every
"""
from __future__ import annotations

import argparse
import json
import math
import os
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F


class SFTDataError(ValueError):
    """A data row that cannot be used; the message names the file, the row and the field."""


@dataclass
class SFTConfig:
    data: str
    model: str
    out: str
    tokenizer: str | None = None
    epochs: int = 1
    max_steps: int | None = None
    time_limit_s: float | None = None
    lr: float = 1e-3
    min_lr_ratio: float = 0.1
    warmup_ratio: float = 0.05
    batch_size: int = 16
    max_length: int = 1024
    weight_decay: float = 0.01
    grad_clip: float = 1.0
    seed: int = 0
    device: str = "auto"
    log_every: int = 10


@dataclass
class Example:
    ids: list[int]
    mask: list[int]  # 1 on tokens the policy wrote (the loss tokens), 0 on prompt and environment text


# ---------------------------------------------------------------------------- data

def _plain(v):
    """Parquet gives numpy arrays for list columns; make them lists again."""
    if isinstance(v, np.ndarray):
        return [_plain(x) for x in v.tolist()]
    if isinstance(v, dict):
        return {k: _plain(x) for k, x in v.items()}
    if isinstance(v, list):
        return [_plain(x) for x in v]
    return v


def load_rows(path: str | os.PathLike) -> list[dict]:
    """Rows of a parquet or JSONL file, as plain Python objects."""
    path = Path(path)
    if not path.is_file():
        raise SFTDataError(f"{path}: data file not found")
    if path.suffix == ".jsonl":
        rows = []
        for i, line in enumerate(path.read_text().splitlines()):
            if line.strip():
                try:
                    rows.append(json.loads(line))
                except json.JSONDecodeError as e:
                    raise SFTDataError(f"{path}: line {i + 1} is not JSON ({e})") from e
        return rows
    import pandas as pd

    try:
        frame = pd.read_parquet(path)
    except Exception as e:  # pyarrow raises several types for a bad file
        raise SFTDataError(f"{path}: cannot read as parquet ({e})") from e
    return [{k: _plain(v) for k, v in r.items()} for r in frame.to_dict("records")]


def check_row(row: dict, where: str) -> None:
    """Raise naming `where` and the field if the row is not prompt + segments."""
    prompt = row.get("prompt")
    if not isinstance(prompt, list) or not prompt or not all(
            isinstance(m, dict) and isinstance(m.get("role"), str) and isinstance(m.get("content"), str)
            for m in prompt):
        raise SFTDataError(f"{where}: field 'prompt' must be a non-empty list of {{role, content}} messages")
    segs = row.get("segments")
    if not isinstance(segs, list) or not segs or not all(
            isinstance(s, dict) and isinstance(s.get("text"), str) and isinstance(s.get("by_policy"), bool)
            for s in segs):
        raise SFTDataError(f"{where}: field 'segments' must be a non-empty list of {{text: str, by_policy: bool}}")
    if not any(s["by_policy"] and s["text"] for s in segs):
        raise SFTDataError(f"{where}: field 'segments' has no policy text to learn from")
    text = row.get("response_text")
    if text is not None and text != "".join(s["text"] for s in segs):
        raise SFTDataError(f"{where}: field 'response_text' is not the concatenation of 'segments'")


def prompt_ids(tokenizer, messages: list[dict]) -> list[int]:
    """The prompt exactly as the RL data set tokenizes it (chat template, then no extra specials)."""
    text = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
    return tokenizer(text, add_special_tokens=False)["input_ids"]


def tokenize_example(tokenizer, messages: list[dict], segments: list[dict]) -> Example:
    """Prompt ids (mask 0) + each segment tokenized alone (mask 1 for policy segments)."""
    ids = prompt_ids(tokenizer, messages)
    mask = [0] * len(ids)
    for seg in segments:
        seg_ids = tokenizer(seg["text"], add_special_tokens=False)["input_ids"]
        ids += seg_ids
        mask += [int(seg["by_policy"])] * len(seg_ids)
    return Example(ids, mask)


def tokenize_rows(tokenizer, rows: list[dict], max_length: int, source: str = "data") -> list[Example]:
    out = []
    for i, row in enumerate(rows):
        where = f"{source}: row {i}"
        check_row(row, where)
        ex = tokenize_example(tokenizer, row["prompt"], row["segments"])
        if len(ex.ids) > max_length:
            raise SFTDataError(f"{where}: {len(ex.ids)} tokens > --max-length {max_length}")
        out.append(ex)
    return out


def length_batches(lengths: list[int], batch_size: int, seed: int, epoch: int) -> list[list[int]]:
    """Buckets of similar length (sorted, then cut into batches), in a seeded random order per epoch."""
    rng = np.random.default_rng([seed, epoch])
    order = sorted(range(len(lengths)), key=lambda i: (lengths[i], rng.random()))
    batches = [order[i:i + batch_size] for i in range(0, len(order), batch_size)]
    return [batches[k] for k in rng.permutation(len(batches))]


def collate(examples: list[Example], pad_id: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Right-padded (input_ids, attention_mask, loss_mask), each (batch, max_len)."""
    width = max(len(e.ids) for e in examples)
    ids = torch.full((len(examples), width), pad_id, dtype=torch.long)  # (batch, seq)
    attn = torch.zeros((len(examples), width), dtype=torch.long)         # (batch, seq)
    loss_mask = torch.zeros((len(examples), width), dtype=torch.float)   # (batch, seq)
    for r, e in enumerate(examples):
        ids[r, :len(e.ids)] = torch.tensor(e.ids)
        attn[r, :len(e.ids)] = 1
        loss_mask[r, :len(e.ids)] = torch.tensor(e.mask, dtype=torch.float)
    return ids, attn, loss_mask


def masked_lm_loss(logits: torch.Tensor, ids: torch.Tensor, loss_mask: torch.Tensor) -> torch.Tensor:
    """Token-mean cross-entropy of predicting ids[:, t] from position t-1, over loss_mask == 1."""
    logp_target = -F.cross_entropy(logits[:, :-1].float().transpose(1, 2), ids[:, 1:], reduction="none")  # (batch, seq-1)
    mask = loss_mask[:, 1:]  # (batch, seq-1)
    return -(logp_target * mask).sum() / mask.sum().clamp(min=1.0)


# ---------------------------------------------------------------------------- model

def parse_model_spec(spec: str):
    """A dict from a JSON file or inline JSON; anything else is an HF directory / hub id."""
    if spec.lstrip().startswith("{"):
        try:
            return json.loads(spec)
        except json.JSONDecodeError as e:
            raise ValueError(f"--model: inline JSON does not parse ({e})") from e
    if spec.endswith(".json") and Path(spec).is_file():
        try:
            return json.loads(Path(spec).read_text())
        except json.JSONDecodeError as e:
            raise ValueError(f"--model {spec}: not valid JSON ({e})") from e
    return spec


def fill_spec(spec, tokenizer):
    """A config dict gets the tokenizer's vocabulary size and special ids where it has none."""
    if not isinstance(spec, dict):
        return spec
    spec = dict(spec)
    if spec.get("vocab_size") is None:
        spec["vocab_size"] = len(tokenizer)
    elif spec["vocab_size"] < len(tokenizer):
        raise ValueError(f"--model: vocab_size {spec['vocab_size']} < the tokenizer's {len(tokenizer)} tokens")
    for key in ("pad_token_id", "bos_token_id", "eos_token_id"):
        if spec.get(key) is None:
            spec[key] = getattr(tokenizer, key)
    return spec


def lr_at(step: int, total: int, warmup: int, lr: float, min_ratio: float) -> float:
    """Linear warmup to lr, then cosine down to lr * min_ratio at the last step."""
    if step < warmup:
        return lr * (step + 1) / warmup
    progress = (step - warmup) / max(1, total - warmup - 1)
    return lr * (min_ratio + (1 - min_ratio) * 0.5 * (1 + math.cos(math.pi * min(1.0, progress))))


# ---------------------------------------------------------------------------- training

def train(cfg: SFTConfig) -> dict:
    """Run SFT and save the model + tokenizer under cfg.out; returns a summary."""
    from tqdm import tqdm
    from transformers import AutoTokenizer

    from verl.workers.model_loader import load_model

    device = torch.device("cuda" if cfg.device == "auto" and torch.cuda.is_available() else
                          ("cpu" if cfg.device == "auto" else cfg.device))
    spec = parse_model_spec(cfg.model)
    tok_src = cfg.tokenizer or (spec if isinstance(spec, str) else None)
    if tok_src is None:
        raise ValueError("--tokenizer is required when --model is a config")
    tokenizer = AutoTokenizer.from_pretrained(tok_src)
    if tokenizer.pad_token_id is None:
        tokenizer.pad_token = tokenizer.eos_token
    examples = tokenize_rows(tokenizer, load_rows(cfg.data), cfg.max_length, str(cfg.data))
    model = load_model(fill_spec(spec, tokenizer), dtype=torch.float32, role="actor", seed=cfg.seed).to(device)
    model.train()
    n_params = sum(p.numel() for p in model.parameters())

    decay = [p for p in model.parameters() if p.ndim >= 2]
    no_decay = [p for p in model.parameters() if p.ndim < 2]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": cfg.weight_decay},
                             {"params": no_decay, "weight_decay": 0.0}], lr=cfg.lr, betas=(0.9, 0.95))
    per_epoch = math.ceil(len(examples) / cfg.batch_size)
    total = per_epoch * cfg.epochs if cfg.max_steps is None else min(cfg.max_steps, per_epoch * cfg.epochs)
    warmup = int(cfg.warmup_ratio * total)
    lengths = [len(e.ids) for e in examples]
    amp = torch.autocast("cuda", dtype=torch.bfloat16) if device.type == "cuda" else torch.autocast("cpu", enabled=False)

    out = Path(cfg.out)
    out.mkdir(parents=True, exist_ok=True)
    metrics_path = out / "metrics.jsonl"
    metrics_path.unlink(missing_ok=True)
    step, tokens, t0, stopped = 0, 0, time.perf_counter(), "done"
    first_loss, last_losses = None, []
    bar = tqdm(total=total, desc="sft", unit="step", file=sys.stdout, disable=None)
    for epoch in range(cfg.epochs):
        for batch_idx in length_batches(lengths, cfg.batch_size, cfg.seed, epoch):
            if step >= total:
                break
            ids, attn, loss_mask = (t.to(device) for t in collate([examples[i] for i in batch_idx],
                                                                   tokenizer.pad_token_id))
            lr = lr_at(step, total, warmup, cfg.lr, cfg.min_lr_ratio)
            for group in opt.param_groups:
                group["lr"] = lr
            with amp:
                logits = model(input_ids=ids, attention_mask=attn, use_cache=False).logits  # (batch, seq, vocab)
            loss = masked_lm_loss(logits, ids, loss_mask)
            opt.zero_grad(set_to_none=True)
            loss.backward()
            grad_norm = torch.nn.utils.clip_grad_norm_(model.parameters(), cfg.grad_clip)
            opt.step()
            step += 1
            tokens += int(attn.sum())
            value = loss.item()
            first_loss = value if first_loss is None else first_loss
            last_losses = (last_losses + [value])[-cfg.log_every:]
            elapsed = time.perf_counter() - t0
            bar.update(1)
            bar.set_postfix(loss=f"{value:.3f}", tok_s=f"{tokens / elapsed:.0f}")
            if step % cfg.log_every == 0 or step == total:
                with open(metrics_path, "a") as f:
                    f.write(json.dumps({"step": step, "epoch": epoch, "loss": value, "lr": lr,
                                        "grad_norm": float(grad_norm), "tokens": tokens,
                                        "tokens_per_s": tokens / elapsed, "elapsed_s": elapsed}) + "\n")
            if cfg.time_limit_s is not None and elapsed > cfg.time_limit_s:
                stopped = f"time limit {cfg.time_limit_s:g}s"
                break
        if step >= total or stopped != "done":
            break
    bar.close()
    elapsed = time.perf_counter() - t0

    model.eval()
    model.save_pretrained(out)
    tokenizer.save_pretrained(out)
    summary = {"steps": step, "planned_steps": total, "examples": len(examples), "params": n_params,
               "first_loss": first_loss, "final_loss": sum(last_losses) / max(1, len(last_losses)),
               "tokens": tokens, "tokens_per_s": tokens / max(elapsed, 1e-9), "train_s": elapsed,
               "stopped": stopped, "device": str(device), "config": asdict(cfg)}
    (out / "sft_summary.json").write_text(json.dumps(summary, indent=2) + "\n")
    return summary


def parse_args(argv: list[str] | None = None) -> SFTConfig:
    p = argparse.ArgumentParser(prog="python -m verl.trainer.sft", description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter, epilog=__doc__.split("\n\n", 2)[2])
    p.add_argument("--data", required=True)
    p.add_argument("--model", required=True)
    p.add_argument("--tokenizer", default=None)
    p.add_argument("--out", required=True)
    p.add_argument("--epochs", type=int, default=1)
    p.add_argument("--max-steps", type=int, default=None)
    p.add_argument("--time-limit-s", type=float, default=None)
    p.add_argument("--lr", type=float, default=1e-3)
    p.add_argument("--min-lr-ratio", type=float, default=0.1)
    p.add_argument("--warmup-ratio", type=float, default=0.05)
    p.add_argument("--batch-size", type=int, default=16)
    p.add_argument("--max-length", type=int, default=1024)
    p.add_argument("--weight-decay", type=float, default=0.01)
    p.add_argument("--grad-clip", type=float, default=1.0)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--device", default="auto")
    p.add_argument("--log-every", type=int, default=10)
    cfg = SFTConfig(**vars(p.parse_args(argv)))
    for name in ("epochs", "batch_size", "max_length", "log_every"):
        if getattr(cfg, name) < 1:
            p.error(f"--{name.replace('_', '-')} must be >= 1")
    if cfg.max_steps is not None and cfg.max_steps < 1:
        p.error("--max-steps must be >= 1")
    return cfg


def main(argv: list[str] | None = None) -> int:
    cfg = parse_args(argv)
    try:
        s = train(cfg)
    except (SFTDataError, ValueError, OSError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    print(f"sft: {s['steps']} steps, loss {s['first_loss']:.3f} -> {s['final_loss']:.3f}, "
          f"{s['tokens_per_s']:.0f} tokens/s, {s['train_s']:.1f}s ({s['stopped']}); saved {cfg.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
