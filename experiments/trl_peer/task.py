"""The single-turn routing task both trainers learn: the policy writes one route, the simulated pool replies, and
the reward is the exact match of the reply's answer (its first sentence) against the gold.

`route_reward(text, fields)` is the one reward function: our trainer calls it through its single-turn env
(`env.reward_fn`), TRL's GRPOTrainer through `TrlReward`, which holds the same function object.
`python -m experiments.trl_peer.task` writes one seed's training rows (1-hop questions only, in a seeded order
that both trainers read unshuffled).
"""
from __future__ import annotations

import argparse
import functools
import re
from pathlib import Path

import numpy as np
import pandas as pd

from router_r1.actions import parse_action
from router_r1.pool.messages import submodel_messages
from router_r1.pool.registry import ModelRegistry
from router_r1.reward.qa_em import em_score
from sim.plugin import make_backend

ROOT = Path(__file__).resolve().parents[2]
POOL = ROOT / "configs/pool/sim.yaml"  # the pool the warm start was trained against (world seed 0)
ONE_HOP = "sim_1hop"
_FIRST_SENTENCE = re.compile(r"^(.*?)(?:\.\s|\.?$)", re.DOTALL)


class RouteTask:
    """The pool played in process: a route's model answers its sub-question as the simulated pool server would."""

    def __init__(self, pool: str | Path = POOL, seed: int = 0):
        self.registry = ModelRegistry.from_yaml(pool).seen()
        self.backend = make_backend(pool, seed=seed, latency_scale=0.0)

    def reply(self, text: str) -> str | None:
        """The pool's reply to the first action of `text`, or None when that action is no playable route."""
        action = parse_action(text, self.registry)
        if action.kind != "route":
            return None
        spec = self.registry.resolve(action.model)
        reply, _, _ = self.backend.respond(spec.api_id, submodel_messages(action.query), spec.max_tokens)
        return reply

    def score(self, text: str, golds: list[str]) -> float:
        """1.0 when the reply's answer matches a gold (the project's EM), else 0.0 (also with no playable route)."""
        reply = self.reply(text)
        return 0.0 if reply is None else em_score(reply_answer(reply), golds)


def reply_answer(reply: str) -> str:
    """The answer a pool reply states first (the pool's system prompt asks for it first): its first sentence."""
    return _FIRST_SENTENCE.match(reply.strip()).group(1).strip()


def golds_of(fields: dict) -> list[str]:
    """The row's gold answers (reward_model.ground_truth.target); ValueError naming the field when absent."""
    try:
        target = fields["reward_model"]["ground_truth"]["target"]
    except (KeyError, TypeError):
        raise ValueError(f"row {fields.get('extra_info', {}).get('uid', '?')}: missing "
                         "reward_model.ground_truth.target") from None
    return [target] if isinstance(target, str) else [str(t) for t in target]


@functools.lru_cache(maxsize=1)
def default_task() -> RouteTask:
    return RouteTask()


def route_reward(text: str, fields: dict) -> float:
    """The reward of one completion for its data row: the SingleTurnEnv signature (`env.reward_fn`)."""
    return default_task().score(text, golds_of(fields))


class TrlReward:
    """TRL's reward-function signature over `fn` (route_reward): one float per completion, row fields from the
    dataset's columns."""

    __name__ = "route_em"  # TRL names the reward's logged metric after it

    def __init__(self, fn=route_reward):
        self.fn = fn

    def __call__(self, prompts, completions, reward_model, **kwargs) -> list[float]:
        texts = [c[-1]["content"] if isinstance(c, list) else c for c in completions]
        return [float(self.fn(t, {"reward_model": rm})) for t, rm in zip(texts, reward_model)]


def one_hop_rows(src: str | Path, seed: int, limit: int | None = None) -> pd.DataFrame:
    """The 1-hop rows of a QA parquet (python -m sim.qa's), permuted by `seed`, the first `limit` of them."""
    df = pd.read_parquet(src)
    if "data_source" not in df.columns:
        raise ValueError(f"{src}: no data_source column (a python -m sim.qa parquet has one)")
    df = df[df["data_source"] == ONE_HOP].reset_index(drop=True)
    if df.empty:
        raise ValueError(f"{src}: no {ONE_HOP} rows")
    df = df.iloc[np.random.default_rng(seed).permutation(len(df))].reset_index(drop=True)
    return df if limit is None else df.iloc[:limit].reset_index(drop=True)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--src", required=True, help="a QA parquet (python -m sim.qa's train.parquet)")
    p.add_argument("--out", required=True, help="where the seed's 1-hop rows go (parquet)")
    p.add_argument("--seed", type=int, default=1, help="the order's seed (the run's seed)")
    p.add_argument("--limit", type=int, default=None, help="keep the first N rows of that order")
    a = p.parse_args(argv)
    df = one_hop_rows(a.src, a.seed, a.limit)
    Path(a.out).parent.mkdir(parents=True, exist_ok=True)
    df.to_parquet(a.out)
    print(f"{len(df)} {ONE_HOP} rows (seed {a.seed}) -> {a.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
