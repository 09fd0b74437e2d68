"""The row schema of the router's parquet files, and checks for input and output rows.

One output row (what the trainer, the reward and test.sh read):

    data_source   str                     "nq", "hotpotqa", ..., "sim_1hop"
    prompt        [{role, content}]       chat messages from build_router_prompt
    ability       "fact-reasoning"
    reward_model  {style: "rule", ground_truth: {target: [gold strings]}}
    extra_info    {split, index, uid, question, source_split, source_id}

`uid` is "<source>-<split>-<index>" with `index` the row's position within its source
in that split: unique across sources (the reference restarted `index` at 0 per source,
so GRPO merged groups of different prompts).
"""
from __future__ import annotations

from router_r1.reward.qa_em import normalize_answer

ABILITY = "fact-reasoning"
EXTRA_INFO_KEYS = ("split", "index", "uid", "question", "source_split", "source_id")


class DataBuildError(ValueError):
    """Input or output data that cannot be used; the message names the file/source, row and field."""


def make_uid(source: str, split: str, index: int) -> str:
    """The prompt's id: unique across sources and splits."""
    return f"{source}-{split}-{index}"


def _lone_surrogate(text: str) -> int | None:
    """Where a string holds a lone UTF-16 surrogate (JSON's "\\ud800" decodes to one; no file can hold it)."""
    try:
        text.encode("utf-8")
        return None
    except UnicodeEncodeError as e:
        return e.start


def question_problem(question) -> str | None:
    """Why a row's question cannot be used, or None if it can."""
    if question is None:
        return "missing question"
    if not isinstance(question, str):
        return f"question is a {type(question).__name__}, not a string"
    if not question.strip():
        return "empty question"
    if (at := _lone_surrogate(question)) is not None:
        return f"lone surrogate (U+{ord(question[at]):04X} in the question at character {at + 1})"
    return None


def id_problem(row_id) -> str | None:
    """Why a row's own id cannot be kept as its source_id, or None if it can (or there is none)."""
    if isinstance(row_id, str) and (at := _lone_surrogate(row_id)) is not None:
        return f"lone surrogate (U+{ord(row_id[at]):04X} in the id at character {at + 1})"
    return None


def golds_problem(answers: list, key: str = "golden_answers") -> str | None:
    """Why a list of gold answers cannot be used, or None if at least one usable gold remains."""
    if not all(isinstance(a, str) for a in answers):
        return f"{key} holds a non-string"
    for a in answers:
        if (at := _lone_surrogate(a)) is not None:
            return f"lone surrogate (U+{ord(a[at]):04X} in {key} at character {at + 1})"
    if not clean_answers(answers):
        return f"empty {key}"  # nothing left but blanks and golds like "The" or "?!" (see clean_answers)
    return None


def input_problem(question, answers, key: str = "golden_answers") -> str | None:
    """Why a (question, golds) pair cannot be used, or None if it can; `answers` must be a list."""
    if (p := question_problem(question)) is not None:
        return p
    if answers is None:
        return f"missing {key}"
    if not isinstance(answers, list):
        return f"{key} is a {type(answers).__name__}, not a list"
    return golds_problem(answers, key)


def clean_answers(answers: list[str]) -> list[str]:
    """Gold strings without surrounding space and duplicates (first order kept), and without golds that
    normalise to nothing ("", "The", "?!"): an empty answer would match those (EM 1)."""
    return list(dict.fromkeys(a.strip() for a in answers if normalize_answer(a)))


def make_row(source: str, split: str, index: int, question: str, answers: list[str],
             prompt: list[dict[str, str]], source_split: str, source_id: str) -> dict:
    """One output row in the schema above."""
    return {
        "data_source": source,
        "prompt": prompt,
        "ability": ABILITY,
        "reward_model": {"style": "rule", "ground_truth": {"target": list(answers)}},
        "extra_info": {
            "split": split,
            "index": index,
            "uid": make_uid(source, split, index),
            "question": question,
            "source_split": source_split,
            "source_id": source_id,
        },
    }


def validate_row(row: dict, where: str) -> None:
    """Raise naming `where` and the field if `row` (plain Python objects) breaks the schema."""
    def fail(field: str, why: str):
        raise DataBuildError(f"{where}: field {field!r} {why}")

    if not isinstance(row.get("data_source"), str) or not row["data_source"]:
        fail("data_source", "must be a non-empty string")
    prompt = row.get("prompt")
    if not isinstance(prompt, list) or not prompt:
        fail("prompt", "must be a non-empty list of chat messages")
    for m in prompt:
        if not isinstance(m, dict) or not isinstance(m.get("role"), str) or not isinstance(m.get("content"), str):
            fail("prompt", "must hold {role: str, content: str} messages")
    if row.get("ability") != ABILITY:
        fail("ability", f"must be {ABILITY!r}")
    rm = row.get("reward_model")
    if not isinstance(rm, dict) or rm.get("style") != "rule" or not isinstance(rm.get("ground_truth"), dict):
        fail("reward_model", "must be {style: 'rule', ground_truth: {target: [...]}}")
    target = rm["ground_truth"].get("target")
    if not isinstance(target, list) or not target or not all(isinstance(t, str) and t for t in target):
        fail("reward_model.ground_truth.target", "must be a non-empty list of non-empty strings")
    info = row.get("extra_info")
    if not isinstance(info, dict):
        fail("extra_info", "must be a mapping")
    missing = [k for k in EXTRA_INFO_KEYS if k not in info]
    if missing:
        fail("extra_info", f"lacks {', '.join(missing)}")
    if info["uid"] != make_uid(row["data_source"], info["split"], info["index"]):
        fail("extra_info.uid", f"is {info['uid']!r}, expected '<source>-<split>-<index>'")
