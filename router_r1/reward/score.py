"""The gated reward: -1 broken format, 0 wrong answer, (1 - alpha) * m + alpha * R_cost right.

m is the answer metric (`reward_metric`): EM (0 or 1, the default) or the best token F1
over the golds; "right" means m > 0, as in the reference's F1 mode. Every trajectory's
cost is pushed into the normaliser, whatever its format or answer: the window then
tracks what the policy actually spends, not only its successes.
"""
from __future__ import annotations

import logging
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, replace

from router_r1.pool.registry import ModelRegistry
from router_r1.reward.cost import CostNormalizer
from router_r1.reward.format import FORMAT_RULE_SETS, check_format
from router_r1.reward.qa_em import em_score, extract_answer, f1_score, usable_golds

logger = logging.getLogger(__name__)
REWARD_METRICS = ("em", "f1")


@dataclass
class RewardConfig:
    """How a trajectory is scored (the `env.alpha`, `env.format_rules`, `env.reward_metric` keys)."""

    alpha: float = 0.0  # cost_coe: trades accuracy for cost; 0 ignores cost
    format_penalty: float = -1.0
    format_rules: str = "reference"  # reference | strict (reward/format.py says what each checks)
    reward_metric: str = "em"  # em | f1: the answer metric the gate and the score use

    def __post_init__(self):
        if not 0.0 <= self.alpha <= 1.0:
            raise ValueError(f"RewardConfig.alpha must be in [0, 1], got {self.alpha}")
        if self.format_rules not in FORMAT_RULE_SETS:
            raise ValueError(f"env.format_rules must be one of {'|'.join(FORMAT_RULE_SETS)}, "
                             f"got {self.format_rules!r}")
        if self.reward_metric not in REWARD_METRICS:
            raise ValueError(f"env.reward_metric must be one of {'|'.join(REWARD_METRICS)}, "
                             f"got {self.reward_metric!r}")


def _judge(response: str, golds, route_count: int, registry: ModelRegistry, cfg: RewardConfig) -> dict:
    """Format and answer metrics; checked before the normaliser is touched, so bad input leaves it as it was."""
    if int(route_count) < 0:
        raise ValueError(f"route_count must be >= 0, got {route_count}")
    golds = usable_golds(golds)
    ok, reason = check_format(response, registry, cfg.format_rules)
    pred = extract_answer(response)
    return {"em": em_score(pred, golds), "f1": f1_score(pred, golds), "format_ok": ok,
            "format_reason": reason, "route_count": int(route_count), "gold_ok": bool(golds)}


def _gate(m: dict, cost_usd: float, cost_reward: float, cfg: RewardConfig) -> tuple[float, dict]:
    value = m[cfg.reward_metric]
    if not m["format_ok"]:
        score = cfg.format_penalty
    elif value <= 0.0:
        score = 0.0
    else:
        score = (1.0 - cfg.alpha) * value + cfg.alpha * cost_reward
    return score, {**m, "cost_usd": float(cost_usd), "cost_reward": cost_reward, "score": score}


def _warn_no_gold(judged: list[dict]) -> None:
    if missing := sum(not m["gold_ok"] for m in judged):
        logger.warning("reward: %d of %d trajectories have no usable gold answer (empty, None or "
                       "normalising to nothing); scored as wrong", missing, len(judged))


def compute_score(
    response: str,
    golds: Iterable[str],
    cost_usd: float,
    route_count: int,
    registry: ModelRegistry,
    normalizer: CostNormalizer,
    cfg: RewardConfig | None = None,
) -> tuple[float, dict]:
    """Score one decoded response; updates `normalizer` with its cost (its only side effect)."""
    cfg = cfg or RewardConfig()
    m = _judge(response, golds, route_count, registry, cfg)
    _warn_no_gold([m])
    return _gate(m, cost_usd, normalizer.score(cost_usd), cfg)


def compute_scores(
    responses: Sequence[str],
    golds: Sequence[Iterable[str]],
    costs: Sequence[float],
    route_counts: Sequence[int],
    registry: ModelRegistry,
    normalizer: CostNormalizer,
    cfg: RewardConfig | None = None,
    alphas: Sequence[float] | None = None,
) -> tuple[list[float], list[dict]]:
    """Score a batch; cost rewards come from one window read (CostNormalizer.score_batch).

    `alphas` (alpha-conditioned training) gives each response its own alpha in place of cfg.alpha.
    """
    n = len(responses)
    for field, seq in (("golds", golds), ("costs", costs), ("route_counts", route_counts), ("alphas", alphas)):
        if seq is not None and len(seq) != n:
            raise ValueError(f"compute_scores: {field} has {len(seq)} entries, responses has {n}")
    cfg = cfg or RewardConfig()
    cfgs = [cfg] * n if alphas is None else [replace(cfg, alpha=float(a)) for a in alphas]
    judged = [_judge(r, g, k, registry, cfg) for r, g, k in zip(responses, golds, route_counts)]
    _warn_no_gold(judged)
    cost_rewards = normalizer.score_batch(costs)
    out = [_gate(m, c, cr, c_) for m, c, cr, c_ in zip(judged, costs, cost_rewards, cfgs)]
    return [s for s, _ in out], [m for _, m in out]
