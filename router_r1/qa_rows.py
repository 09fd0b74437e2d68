"""A QA row's question, gold answers and the user's own id, in the layouts users bring, and checks over a file.

Besides our router rows, veRL's RL layout is read as it is, as Search-R1 (scripts/data_process/nq_search.py) and
veRL's recipes (examples/data_preprocess: gsm8k, the Search-R1 one) write it:

    data_source   str
    prompt        [{role, content}, ...]     their own prompt (a system message, then the user's)
    reward_model  {style, ground_truth}      ground_truth: a string, a list, or {target: a string or a list}
    extra_info    {split, index, question, answer, ...}   (Search-R1 keeps FlashRAG's `id`, `question` columns)

The question is extra_info.question, else a `question` column, else the last user message of the prompt; the
golds are reward_model.ground_truth. build_qa (data_process) and evaluation read rows through here.
"""
from __future__ import annotations

from collections import defaultdict

# A QA question is a few hundred characters; one 50 MB row once took 9.9 GB in evaluation. The router server
# bounds a request's question by the same number (--max-question-chars).
MAX_QUESTION_CHARS = 20_000
# The row's own id, first found: the file's columns, then extra_info (ours keeps the input file's as source_id).
ID_KEYS = ("id", "uid", "idx")
EXTRA_ID_KEYS = ("source_id", "id", "index")
SHOWN = 5  # row places a repeat warning names


def is_rl_layout(columns) -> bool:
    """Whether a file's columns are veRL's RL layout (a reward_model column) rather than plain question/answers."""
    return "reward_model" in columns


def question_of(record: dict) -> tuple[object, str]:
    """The row's question (unchecked: None or a non-string is the caller's to report) and the field it came from."""
    info = record.get("extra_info")
    if isinstance(info, dict) and info.get("question") is not None:
        return info["question"], "extra_info.question"
    if record.get("question") is not None:
        return record["question"], "question"
    prompt = record.get("prompt")
    if isinstance(prompt, list):
        users = [m.get("content") for m in prompt if isinstance(m, dict) and m.get("role") == "user"]
        if users:
            return users[-1], "prompt (its last user message)"
    return None, "extra_info.question"


def target_of(record: dict) -> tuple[object, str]:
    """reward_model.ground_truth's golds, unchecked (a string, a list or anything else), and the field they came
    from: ground_truth itself, or its `target`."""
    rm = record.get("reward_model")
    truth = rm.get("ground_truth") if isinstance(rm, dict) else None
    if isinstance(truth, dict):
        return truth.get("target"), "reward_model.ground_truth.target"
    return truth, "reward_model.ground_truth"


def row_id(record: dict) -> str | None:
    """The user's id of the row: an `id` / `uid` / `idx` column, else extra_info's source_id / id / index; None if
    it has none."""
    info = record.get("extra_info") if isinstance(record.get("extra_info"), dict) else {}
    for value in [record.get(k) for k in ID_KEYS] + [info.get(k) for k in EXTRA_ID_KEYS]:
        if value is not None and not isinstance(value, (dict, list)):
            return str(value)
    return None


def too_long(question: str, bound: int) -> str | None:
    """Why a question is refused for its length, or None."""
    if len(question) <= bound:
        return None
    return f"question too long ({len(question):,} characters, over --max-question-chars {bound:,})"


def repeats(values: list, places: list[str], what: str) -> str | None:
    """A warning when `values` (one per row, None skipped) repeat: how many rows repeat an earlier one, how many
    distinct values do, the most repeated, and the first few repeating rows (`places`); None without repeats."""
    rows: dict[object, list[str]] = defaultdict(list)
    for value, place in zip(values, places):
        if value is not None:
            rows[value].append(place)
    repeated = {v: p for v, p in rows.items() if len(p) > 1}
    if not repeated:
        return None
    extra = sum(len(p) - 1 for p in repeated.values())
    order = {place: i for i, place in enumerate(places)}
    first = sorted((p for ps in repeated.values() for p in ps[1:]), key=order.__getitem__)[:SHOWN]
    top, top_rows = max(repeated.items(), key=lambda kv: len(kv[1]))
    shown = top if len(str(top)) <= 60 else str(top)[:57] + "..."
    return (f"{extra} rows repeat an earlier {what} ({len(repeated)} distinct {what}s appear more than once; "
            f"{shown!r} {len(top_rows)} times); first repeats at {', '.join(first)}"
            + (", ..." if extra > SHOWN else ""))
