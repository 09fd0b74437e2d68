"""Read QA rows from jsonl / parquet files or the hub as plain Python objects, each row named.

No column type is inferred across rows (datasets' json builder does, and one row with
numeric golds turned every row's golds into numbers), and a line that is not UTF-8 or
not JSON is one bad row named by file and line, not a crash of the whole file.

The gold answers may come in any of the common layouts, found per file in this order:
  golden_answers  list of strings (FlashRAG)
  answers         list of strings, a string, or SQuAD's {"text": [...]}
  answer          a string or a list of strings (R1-Searcher, HotpotQA, 2Wiki, ...)
"""
from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from data_process.schema import DataBuildError

GOLD_KEYS = ("golden_answers", "answers", "answer")
QUESTION_KEY = "question"


@dataclass
class RawRow:
    """One input row: its place (for messages), and its record or why it could not be read."""

    where: str  # "PATH line 3" (jsonl, 1-based) or "PATH row 2" (parquet / hub, 0-based)
    record: dict | None
    problem: str | None = None  # set when record is None


def raw_jsonl_rows(path: Path) -> Iterator[RawRow]:
    """Every non-blank line of a jsonl file; bad bytes or JSON make a RawRow with a problem."""
    with open(path, "rb") as f:
        for n, raw in enumerate(f, start=1):
            where = f"{path} line {n}"
            if n == 1 and raw.startswith(b"\xef\xbb\xbf"):  # a UTF-8 byte-order mark
                raw = raw[3:]
            try:
                text = raw.decode("utf-8")
            except UnicodeDecodeError as e:
                yield RawRow(where, None, f"not UTF-8 (byte 0x{raw[e.start]:02x} at column {e.start + 1})")
                continue
            if not text.strip():
                continue
            try:
                record = json.loads(text)
            except json.JSONDecodeError as e:
                yield RawRow(where, None, f"not JSON ({e.msg} at column {e.colno})")
                continue
            except RecursionError:
                yield RawRow(where, None, "JSON nested too deeply (past the parser's recursion limit)")
                continue
            except ValueError as e:  # an integer of more digits than int() converts (4,300 by default)
                yield RawRow(where, None, f"number too long ({str(e).split(';')[0]})")
                continue
            if not isinstance(record, dict):
                yield RawRow(where, None, f"not a JSON object (a {type(record).__name__})")
                continue
            yield RawRow(where, record)


def read_parquet(path: Path) -> Iterator[RawRow]:
    """Every row of a parquet file as plain Python objects (the file's own schema, nothing inferred)."""
    import pyarrow.parquet as pq

    try:
        table = pq.read_table(path)
    except Exception as e:  # pyarrow raises several types for a file that is not parquet
        raise DataBuildError(f"{path}: cannot read as parquet ({type(e).__name__}: {e})") from e
    for i, record in enumerate(table.to_pylist()):
        yield RawRow(f"{path} row {i}", record)


def read_file(path: Path) -> list[RawRow]:
    if path.suffix == ".parquet":
        return list(read_parquet(path))
    return list(raw_jsonl_rows(path))


def gold_key(rows: list[RawRow]) -> str | None:
    """The first of GOLD_KEYS that any readable row of the file carries."""
    present = set()
    for r in rows:
        if r.record is not None:
            present.update(k for k in GOLD_KEYS if k in r.record)
    return next((k for k in GOLD_KEYS if k in present), None)


def gold_list(value, key: str) -> tuple[list | None, str]:
    """The row's golds as a list (items unchecked) and the shape they came in; None if unusable."""
    if isinstance(value, str):
        return [value], "a string, read as one gold"
    if isinstance(value, list):
        return value, "a list"
    if isinstance(value, dict) and isinstance(value.get("text"), list):
        return value["text"], "SQuAD's {text: [...]}"
    return None, f"{key} is a {type(value).__name__}, not a string or a list"


def columns_of(rows: list[RawRow]) -> list[str]:
    cols: dict[str, None] = {}
    for r in rows:
        if r.record is not None:
            cols.update(dict.fromkeys(r.record))
    return list(cols)
