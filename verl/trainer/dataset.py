"""Prompt data set from parquet files, and a step-indexed batch order.

A row needs a `prompt` column of chat messages (list of {role, content}); every other
column travels with the row as a non-tensor field (data_source, reward_model, ...). A
`data_source`, where the file has one, must be printable text: it names validation metrics.
The environment may pass `row_check` (fields -> problem or None; RouterEnv.check_row):
every row is checked when the file is loaded, and bad rows are named by file and row.
The batch for training step s is a pure function of (seed, s), so a resumed run sees
exactly the data order of an uninterrupted one.
"""
from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import numpy as np


class DataError(ValueError):
    """A data file or row that cannot be used; the message names the file and the row."""


def to_python(v):
    """Parquet gives numpy arrays for list columns; turn them back into lists/dicts."""
    if isinstance(v, np.ndarray):
        return [to_python(x) for x in v.tolist()]
    if isinstance(v, dict):
        return {k: to_python(x) for k, x in v.items()}
    if isinstance(v, list):
        return [to_python(x) for x in v]
    return v


@dataclass
class PromptRow:
    prompt_ids: list[int]
    uid: str
    fields: dict


RowCheck = Callable[[dict], "str | None"]  # a row's fields -> why it cannot be used, or None
MAX_LISTED = 5  # bad rows quoted in one error


def message_problem(messages) -> str | None:
    """Why `messages` is not a non-empty list of {role: str, content: str}, or None."""
    if not isinstance(messages, list) or not messages:
        return "must be a non-empty list of chat messages"
    for k, m in enumerate(messages):
        if not isinstance(m, dict):
            return f"message {k} is a {type(m).__name__}, not a {{role, content}} mapping"
        for key in ("role", "content"):
            if not isinstance(m.get(key), str):  # parquet fills a key absent from one row with None
                return f"message {k} has no string {key!r} (got {m.get(key)!r})"
        if not m["role"]:
            return f"message {k} has an empty 'role'"
    return None


def data_source_problem(value) -> str | None:
    """Why a row's `data_source` cannot name its metrics (val/<data_source>/reward), or None."""
    if not isinstance(value, str):
        return f"'data_source' is a {type(value).__name__} ({value!r:.60}), not a string"
    if not value.strip():
        return "'data_source' is empty"
    if not value.isprintable():  # control characters, and lone surrogates from a bad decode
        return f"'data_source' {value!r:.60} holds unprintable characters"
    return None


class PromptDataset:
    """Tokenised prompts; `truncation` is "error" (default), "left" or "skip" for long ones."""

    def __init__(self, files: str | list[str], tokenizer, prompt_key: str = "prompt",
                 max_prompt_length: int = 4096, truncation: str = "error", limit: int | None = None,
                 row_check: RowCheck | None = None):
        import pandas as pd

        files = [files] if isinstance(files, (str, os.PathLike)) else list(files)
        if truncation not in ("error", "left", "skip"):
            raise ValueError(f"truncation must be error|left|skip, got {truncation!r}")
        self.rows: list[PromptRow] = []
        self.skipped = 0
        bad: list[str] = []  # "FILE: row I: problem", every bad row of every file
        for file in files:
            if limit is not None and len(self.rows) >= limit:
                break
            path = Path(file)
            if not path.is_file():
                raise DataError(f"{path}: data file not found")
            try:
                frame = pd.read_parquet(path)
            except Exception as e:  # pyarrow raises several types for a bad file
                raise DataError(f"{path}: cannot read as parquet ({e})") from e
            if prompt_key not in frame.columns:
                raise DataError(f"{path}: no column {prompt_key!r} (columns: {list(frame.columns)})")
            for i, record in enumerate(frame.to_dict("records")):
                record = {k: to_python(v) for k, v in record.items()}
                messages = record.pop(prompt_key)
                problem = message_problem(messages)
                if problem:
                    problem = f"{prompt_key!r} {problem}"
                elif "data_source" in record:
                    problem = data_source_problem(record["data_source"])
                problem = problem or (row_check and row_check(record))
                if problem:
                    bad.append(f"{path}: row {i}: {problem}")
                    continue
                if bad:  # keep checking the rest, but stop tokenising: the load fails anyway
                    continue
                text = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
                ids = tokenizer(text, add_special_tokens=False)["input_ids"]
                if len(ids) > max_prompt_length:
                    if truncation == "error":
                        raise DataError(f"{path}: row {i}: prompt has {len(ids)} tokens > "
                                        f"max_prompt_length={max_prompt_length} (set data.truncation=left|skip)")
                    if truncation == "skip":
                        self.skipped += 1
                        continue
                    ids = ids[-max_prompt_length:]
                info = record.get("extra_info") or {}
                uid = str(info.get("uid") or info.get("id") or f"{path.name}:{i}")
                self.rows.append(PromptRow(ids, uid, record))
                if limit is not None and len(self.rows) >= limit:
                    break
        if bad:
            more = f"\n  ... and {len(bad) - MAX_LISTED} more" if len(bad) > MAX_LISTED else ""
            raise DataError(f"{len(bad)} bad row(s):\n  " + "\n  ".join(bad[:MAX_LISTED]) + more)
        if not self.rows:
            raise DataError(f"{', '.join(map(str, files))}: no usable rows")
        uids = [r.uid for r in self.rows]
        if len(set(uids)) != len(uids):
            # GRPO groups by uid; the reference's per-source index collided across sources.
            dup = next(u for u in uids if uids.count(u) > 1)
            raise DataError(f"{', '.join(map(str, files))}: extra_info uid {dup!r} is not unique")

    def __len__(self) -> int:
        return len(self.rows)


def train_batch_indices(n_rows: int, batch_size: int, step: int, seed: int, shuffle: bool = True) -> list[int]:
    """Row indices of training step `step` (1-based); full batches only, reshuffled per epoch."""
    if batch_size > n_rows:
        raise ValueError(f"train batch size {batch_size} exceeds the {n_rows} training rows")
    per_epoch = n_rows // batch_size
    epoch, k = divmod(step - 1, per_epoch)
    order = np.random.default_rng([seed, epoch]).permutation(n_rows) if shuffle else np.arange(n_rows)
    return order[k * batch_size:(k + 1) * batch_size].tolist()


def eval_batches(n_rows: int, batch_size: int) -> list[list[int]]:
    """All rows in order, the last batch possibly short (the reference dropped it)."""
    return [list(range(i, min(i + batch_size, n_rows))) for i in range(0, n_rows, batch_size)]
