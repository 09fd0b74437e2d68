"""SFT data: rows of prompt + segments, checked and tokenized as the RL rollout builds a trajectory,
then cut into length-bucketed batches (the data side of `trainer.mode=sft`).

A row (parquet or JSONL) holds `prompt` (chat messages) and `segments` ([{text, by_policy}]). It is
tokenized as the rollout builds a trajectory: the chat-templated prompt, then every segment
tokenized on its own and the ids concatenated (the rollout tokenizes each generated turn and each
observation separately). `mask` marks the loss tokens: those the policy wrote, less any policy segment
with `loss: false` (a slip kept as context so that the recovery after it can be learnt, not the slip).
"""
from __future__ import annotations

import json
import math
import os
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from verl.algos.losses import masked_lm_loss
from verl.trainer.dataset import to_python


class SFTDataError(ValueError):
    """A data row that cannot be used; the message names the file, the row and the field."""


@dataclass
class Example:
    ids: list[int]
    mask: list[int]  # 1 on tokens the policy wrote (the loss tokens), 0 on prompt and environment text


# ---------------------------------------------------------------------------- data

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
    return [{k: to_python(v) for k, v in r.items()} for r in frame.to_dict("records")]


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
    for k, s in enumerate(segs):
        if s.get("loss") is not None and (not isinstance(s["loss"], bool) or (s["loss"] and not s["by_policy"])):
            raise SFTDataError(f"{where}: field 'segments[{k}].loss' must be a bool, true only on policy text; "
                               f"got {s['loss']!r} (by_policy {s['by_policy']})")
    if not any(learnt(s) and s["text"] for s in segs):
        raise SFTDataError(f"{where}: field 'segments' has no policy text to learn from")
    text = row.get("response_text")
    if text is not None and text != "".join(s["text"] for s in segs):
        raise SFTDataError(f"{where}: field 'response_text' is not the concatenation of 'segments'")


def learnt(segment: dict) -> bool:
    """Whether a segment's tokens are loss tokens: policy text, unless marked `loss: false`."""
    return segment["by_policy"] if segment.get("loss") is None else bool(segment["loss"])


def prompt_ids(tokenizer, messages: list[dict]) -> list[int]:
    """The prompt exactly as the RL data set tokenizes it (chat template, then no extra specials)."""
    text = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
    return tokenizer(text, add_special_tokens=False)["input_ids"]


def tokenize_example(tokenizer, messages: list[dict], segments: list[dict]) -> Example:
    """Prompt ids (mask 0) + each segment tokenized alone (mask 1 for the learnt segments: `learnt`)."""
    ids = prompt_ids(tokenizer, messages)
    mask = [0] * len(ids)
    for seg in segments:
        seg_ids = tokenizer(seg["text"], add_special_tokens=False)["input_ids"]
        ids += seg_ids
        mask += [int(learnt(seg))] * len(seg_ids)
    return Example(ids, mask)


def tokenize_rows(tokenizer, rows: list[dict], max_length: int, source: str = "data") -> list[Example]:
    out = []
    for i, row in enumerate(rows):
        where = f"{source}: row {i}"
        check_row(row, where)
        ex = tokenize_example(tokenizer, row["prompt"], row["segments"])
        if len(ex.ids) > max_length:
            raise SFTDataError(f"{where}: {len(ex.ids)} tokens > data.sft_max_length {max_length}")
        out.append(ex)
    return out


def length_batches(lengths: list[int], batch_size: int, seed: int, epoch: int,
                   shuffle: bool = True) -> list[list[int]]:
    """Buckets of similar length (sorted, then cut into batches), in a seeded random order per epoch;
    shuffle=False: in length order, the same every epoch."""
    if not shuffle:
        order = sorted(range(len(lengths)), key=lambda i: lengths[i])
        return [order[i:i + batch_size] for i in range(0, len(order), batch_size)]
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


@dataclass
class SFTSet:
    """The tokenized rows of data.sft_files and their batch plan: step s (0-based) trains batch
    s % batches_per_epoch of epoch s // batches_per_epoch (length buckets, seeded order per epoch)."""

    examples: list[Example]
    batch_size: int
    seed: int
    shuffle: bool = True

    @classmethod
    def load(cls, files: list[str], tokenizer, max_length: int, batch_size: int, seed: int,
             shuffle: bool = True) -> "SFTSet":
        if not files:
            raise SFTDataError("trainer.mode=sft needs data.sft_files (parquet or JSONL rows of prompt + segments)")
        examples = [ex for f in files for ex in tokenize_rows(tokenizer, load_rows(f), max_length, str(f))]
        if not examples:
            raise SFTDataError(f"{', '.join(map(str, files))}: no rows")
        return cls(examples, batch_size, seed, shuffle)

    @property
    def batches_per_epoch(self) -> int:
        return math.ceil(len(self.examples) / self.batch_size)

    def batch_at(self, step: int) -> tuple[int, list[Example]]:
        """(epoch, examples) of 0-based training step `step`."""
        epoch, k = divmod(step, self.batches_per_epoch)
        lengths = [len(e.ids) for e in self.examples]
        idx = length_batches(lengths, self.batch_size, self.seed, epoch, self.shuffle)[k]
        return epoch, [self.examples[i] for i in idx]


@torch.no_grad()
def evaluate_loss(model, examples: list[Example], pad_id: int, batch_size: int = 16) -> float:
    """Token-mean policy-token loss of `model` over `examples` (no update)."""
    was_training = model.training
    model.eval()
    device = next(model.parameters()).device
    total, count = 0.0, 0.0
    for start in range(0, len(examples), batch_size):
        ids, attn, loss_mask = (t.to(device) for t in collate(examples[start:start + batch_size], pad_id))
        logits = model(input_ids=ids, attention_mask=attn, use_cache=False).logits  # (batch, seq, vocab)
        n = float(loss_mask[:, 1:].sum())
        total += float(masked_lm_loss(logits, ids, loss_mask)) * n
        count += n
    model.train(was_training)
    return total / max(count, 1.0)
