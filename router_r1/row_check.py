"""What a training or evaluation row must hold for the router's rollout and reward.

The engine's PromptDataset calls `check_router_row` on every row when the data is
loaded (RouterEnv.check_row is the hook), so a bad row is named by file and row before
any model is built, instead of failing mid-run or being trained on silently.
"""
from __future__ import annotations

from router_r1.reward.qa_em import normalize_answer

TARGET = "field 'reward_model.ground_truth.target'"


def gold_problem(target) -> str | None:
    """Why `target` cannot be a row's gold answers, or None if it can.

    A gold that normalises to nothing ("The", "?!", "") would give EM 1 to an empty
    answer, so it is refused rather than scored."""
    if target is None:
        return f"{TARGET} is missing or null"
    golds = [target] if isinstance(target, str) else target
    if not isinstance(golds, list):
        return f"{TARGET} is a {type(target).__name__}, not a list of strings"
    if not golds:
        return f"{TARGET} is empty"
    for g in golds:
        if not isinstance(g, str):
            return f"{TARGET} holds a {type(g).__name__} ({g!r}), not a string"
        if not normalize_answer(g):
            return f"{TARGET} holds {g!r}, which normalises to nothing (an empty answer would match it)"
    return None


def check_router_row(fields: dict) -> str | None:
    """Why a row (its columns as plain Python objects) cannot be used by the router, or None."""
    rm = fields.get("reward_model")
    gt = rm.get("ground_truth") if isinstance(rm, dict) else None
    if not isinstance(gt, dict):
        return f"{TARGET} is missing (no reward_model.ground_truth mapping)"
    return gold_problem(gt.get("target"))
