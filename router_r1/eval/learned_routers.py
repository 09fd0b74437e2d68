"""KNN and MLP routers learned from the train split's per-model outcomes (the routing baselines of
RouteLLM and the Router-R1 paper's tables), and the cost-aware rule both use to pick a model.

Outcomes: every routable model is asked every train question verbatim, once; correct[i, m] is the
EM of model m's reply (its first sentence, as the single-model baselines answer) and cost[i, m] its
cost in USD. The table is cached to a JSON file (Outcomes.save / load).

For a test question each router estimates, per model m, P_m = P(m answers it right) and C_m =
its cost:
    knn  the k train questions nearest in embedding space (cosine): P_m and C_m are their mean
         correct[., m] and cost[., m]; k is given, or chosen from KNN_KS by leave-one-out on the train
         split (each train question routed by its k nearest others, scored by its own outcome)
    mlp  a one-hidden-layer MLP (128 units) on the embedding with one sigmoid output per model, trained
         on correct[., m] (binary cross-entropy, 400 Adam steps of 64 questions): P_m; C_m is model m's
         mean train cost
and both pick
    argmax_m  P_m * ((1 - alpha) + alpha * R_cost(C_m))
the expected value of the training reward of a one-call answer at the run's alpha (a right answer
pays (1 - alpha) + alpha * R_cost, a wrong one 0), with R_cost read, as the reward reads it
(router_r1/reward/cost.py), against the 5th/95th percentiles of the square roots of every train
outcome's cost. Ties go to the cheaper model.
"""
from __future__ import annotations

import json
import math
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from router_r1.reward.cost import CostNormalizer

KNN_KS = (5, 10, 20, 40, 80)  # the k a knn router chooses from (select_k) unless one is given


@dataclass
class Outcomes:
    """Per train question and model: right or not, and the call's cost."""

    models: list[str]
    questions: list[str]
    correct: np.ndarray  # (n, M) of 0/1
    cost: np.ndarray  # (n, M) USD

    def save(self, path: str | Path, key: str) -> None:
        Path(path).parent.mkdir(parents=True, exist_ok=True)
        doc = {"key": key, "models": self.models, "questions": self.questions,
               "correct": self.correct.astype(int).tolist(), "cost": self.cost.tolist()}
        Path(path).write_text(json.dumps(doc))

    @classmethod
    def load(cls, path: str | Path, key: str) -> "Outcomes | None":
        """The cached table, or None when there is none or it was made for other questions or another pool."""
        try:
            doc = json.loads(Path(path).read_text())
        except (OSError, ValueError):
            return None
        if not isinstance(doc, dict) or doc.get("key") != key:
            return None
        return cls(doc["models"], doc["questions"], np.asarray(doc["correct"], dtype=np.float64),
                   np.asarray(doc["cost"], dtype=np.float64))


def cost_bounds(costs: np.ndarray) -> tuple[float, float] | None:
    """The reward's (p_low, p_high) window over these costs (sqrt space, 5th/95th percentiles)."""
    norm = CostNormalizer(window=max(1, costs.size))
    norm.history.extend(np.sqrt(np.asarray(costs, dtype=np.float64).ravel()).tolist())
    return norm.bounds()


def r_cost(costs: np.ndarray, bounds: tuple[float, float] | None) -> np.ndarray:
    """R_cost of each cost, as CostNormalizer scores one against a fixed window: free is 1, a flat window 0.5."""
    roots = np.sqrt(np.asarray(costs, dtype=np.float64))
    if bounds is None or bounds[1] <= bounds[0]:
        out = np.full(roots.shape, 0.5)
    else:
        out = 1.0 - np.clip((roots - bounds[0]) / (bounds[1] - bounds[0]), 0.0, 1.0)
    return np.where(roots == 0.0, 1.0, out)


def choose(p: np.ndarray, c: np.ndarray, alpha: float, bounds: tuple[float, float] | None) -> np.ndarray:
    """Per row the model index maximising P * ((1 - alpha) + alpha * R_cost(C)); ties to the lower cost."""
    value = p * ((1.0 - alpha) + alpha * r_cost(c, bounds))  # (n, M)
    value = np.round(value, 9)  # float noise must not beat a real tie
    out = np.empty(len(p), dtype=int)
    for i in range(len(p)):
        best = np.flatnonzero(value[i] == value[i].max())
        out[i] = best[np.argmin(c[i, best])]
    return out


