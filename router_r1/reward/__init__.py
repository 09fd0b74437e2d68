"""Rule-based reward: format gate, exact match / F1, cost normaliser, gated score."""
from router_r1.reward.cost import CostNormalizer, make_normalizers
from router_r1.reward.format import check_format
from router_r1.reward.qa_em import em_score, extract_answer, f1_score, normalize_answer
from router_r1.reward.score import RewardConfig, compute_score, compute_scores

__all__ = [
    "CostNormalizer", "make_normalizers", "check_format", "em_score", "extract_answer",
    "f1_score", "normalize_answer", "RewardConfig", "compute_score", "compute_scores",
]
