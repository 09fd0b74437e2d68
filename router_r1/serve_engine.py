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
from router_r1.pool.registry import ModelRegistry
from router_r1.router_env import RouterEnvConfig
from router_r1.runtime import EnvOverrides, EvalError, PoolFlags, resolve_env, trained_env
from verl.workers.rollout.base import AsyncRolloutBackend, SamplingParams

log = logging.getLogger(__name__)
MODEL_NAME = "router-r1"  # the model id clients ask for; a conditioned run adds NAME@ALPHA ids (model_id)

# The one documented way to train the embedded router that takes the cost knob (docs/usage.md, README): the alpha
# recipe's warm start (every question at each alpha, "Cost weight A." restated before each pick, on the pool where
# the best route depends on alpha; docs/results/alpha_tradeoff/think_alpha_4k), then its run config given env.alphas
KNOB_ALPHAS = (0.0, 0.3, 0.6, 0.9)  # configs/recipes/alpha.yaml's per_alpha.alphas
KNOB_POOL = "configs/pool/sim_tradeoff.yaml"  # configs/recipes/alpha.yaml's pool
TRAIN_KNOB = (f"RECIPE=configs/recipes/alpha.yaml POOL={KNOB_POOL} N_ORACLE=4000 SFT_ONLY=1 OUT=outputs/alpha bash "
              "train.sh && python -m experiments.alpha_tradeoff.conditioned_env outputs/alpha/sft/run_config.yaml "
              f"{KNOB_POOL} {' '.join(f'{a:g}' for a in KNOB_ALPHAS)}")


def model_id(name: str, alpha: float | None) -> str:
    """The model id that asks a conditioned router for `alpha` (`router-r1@0.6`); the bare name for None."""
    return name if alpha is None else f"{name}@{alpha:g}"


@dataclass
class RunSettings:
    """What the server serves: the env of the run a checkpoint was trained with (flags over it) and the alpha
    a request that names none gets."""

    env: RouterEnvConfig  # the run's env section (runtime.resolve_env); env.alphas: the alpha-conditioned set (empty: one fixed alpha)
    alpha: float  # the fixed alpha (an unconditioned run) or the default one (a conditioned run)
    source: str = "defaults"  # where the settings came from, for the start-up line
    pool: Optional[str] = None  # the pool yaml the run was trained with (None: no run config says)
    saved: bool = False  # whether env came from the checkpoint's own run_config.yaml

    @property
    def alphas(self) -> tuple[float, ...]:
        return tuple(self.env.alphas)

    def fixed_alpha(self) -> str:
        """Why this run takes one alpha only, and how to train one that takes the knob (for errors)."""
        says = (f"{self.source} has no env.alphas" if self.saved else
                f"no run_config.yaml with an env section says it was trained for alphas: {self.source}")
        return (f"this router was trained at the one alpha {self.alpha:g} and takes no other ({says}); a router "
                f"that takes the cost knob (env.alphas) is trained by: {TRAIN_KNOB} (docs/usage.md, 'One policy "
                f"for every cost preference')")


def load_run_settings(checkpoint: Path, overrides: EnvOverrides | None = None,
                      alphas: list[float] | None = None) -> RunSettings:
    """The settings of the run a checkpoint was trained with (runtime.trained_env; the paper run's without a run
    config), `overrides` over them; `alphas` declares the run alpha-conditioned when its config does not say,
    and may narrow a conditioned run's set; a run saved with one fixed alpha refuses them."""
    overrides = overrides or EnvOverrides()
    trained = trained_env(checkpoint)
    env = resolve_env([checkpoint], overrides, log=lambda msg: None)
    if alphas is not None:
        _check_declared(alphas, trained)
        env = replace(env, alphas=[float(a) for a in alphas])
    alpha = overrides.alpha if overrides.alpha is not None else (env.alphas[0] if env.alphas else env.alpha)
    try:
        replace(env, alpha=float(alpha)).check()
        env.reward_config()
    except ValueError as e:
        raise EvalError(f"{trained.source if not overrides.overrides() else 'flags'}: {e}") from None
    set_by = " + flags" if overrides.overrides() or alphas is not None else ""
    return RunSettings(env, float(alpha), trained.source + set_by, env.pool if trained.saved else None, trained.saved)


def _check_declared(alphas: list[float], trained) -> None:
    """--alphas over what the run config says: a fixed-alpha run refuses them (its prompts never stated a cost
    weight, so stating one changes its answers); a conditioned run takes only alphas it was trained on."""
    if not trained.saved:
        return
    if not trained.env.alphas:
        raise EvalError(f"--alphas {' '.join(f'{a:g}' for a in alphas)}: {trained.source} says this run was trained "
                        f"at the one alpha {trained.env.alpha:g} (it has no env.alphas), so its prompts never stated a "
                        f"cost weight and stating one would change its answers; a router that takes the cost knob is "
                        f"trained by: {TRAIN_KNOB}")
    untrained = [a for a in alphas if float(a) not in [float(t) for t in trained.env.alphas]]
    if untrained:
        raise EvalError(f"--alphas {' '.join(f'{a:g}' for a in untrained)}: not among the alphas this run was trained "
                        f"on ({trained.source}: env.alphas {list(trained.env.alphas)}); alphas between them snap to "
                        f"a trained one rather than interpolate")


def pool_flags(flags: PoolFlags, settings: RunSettings) -> PoolFlags:
    """The pool to open when --pool, --pool-url and --sim are all left out: the run's pool, served in-process
    when its yaml names a simulated world (the run's own pool server ended with it), else at the run's
    env.pool_url (or its yaml's endpoints); no run pool: the simulated one (runtime.open_pool)."""
    if flags.pool is not None or flags.pool_url is not None or flags.sim or settings.pool is None:
        return flags
    if ModelRegistry.from_yaml(settings.pool).world is not None:
        return replace(flags, sim=True)
    return replace(flags, pool_url=settings.env.pool_url)


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
