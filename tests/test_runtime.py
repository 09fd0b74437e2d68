"""One runtime for a trained router: the env it was trained with, flags over it, one place that builds it."""
import argparse
import dataclasses
import re
from pathlib import Path

import pytest

from router_r1.flags import add_flags, from_args
from router_r1.router_env import RouterEnvConfig
from router_r1.runtime import EnvOverrides, EvalError, resolve_env, trained_env
from verl.trainer.config import save_run_config
from verl.trainer.main_ppo import load_config

ROOT = Path(__file__).resolve().parents[1]


def trained(tmp_path, name, *overrides, config="embedded"):
    """A checkpoint directory holding the run_config.yaml of configs/<config>.yaml with `overrides`."""
    save_run_config(load_config(config, list(overrides)), tmp_path / name)
    return str(tmp_path / name)


def test_one_place_builds_the_router_environment():
    """Evaluation, inference, serving, calibration and the scripts go through make_env: RouterEnv(...) is
    called in router_r1/router_env.py alone (tests aside)."""
    calls = []
    for path in [*ROOT.glob("router_r1/**/*.py"), *ROOT.glob("scripts/*.py"), ROOT / "infer.py"]:
        for i, line in enumerate(path.read_text().splitlines()):
            if re.search(r"\bRouterEnv\(", line) and not line.lstrip().startswith(("#", "class ")):
                calls.append(f"{path.relative_to(ROOT)}:{i + 1}")
    assert len(calls) == 1 and calls[0].startswith("router_r1/router_env.py:"), calls


def test_overridable_keys_are_env_keys():
    env_fields = {f.name for f in dataclasses.fields(RouterEnvConfig)}
    assert {f.name for f in dataclasses.fields(EnvOverrides)} <= env_fields
    assert all(f.default is None for f in dataclasses.fields(EnvOverrides))  # None: the run's value


def test_env_comes_from_the_run_and_a_flag_overrides_one_key(tmp_path):
    ckpt = trained(tmp_path, "a", "env.max_turns=2", "env.call_timeout_s=7", "env.invalid_hint=true")
    env = resolve_env([ckpt], EnvOverrides(max_obs_length=99), log=lambda m: None)
    assert (env.max_turns, env.max_obs_length, env.response_length, env.call_timeout_s, env.invalid_hint) == \
        (2, 99, 64, 7.0, True)  # timeouts and every other key travel with the run
    # a checkpoint without a run config (the SFT warm start) does not vote; alone, it gets the fallback's
    assert resolve_env([str(tmp_path / "sft"), ckpt], EnvOverrides(), log=lambda m: None).max_turns == 2
    bare = trained_env(tmp_path / "sft")
    assert not bare.saved and "no run_config.yaml" in bare.source
    assert bare.env.call_timeout_s == load_config("router_r1").env.call_timeout_s
    assert trained_env(tmp_path / "sft", fallback="embedded").env.max_turns == load_config("embedded").env.max_turns


def test_runs_trained_differently_need_the_flag_and_bad_values_are_named(tmp_path):
    a, b = trained(tmp_path, "a", "env.max_turns=2"), trained(tmp_path, "b", "env.max_turns=3")
    with pytest.raises(EvalError, match=r"different env\.max_turns.*--max-turns"):
        resolve_env([a, b], EnvOverrides(), log=lambda m: None)
    assert resolve_env([a, b], EnvOverrides(max_turns=1), log=lambda m: None).max_turns == 1
    with pytest.raises(EvalError, match=r"flags: env\.max_obs_length must be an integer >= 1"):
        resolve_env([a], EnvOverrides(max_obs_length=0), log=lambda m: None)


def test_flags_come_from_the_dataclass_with_defaults_and_help():
    p = argparse.ArgumentParser()
    add_flags(p, EnvOverrides)
    helps = {a.dest: a.help for a in p._actions if a.dest != "help"}
    assert set(helps) == {f.name for f in dataclasses.fields(EnvOverrides)} and all(helps.values())
    o = from_args(EnvOverrides, p.parse_args(["--max-turns", "3", "--schedule", "sync"]))
    assert o.overrides() == {"max_turns": 3, "schedule": "sync"}
    with pytest.raises(SystemExit):
        p.parse_args(["--schedule", "later"])

    @dataclasses.dataclass
    class Undocumented:
        x: int = 1

    with pytest.raises(ValueError, match="Undocumented.x has no comment"):
        add_flags(argparse.ArgumentParser(), Undocumented)
