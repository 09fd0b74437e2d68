"""Factory that the engine calls to build the routing environment (`env.factory`)."""
from __future__ import annotations

import logging

from router_r1.pool.client import PoolClient
from router_r1.pool.registry import ModelRegistry
from router_r1.prompts import load_template
from router_r1.reward.score import RewardConfig
from router_r1.rollout.manager import RouterConfig, RouterEnv


def make_env(env_cfg, tokenizer) -> RouterEnv:
    """Build RouterEnv from the `env` section of the trainer config (keys: see configs/router_r1.yaml)."""
    # The HTTP stack logs every request at INFO; a rollout makes thousands.
    for name in ("httpx", "httpx2", "openai"):
        logging.getLogger(name).setLevel(logging.WARNING)
    registry = ModelRegistry.from_yaml(env_cfg["pool"], base_url=env_cfg.get("pool_url"))
    if env_cfg.get("seen_only", True):
        registry = registry.seen()
    client = PoolClient(
        registry,
        max_concurrency_per_endpoint=int(env_cfg.get("max_concurrency", 32)),
        timeout_s=float(env_cfg.get("call_timeout_s", 30.0)),
        max_retries=int(env_cfg.get("max_retries", 4)),
        deadline_s=float(env_cfg.get("call_deadline_s", 120.0)),
        cache_dir=env_cfg.get("cache_dir"),
    )
    cfg = RouterConfig(
        max_turns=int(env_cfg.get("max_turns", 4)),
        max_obs_length=int(env_cfg.get("max_obs_length", 600)),
        response_length=int(env_cfg.get("response_length", 1024)),
        max_response_length=int(env_cfg.get("max_response_length", 4096)),
        invalid_hint=bool(env_cfg.get("invalid_hint", False)),
        schedule=str(env_cfg.get("schedule", "continuous")),
        # AdaTurn (configs/adaturn.yaml documents the keys); off while `budgets` is empty
        budgets=tuple(int(b) for b in (env_cfg.get("budgets") or ())),
        budget_seed=int(env_cfg.get("budget_seed", 0)),
        val_budget=None if env_cfg.get("val_budget") is None else int(env_cfg["val_budget"]),
        budget_in_prompt=bool(env_cfg.get("budget_in_prompt", True)),
        prompt_template=load_template(env_cfg["prompt_template"]) if env_cfg.get("prompt_template") else None,
        budget_mode=str(env_cfg.get("budget_mode", "end")),
        # alpha conditioning (configs/embedded_alpha.yaml documents the keys); off while `alphas` is empty
        alphas=tuple(float(a) for a in (env_cfg.get("alphas") or ())),
        alpha_seed=int(env_cfg.get("alpha_seed", 0)),
        val_alpha=None if env_cfg.get("val_alpha") is None else float(env_cfg["val_alpha"]),
    )
    return RouterEnv(cfg, tokenizer, registry, client, RewardConfig(alpha=float(env_cfg.get("alpha", 0.0))))