class KnnRouter:
    """P_m and C_m from the k nearest train questions (cosine over L2-normalised embeddings)."""

    def __init__(self, train_x: np.ndarray, outcomes: Outcomes, k: int):
        if k < 1:
            raise ValueError(f"--knn-k must be >= 1, got {k}")
        self.x, self.out, self.k = train_x, outcomes, min(k, len(train_x))

    def estimate(self, x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        return self._mean(_nearest(x @ self.x.T, self.k))

    def _mean(self, nn: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        return self.out.correct[nn].mean(axis=1), self.out.cost[nn].mean(axis=1)  # (n, M) each


def _nearest(sims: np.ndarray, k: int) -> np.ndarray:
    """Indices of the k most similar columns per row; a stable sort keeps equal similarities in train order."""
    return np.argsort(-sims, axis=1, kind="stable")[:, :k]


def select_k(train_x: np.ndarray, outcomes: Outcomes, alpha: float, bounds, ks=KNN_KS) -> tuple[int, dict]:
    """The k of KNN_KS whose leave-one-out routing of the train questions earns the most reward at alpha (ties
    to the smaller k), and each k's mean reward."""
    sims = train_x @ train_x.T  # (n, n)
    np.fill_diagonal(sims, -np.inf)  # a question is not its own neighbour
    ks = [k for k in ks if k < len(train_x)] or [max(1, len(train_x) - 1)]
    order = _nearest(sims, max(ks))
    rows = np.arange(len(train_x))
    scores = {}
    for k in ks:
        p, c = KnnRouter(train_x, outcomes, k)._mean(order[:, :k])
        pick = choose(p, c, alpha, bounds)
        paid = outcomes.correct[rows, pick] * ((1 - alpha) + alpha * r_cost(outcomes.cost[rows, pick], bounds))
        scores[k] = float(paid.mean())
    best = max(scores.values())
    return min(k for k, v in scores.items() if v >= best - 1e-12), scores


class MlpRouter:
    """One hidden layer, one sigmoid per model, trained with Adam on seeded mini-batches of the train outcomes."""

    def __init__(self, train_x: np.ndarray, outcomes: Outcomes, hidden: int = 128, steps: int = 400,
                 batch_size: int = 64, lr: float = 3e-3, weight_decay: float = 1e-4, seed: int = 0):
        import torch

        gen = torch.Generator().manual_seed(seed)
        d, m = train_x.shape[1], outcomes.correct.shape[1]
        self.net = torch.nn.Sequential(torch.nn.Linear(d, hidden), torch.nn.ReLU(), torch.nn.Linear(hidden, m))
        x = torch.as_tensor(train_x, dtype=torch.float32)
        y = torch.as_tensor(outcomes.correct, dtype=torch.float32)
        threads = torch.get_num_threads()
        torch.set_num_threads(1)  # small matmuls: more threads only wait on each other on a busy machine
        try:
            with torch.no_grad():  # an init from its own generator: torch's global RNG is left alone
                for p in self.net.parameters():
                    p.copy_(torch.empty_like(p).uniform_(-1.0, 1.0, generator=gen) / math.sqrt(p.shape[-1]))
            opt = torch.optim.Adam(self.net.parameters(), lr=lr, weight_decay=weight_decay)
            for _ in range(steps):
                idx = torch.randint(0, len(x), (min(batch_size, len(x)),), generator=gen)
                opt.zero_grad()
                torch.nn.functional.binary_cross_entropy_with_logits(self.net(x[idx]), y[idx]).backward()
                opt.step()
        finally:
            torch.set_num_threads(threads)
        self.mean_cost = outcomes.cost.mean(axis=0)  # (M,)

    def estimate(self, x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        import torch

        with torch.no_grad():
            p = torch.sigmoid(self.net(torch.as_tensor(x, dtype=torch.float32))).double().numpy()  # (n, M)
        return p, np.broadcast_to(self.mean_cost, p.shape)
