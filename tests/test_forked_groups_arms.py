"""Every arm of experiments/forked_groups/run.sh composes into a valid embedded config: a mistyped key in an arm's
flags would otherwise surface only when its 30-minute run starts (or, in a batch of arms, after the others)."""
import os
import subprocess
from pathlib import Path

import pytest
import yaml
from omegaconf import OmegaConf

from verl.trainer.main_ppo import load_config

ROOT = Path(__file__).resolve().parents[1]


def arms() -> dict[str, list[str]]:
    out = subprocess.run(["bash", "experiments/forked_groups/run.sh", "-", "-"], cwd=ROOT,
                         env={"ARMS": "list", "PATH": os.environ["PATH"]}, capture_output=True, text=True,
                         check=True).stdout
    return {name: flags.split() for name, flags in (line.split("\t") for line in out.splitlines())}


def parsed(value: str):
    """An override's value as hydra reads it (YAML 1.1 leaves 2e-4 a string; hydra makes it a float)."""
    v = yaml.safe_load(value)
    try:
        return float(v) if isinstance(v, str) else v
    except ValueError:
        return v


def test_the_list_holds_the_recipes_the_docs_name():
    found = arms()
    assert {"plain", "dw10", "dw10_klc_lr2", "dw10_klc_lr2_mb16", "forked"} <= set(found)
    assert "actor.ppo_mini_batch_size=16" in found["dw10_klc_lr2_mb16"]


@pytest.mark.parametrize("name", sorted(arms()))
def test_each_arm_composes(name):
    flags = arms()[name]
    cfg = load_config("embedded", ["env.alpha=0.6", "rollout.temperature=0.7", *flags])
    for flag in flags:  # each flag lands where it says (none is swallowed by a later one)
        key, value = flag.split("=", 1)
        got = OmegaConf.select(cfg, key)
        assert (OmegaConf.to_container(got) if OmegaConf.is_config(got) else got) == parsed(value), flag
