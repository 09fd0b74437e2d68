"""Give an SFT run's config (it has env: null) the embedded recipe's env on POOL with env.alphas=ALPHAS, so that
evaluation tells the conditioned router its alpha (router_r1.eval.evaluate.conditioned_alpha).

    python -m experiments.alpha_tradeoff.conditioned_env RUN_CONFIG POOL ALPHA...
"""
from __future__ import annotations

import argparse

import yaml
from omegaconf import OmegaConf

from verl.trainer.main_ppo import load_config


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("run_config", help="the SFT run's run_config.yaml, rewritten in place")
    p.add_argument("pool", help="the pool yaml the router is evaluated on")
    p.add_argument("alphas", type=float, nargs="+", help="the alphas it was trained on")
    a = p.parse_args(argv)
    with open(a.run_config) as f:
        run = yaml.safe_load(f)
    run["env"] = {**OmegaConf.to_container(load_config("embedded").env, resolve=True), "pool": a.pool,
                  "alphas": a.alphas}
    with open(a.run_config, "w") as f:
        yaml.safe_dump(run, f, sort_keys=False)


if __name__ == "__main__":
    main()
