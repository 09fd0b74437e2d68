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
from typing import Optional

from router_r1.reward.format import check_format
from router_r1.reward.qa_em import extract_answer
from router_r1.episodes.episode import Episode
from router_r1.router_env import RouterEnvConfig
from router_r1.runtime import EnvOverrides, EvalError, resolve_env, trained_env
from verl.workers.rollout.base import AsyncRolloutBackend, SamplingParams

log = logging.getLogger(__name__)

@dataclass
class RunSettings:
    """What the server serves: the env of the run a checkpoint was trained with (flags over it) and the alpha
    a request that names none gets."""

    env: RouterEnvConfig  # the run's env section (runtime.resolve_env); env.alphas: the alpha-conditioned set (empty: one fixed alpha)
    alpha: float  # the fixed alpha (an unconditioned run) or the default one (a conditioned run)
    source: str = "defaults"  # where the settings came from, for the start-up line
    pool: Optional[str] = None  # the pool yaml the run was trained with (None: no run config says)

    @property
    def alphas(self) -> tuple[float, ...]:
        return tuple(self.env.alphas)


def load_run_settings(checkpoint: Path, overrides: EnvOverrides | None = None,
                      alphas: list[float] | None = None) -> RunSettings:
    """The settings of the run a checkpoint was trained with (runtime.trained_env; the paper run's without a run
    config), `overrides` over them; `alphas` declares the run alpha-conditioned when its config does not say."""
    overrides = overrides or EnvOverrides()
    trained = trained_env(checkpoint)
    env = resolve_env([checkpoint], overrides, log=lambda msg: None)
    if alphas is not None:
        env = replace(env, alphas=[float(a) for a in alphas])
    alpha = overrides.alpha if overrides.alpha is not None else (env.alphas[0] if env.alphas else env.alpha)
    try:
        replace(env, alpha=float(alpha)).check()
        env.reward_config()
    except ValueError as e:
        raise EvalError(f"{trained.source if not overrides.overrides() else 'flags'}: {e}") from None
    set_by = " + flags" if overrides.overrides() or alphas is not None else ""
    return RunSettings(env, float(alpha), trained.source + set_by, env.pool if trained.saved else None)


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
