"""What a routing run's pool needs before training starts: its yaml, its world if it names one, and for a
remote endpoint its key; and, for missing data, the command that builds it for that pool.
The engine's preflight (verl/trainer/preflight.py) calls these through make_env.preflight and make_env.data_command."""
from __future__ import annotations

import os
from pathlib import Path
from urllib.parse import urlparse

from router_r1.pool.registry import ModelRegistry, RegistryError
from router_r1.pool.world import answer_key

LOOPBACK = ("localhost", "127.0.0.1", "::1")


def pool_problems(env_cfg) -> list[str]:
    """Readable lines for what the `env` section's pool lacks here: a missing or bad pool yaml, a world it names
    that cannot judge its models, an API key variable that is unset for a model on a remote endpoint (a local
    server needs none)."""
    pool, url = env_cfg.get("pool"), env_cfg.get("pool_url")
    try:
        registry = ModelRegistry.from_yaml(pool, base_url=url)
        if env_cfg.get("seen_only", True):
            registry = registry.seen()
        answer_key(registry, env_cfg.get("sim_seed", 0))  # what make_env builds for the stage/* metrics
    except RegistryError as e:
        return [f"env.pool: {e}"]
    unset: dict[str, int] = {}
    for m in registry.models.values():
        host = urlparse(m.base_url).hostname or ""
        if m.api_key_env and not os.environ.get(m.api_key_env) and host not in LOOPBACK and not host.startswith("127."):
            unset[m.api_key_env] = unset.get(m.api_key_env, 0) + 1
    return [f"the pool's API key: {var} is not set (env.pool={pool}: {n} models at a remote endpoint read it; "
            f"export {var}=...)" for var, n in unset.items()]


def data_command(env_cfg, directory: str) -> str:
    """The command that writes a routing run's train/val/test parquet files into `directory`: the simulated
    world's come with `bash train.sh` (its OUT/data), a real pool's questions from data_process.build_qa."""
    try:
        simulated = ModelRegistry.from_yaml(env_cfg.get("pool"), base_url=env_cfg.get("pool_url")).world is not None
    except RegistryError:  # pool_problems reports the pool itself
        simulated = False
    if simulated:
        out = Path(directory)
        return (f"SFT_ONLY=1 OUT={out.parent} bash train.sh (the simulated world's questions and the warm start)"
                if out.name == "data" else "bash train.sh writes the simulated world's questions to OUT/data")
    return (f"python -m data_process.build_qa --out-dir {directory} (the paper's NQ + HotpotQA from the hub; "
            "your own QA files: --local-dir, docs/usage.md)")
