"""Give an SFT run's config (it has env: null) the embedded recipe's env on POOL with env.alphas=ALPHAS, so that
evaluation tells the conditioned router its alpha (router_r1.eval.evaluate.conditioned_alpha). Read from stdin, so
the repository root (the working directory) is on sys.path:

    python - RUN_CONFIG POOL ALPHA... < docs/results/alpha_tradeoff/conditioned_env.py
"""
import sys

import yaml
from omegaconf import OmegaConf

from verl.trainer.main_ppo import load_config

path, pool, alphas = sys.argv[1], sys.argv[2], [float(a) for a in sys.argv[3:]]
run = yaml.safe_load(open(path))
run["env"] = {**OmegaConf.to_container(load_config("embedded").env, resolve=True), "pool": pool, "alphas": alphas}
yaml.safe_dump(run, open(path, "w"), sort_keys=False)
