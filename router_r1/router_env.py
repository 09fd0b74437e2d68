"""The routing environment's config section (`env`, configs/env/router.yaml) and the factory the engine calls."""
from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import Optional

from omegaconf import II

from router_r1.pool.client import PoolClient
from router_r1.pool.health import PoolHealth
from router_r1.pool.registry import ModelRegistry
from router_r1.prompts import load_template
from router_r1.reward.score import RewardConfig
from router_r1.episodes.manager import RouterConfig, RouterEnv
from verl.trainer.config import find_run_config, load_run_config, section_to_dataclass


@dataclass
class RouterEnvConfig:
    """`env` of a routing run: the pool, the episode's shape, the reward. The one home of these keys (a
    default written as RouterConfig.x / RewardConfig.x is that class's, for code that builds them directly);
    evaluation and inference read a trained run's values from its run_config.yaml."""

    factory: str = "router_r1.router_env:make_env"  # "module:function" the engine calls with (env section, tokenizer)
    pool: str = "configs/pool/paper.yaml"  # the pool registry yaml (models, prices, endpoints)
    pool_url: Optional[str] = None  # override every endpoint of the pool yaml (a local proxy, the simulated server)
    seen_only: bool = True  # route only to models not marked unseen
    alpha: float = RewardConfig.alpha  # cost_coe: reward = (1 - alpha) + alpha * R_cost for a right answer; 0 = accuracy only (the paper's cost runs: up to 0.9)
    format_rules: str = RewardConfig.format_rules  # reference (the published code's check) | strict (router_r1/reward/format.py says what each checks)
    reward_metric: str = RewardConfig.reward_metric  # em | f1: the answer metric of the gate and the score
    max_turns: int = RouterConfig.max_turns  # generations that may route; one more turn must answer
    max_obs_length: int = RouterConfig.max_obs_length  # tokens of pool text per <information> block (cut inside the block)
    response_length: int = II("rollout.response_length")  # tokens per generated turn
    max_response_length: int = II("rollout.max_response_length")  # all turns and <information> blocks together
    schedule: str = RouterConfig.schedule  # continuous (one coroutine per episode; the engine batches) | sync (each turn waits for the batch's slowest call, the reference's) | overlap (the older batch queue); router_r1/episodes/manager.py
    invalid_hint: bool = RouterConfig.invalid_hint  # append a corrective hint after an invalid action (else nothing)
    cache_dir: Optional[str] = None  # pool reply cache: re-runs are free and repeatable
    max_concurrency: int = 32  # pool calls in flight per endpoint
    call_timeout_s: float = 30.0  # seconds per pool call attempt
    call_deadline_s: float = 120.0  # seconds per pool call, retries included; then the call is a failed observation
    max_retries: int = 4  # retries of a retryable pool error (bounded exponential backoff with jitter)
    max_pool_failure_rate: float = PoolHealth.max_failure_rate  # a training batch whose pool calls fail more often is unhealthy (pool/failure_rate is logged every step)
    pool_failure_patience: int = PoolHealth.patience  # unhealthy training batches in a row before training stops with PoolFailureError (validation only reports)
    # AdaTurn (budget-aware turns); off while budgets is empty
    budgets: list[int] = field(default_factory=list)  # T_max is drawn per prompt from this set, stated in the prompt, and is the episode's routing limit (max_turns is then unused); a pure function of (budget_seed, uid, trainer.seed + step): a resumed run and a GRPO group draw the same
    budget_seed: int = RouterConfig.budget_seed  # seed of that draw
    val_budget: Optional[int] = RouterConfig.val_budget  # validation: a fixed budget, or null for a fixed per-prompt draw from budgets
    budget_in_prompt: bool = RouterConfig.budget_in_prompt  # rebuild each prompt with its budget sentence (needs extra_info.question)
    prompt_template: Optional[str] = None  # template file of that rebuild (null: the default template); must contain {budget}
    budget_mode: str = RouterConfig.budget_mode  # a route asked for with the budget spent: end (the episode stops) | forced (refuse it, drop its turn, append the budget-exhausted message, generate the answer) | mask (as end, response_mask zeroed) | penalize (as end, score = the format penalty)
    # Alpha conditioning (router_r1/serve, calibrate); off while alphas is empty
    alphas: list[float] = field(default_factory=list)  # the set each prompt's cost weight is drawn from, stated in its prompt (prompts.alpha_text); its reward uses that alpha; empty: the one `alpha`, prompts as given
    alpha_seed: int = RouterConfig.alpha_seed  # seed of that draw
    val_alpha: Optional[float] = RouterConfig.val_alpha  # validation alpha; null: drawn per prompt, the same at every validation

    def router_config(self) -> RouterConfig:
        """The rollout manager's settings."""
        return RouterConfig(
            max_turns=self.max_turns, max_obs_length=self.max_obs_length, response_length=self.response_length,
            max_response_length=self.max_response_length, invalid_hint=self.invalid_hint, schedule=self.schedule,
            budgets=tuple(self.budgets), budget_seed=self.budget_seed, val_budget=self.val_budget,
            budget_in_prompt=self.budget_in_prompt,
            prompt_template=load_template(self.prompt_template) if self.prompt_template else None,
            budget_mode=self.budget_mode, alphas=tuple(self.alphas), alpha_seed=self.alpha_seed,
            val_alpha=self.val_alpha)

    def reward_config(self) -> RewardConfig:
        return RewardConfig(alpha=self.alpha, format_rules=self.format_rules, reward_metric=self.reward_metric)


