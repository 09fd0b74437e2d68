"""docs/results/alpha_tradeoff/conditioned_env.py: an SFT run's config (env: null) gets the embedded recipe's env with
the conditioned alphas, so that evaluation tells the checkpoint its alpha (the CPU and H200 alpha scripts use it)."""
import subprocess
import sys
from pathlib import Path

import yaml

from router_r1.runtime import trained_env

ROOT = Path(__file__).resolve().parents[1]
HELPER = ROOT / "docs/results/alpha_tradeoff/conditioned_env.py"


def test_sft_config_gets_the_alphas_evaluation_reads(tmp_path):
    cfg = tmp_path / "run_config.yaml"
    cfg.write_text(yaml.safe_dump({"env": None, "trainer": {"total_steps": 3}}))
    assert trained_env(tmp_path).env.alphas in (None, [], ())  # before: not a conditioned router
    with open(HELPER) as f:
        subprocess.run([sys.executable, "-", str(cfg), "configs/pool/sim_tradeoff.yaml", "0", "0.3", "0.9"],
                       stdin=f, cwd=ROOT, check=True)
    run = yaml.safe_load(cfg.read_text())
    assert run["trainer"] == {"total_steps": 3}  # the rest of the config kept
    env = trained_env(tmp_path).env
    assert list(env.alphas) == [0.0, 0.3, 0.9] and env.pool == "configs/pool/sim_tradeoff.yaml"
