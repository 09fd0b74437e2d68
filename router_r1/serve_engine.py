"""What the router server runs behind HTTP: the run's settings, and one routing episode per request.

The episode is the training rollout's own (RouterEnv.play: the continuous schedule's coroutine,
with the same turn rules, observation format, budgets and PoolClient). Every request's turns go
to one shared engine through `generate_one` (as_async: the turns waiting while the model is busy
go out as one batch call).
"""
from __future__ import annotations

import logging
import time
from dataclasses import dataclass, field, replace
from pathlib import Path

from router_r1.reward.format import check_format
from router_r1.reward.qa_em import extract_answer
from router_r1.episodes.episode import Episode
from verl.workers.rollout.base import AsyncRolloutBackend, SamplingParams

log = logging.getLogger(__name__)

TURN_KEYS = ("max_turns", "max_obs_length", "response_length", "max_response_length")


class ServeError(ValueError):
    """A setting the server cannot start with; the message names the file, flag or key."""


@dataclass
class RunSettings:
    """What the server needs from the run it serves: its saved run_config.yaml (env section), flags over it."""

    turns: dict  # TURN_KEYS -> int
    alphas: tuple[float, ...] = ()  # the alpha-conditioned set it was trained on (empty: one fixed alpha)
    alpha: float = 0.0  # the fixed alpha (an unconditioned run) or the default one (a conditioned run)
    pool: str | None = None  # the pool yaml it was trained with
    source: str = "defaults"  # where the settings came from, for the start-up line
    scoring: dict = field(default_factory=dict)  # format_rules, reward_metric: how its training scored episodes


def load_run_settings(checkpoint: Path, overrides: dict | None = None) -> RunSettings:
    """Turn settings and alphas of the run a checkpoint was trained with (router_r1.router_env.trained_env_config);
    a checkpoint without a run config gets the paper run's shape. `overrides` (flags, not None) win."""
    from router_r1.router_env import paper_env_config, trained_env_config
    from verl.trainer.config import find_run_config

    overrides = {k: v for k, v in (overrides or {}).items() if v is not None}
    try:
        env = trained_env_config(checkpoint)
    except ValueError as e:  # a run config with an unknown or mistyped key: named by section_to_dataclass
        raise ServeError(str(e)) from e
    path = find_run_config(checkpoint) if env is not None else None
    if env is None:
        env = paper_env_config()
    turns = {}
    for k in TURN_KEYS:
        v = overrides.get(k, getattr(env, k))
        if isinstance(v, bool) or not isinstance(v, int) or v < (0 if k == "max_turns" else 1):
            raise ServeError(f"{path or 'flags'}: '{k}' must be a positive integer, got {v!r}")
        turns[k] = v
    alphas = tuple(float(a) for a in (overrides.get("alphas", env.alphas) or ()))
    alpha = float(overrides.get("alpha", alphas[0] if alphas else env.alpha))
    for a in (*alphas, alpha):
        if not 0.0 <= a <= 1.0:
            raise ServeError(f"{path or 'flags'}: alpha values must be in [0, 1], got {a}")
    where = str(path) if path else "the paper run's shape (no run_config.yaml)"
    scoring = {"format_rules": env.format_rules, "reward_metric": env.reward_metric}
    return RunSettings(turns, alphas, alpha, env.pool if path else None, where + (" + flags" if overrides else ""),
                       scoring)


# ---------------------------------------------------------------------------------- episode

@dataclass
class Call:
    model: str
    sub_question: str
    ok: bool
    latency_s: float
    cost_usd: float
    prompt_tokens: int
    completion_tokens: int
    error: str | None = None


@dataclass
class Answered:
    """One request's episode, as the server reports it."""

    answer: str | None
    episode: Episode
    calls: list[Call] = field(default_factory=list)
    format_ok: bool = False
    format_reason: str = ""
    wall_s: float = 0.0

    @property
    def cost_usd(self) -> float:
        return sum(c.cost_usd for c in self.calls)


async def play_episode(env, prompt_ids: list[int], engine: AsyncRolloutBackend, sampling: SamplingParams) -> Answered:
    """One routing episode of the training environment; pool failures come back as observations."""
    t0 = time.monotonic()
    ep = Episode(prompt_ids=list(prompt_ids))
    await env.play(ep, engine, env.turn_sampling(sampling))
    calls = [Call(t["model"], t["query"], t["ok"], t["latency_s"], t["cost_usd"], t["prompt_tokens"],
                  t["completion_tokens"], t["error"]) for t in ep.turns if "ok" in t]  # "ok": the pool was called
    ok, reason = check_format(ep.text, env.registry)
    return Answered(extract_answer(ep.text), ep, calls, ok, reason, time.monotonic() - t0)


def request_sampling(temperature: float | None, top_p: float, seed: int | None) -> SamplingParams:
    """Greedy unless the caller asks for a temperature > 0 (a router answers best greedily)."""
    if temperature is None or temperature == 0:
        return SamplingParams(greedy=True, temperature=0.0)
    return replace(SamplingParams(temperature=float(temperature), top_p=float(top_p)), seed=seed)
