"""Cost reward R_cost in [0, 1]: sqrt-transformed cost against a sliding percentile window.

    R_cost = 1 - clip((sqrt(c) - p_low) / (p_high - p_low), 0, 1)

with p_low/p_high the low/high percentiles of the last `window` sqrt costs seen BEFORE
this sample (the reference pushed first, so a sample moved its own yardstick). A free
trajectory scores exactly 1; with no history or a flat one a paid trajectory scores 0.5.
Keep one instance for training and another for validation (make_normalizers): the
reference shared one buffer, so validation costs shifted the training reward.

Which cost c is (env.cost_basis, COST_FIELDS): the reference's, each call's completion tokens at its output
price (`cost_usd`, the default), or the bill's, its prompt tokens (the system message and the sub-question:
all a call sends) at the input price too (`billed_usd`). The pool client prices both (router_r1/pool/client.py).
"""
from __future__ import annotations

import math
from collections import deque
from collections.abc import Iterable

import numpy as np

NEUTRAL = 0.5
COST_FIELDS = {"output": "cost_usd", "billed": "billed_usd"}  # env.cost_basis -> the episode's cost R_cost reads


class CostNormalizer:
    """Sliding-window percentile normaliser of trajectory cost (USD)."""

    def __init__(self, window: int = 1000, low_pct: float = 5, high_pct: float = 95):
        if window < 1:
            raise ValueError(f"CostNormalizer: window must be >= 1, got {window}")
        if not 0 <= low_pct < high_pct <= 100:
            raise ValueError(f"CostNormalizer: need 0 <= low_pct < high_pct <= 100, got {low_pct}, {high_pct}")
        self.window, self.low_pct, self.high_pct = int(window), float(low_pct), float(high_pct)
        self.history: deque[float] = deque(maxlen=self.window)  # sqrt costs

    def __len__(self) -> int:
        return len(self.history)

    def bounds(self) -> tuple[float, float] | None:
        """(p_low, p_high) of the window in sqrt space, or None while it is empty."""
        if not self.history:
            return None
        lo, hi = np.percentile(np.fromiter(self.history, float), [self.low_pct, self.high_pct])
        return float(lo), float(hi)

    @staticmethod
    def _reward(root: float, bounds: tuple[float, float] | None) -> float:
        if root == 0.0:
            return 1.0
        if bounds is None or bounds[1] <= bounds[0]:
            return NEUTRAL
        lo, hi = bounds
        return 1.0 - min(max((root - lo) / (hi - lo), 0.0), 1.0)

    @staticmethod
    def _root(cost_usd: float) -> float:
        c = float(cost_usd)
        if not math.isfinite(c) or c < 0:
            raise ValueError(f"CostNormalizer: cost must be a finite number >= 0, got {cost_usd!r}")
        return math.sqrt(c)

    def score(self, cost_usd: float) -> float:
        """R_cost of one trajectory, read from the window before the sample is pushed."""
        root = self._root(cost_usd)
        r = self._reward(root, self.bounds())
        self.history.append(root)
        return r

    def score_batch(self, costs: Iterable[float]) -> list[float]:
        """R_cost of a batch: all read the same window (taken once), then all are pushed.

        One yardstick per step keeps the reward independent of the order of samples in a
        batch, so members of a GRPO group are judged alike.
        """
        roots = [self._root(c) for c in costs]
        bounds = self.bounds()
        rewards = [self._reward(r, bounds) for r in roots]
        self.history.extend(roots)
        return rewards

    def state_dict(self) -> dict:
        """Plain, picklable state for checkpoints."""
        return {"window": self.window, "low_pct": self.low_pct, "high_pct": self.high_pct,
                "history": list(self.history)}

    def load_state_dict(self, state: dict) -> None:
        """Restore from state_dict(); the window settings must match this instance's."""
        for key in ("window", "low_pct", "high_pct", "history"):
            if key not in state:
                raise ValueError(f"CostNormalizer.load_state_dict: missing field {key!r}")
        for key in ("window", "low_pct", "high_pct"):
            if float(state[key]) != float(getattr(self, key)):
                raise ValueError(f"CostNormalizer.load_state_dict: field {key!r} is {state[key]}, "
                                 f"this normaliser has {getattr(self, key)}")
        history = [float(x) for x in state["history"]]
        if any(not math.isfinite(x) or x < 0 for x in history):
            raise ValueError("CostNormalizer.load_state_dict: field 'history' holds a negative or non-finite value")
        self.history = deque(history, maxlen=self.window)


def cost_reward(cost_usd: float, bounds: tuple[float, float] | None) -> float:
    """R_cost of a cost against fixed sqrt-space bounds (a window's (p_low, p_high)), as score() reads them."""
    return CostNormalizer._reward(CostNormalizer._root(cost_usd), bounds)


def make_normalizers(**kwargs) -> tuple[CostNormalizer, CostNormalizer]:
    """(train, validation) normalisers with the same settings and separate windows."""
    return CostNormalizer(**kwargs), CostNormalizer(**kwargs)