def make_env(env_cfg, tokenizer) -> RouterEnv:
    """Build RouterEnv from the `env` section (a RouterEnvConfig, or a mapping of its keys)."""
    cfg = section_to_dataclass(RouterEnvConfig, env_cfg, "env")
    # The HTTP stack logs every request at INFO; a rollout makes thousands.
    for name in ("httpx", "httpx2", "openai"):
        logging.getLogger(name).setLevel(logging.WARNING)
    registry = ModelRegistry.from_yaml(cfg.pool, base_url=cfg.pool_url)
    if cfg.seen_only:
        registry = registry.seen()
    client = PoolClient(registry, max_concurrency_per_endpoint=cfg.max_concurrency, timeout_s=cfg.call_timeout_s,
                        max_retries=cfg.max_retries, deadline_s=cfg.call_deadline_s, cache_dir=cfg.cache_dir)
    health = PoolHealth(cfg.max_pool_failure_rate, cfg.pool_failure_patience,
                        hint=f"Pool settings in force: env.call_timeout_s={cfg.call_timeout_s:g}, env.call_deadline_s="
                             f"{cfg.call_deadline_s:g}, env.max_concurrency={cfg.max_concurrency}, pool {cfg.pool}"
                             + (f" at {cfg.pool_url}" if cfg.pool_url else "") + "; check the pool server's log.")
    return RouterEnv(cfg.router_config(), tokenizer, registry, client, cfg.reward_config(), health=health)


make_env.config_class = RouterEnvConfig

# The keys that give an episode its shape and its score: evaluation and inference take them from the run
# a checkpoint was trained with (its run_config.yaml); a flag overrides.
SHAPE_KEYS = ("max_turns", "max_obs_length", "response_length", "max_response_length", "schedule", "alpha",
              "format_rules", "reward_metric")


def trained_env_config(checkpoint) -> RouterEnvConfig | None:
    """The env section a checkpoint was trained with (run_config.yaml in its directory), or None when it
    has none or was trained in another environment."""
    run = load_run_config(checkpoint)
    if run is None or run.get("env") is None or run.env.get("factory") != RouterEnvConfig.factory:
        return None
    return section_to_dataclass(RouterEnvConfig, run.env, f"{find_run_config(checkpoint)}: env")


def paper_env_config() -> RouterEnvConfig:
    """The env section of the paper's run (configs/router_r1.yaml): the shape of a checkpoint without a run config."""
    from verl.trainer.main_ppo import load_config

    return section_to_dataclass(RouterEnvConfig, load_config("router_r1").env, "env")
