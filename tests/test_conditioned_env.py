"""experiments/alpha_tradeoff/conditioned_env.py: an SFT run's config (env: null) gets the embedded recipe's env with
the conditioned alphas, so that evaluation tells the checkpoint its alpha (the CPU and H200 alpha scripts use it)."""
import yaml

from experiments.alpha_tradeoff.conditioned_env import main
from router_r1.runtime import trained_env


def test_sft_config_gets_the_alphas_evaluation_reads(tmp_path):
    cfg = tmp_path / "run_config.yaml"
    cfg.write_text(yaml.safe_dump({"env": None, "trainer": {"total_steps": 3}}))
    assert trained_env(tmp_path).env.alphas in (None, [], ())  # before: not a conditioned router
    main([str(cfg), "configs/pool/sim_tradeoff.yaml", "0", "0.3", "0.9"])
    run = yaml.safe_load(cfg.read_text())
    assert run["trainer"] == {"total_steps": 3}  # the rest of the config kept
    env = trained_env(tmp_path).env
    assert list(env.alphas) == [0.0, 0.3, 0.9] and env.pool == "configs/pool/sim_tradeoff.yaml"
