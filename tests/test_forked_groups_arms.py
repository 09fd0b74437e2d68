"""Every arm of experiments/forked_groups/run.sh composes into a valid embedded config: a mistyped key in an arm's
flags would otherwise surface only when its 30-minute run starts (or, in a batch of arms, after the others)."""
import functools
import os
import subprocess
from pathlib import Path

import pytest
from hydra.core.override_parser.overrides_parser import OverridesParser
from omegaconf import OmegaConf

from verl.trainer.main_ppo import load_config

ROOT = Path(__file__).resolve().parents[1]


@functools.cache  # one bash run for the whole module, not one a case
def arms() -> dict[str, list[str]]:
    out = subprocess.run(["bash", "experiments/forked_groups/run.sh", "-", "-"], cwd=ROOT,
                         env={"ARMS": "list", "PATH": os.environ["PATH"]}, capture_output=True, text=True,
                         check=True).stdout
    return {name: flags.split() for name, flags in (line.split("\t") for line in out.splitlines())}


def test_the_list_holds_the_recipes_the_docs_name():
    found = arms()
    assert {"plain", "dw10", "dw10_klc_lr2", "dw10_klc_lr2_mb16", "forked"} <= set(found)
    assert "actor.ppo_mini_batch_size=16" in found["dw10_klc_lr2_mb16"]


@pytest.mark.parametrize("name", sorted(arms()))
def test_each_arm_composes(name):
    flags = arms()[name]
    cfg = load_config("embedded", ["env.alpha=0.6", "rollout.temperature=0.7", *flags])
    for override in OverridesParser.create().parse_overrides(flags):  # each lands where it says, none swallowed
        got = OmegaConf.select(cfg, override.key_or_group)
        assert (OmegaConf.to_container(got) if OmegaConf.is_config(got) else got) == override.value(), override


def test_a_missing_warm_start_is_refused_before_anything_is_made(tmp_path):
    out = tmp_path / "out"
    run = subprocess.run(["bash", "experiments/forked_groups/run.sh", str(tmp_path / "nowhere"), str(out)], cwd=ROOT,
                         env={"PATH": os.environ["PATH"]}, capture_output=True, text=True)
    assert run.returncode == 2 and "nowhere/sft: no warm start there" in run.stderr
    assert not out.exists()
