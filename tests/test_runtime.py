"""One runtime for a trained router: the env it was trained with, flags over it, one place that builds it."""
import argparse
import dataclasses
import re
import sys
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
    for path in [*ROOT.glob("router_r1/**/*.py"), *ROOT.glob("tools/**/*.py"), ROOT / "infer.py"]:
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


def test_the_in_process_pool_serves_the_world_its_yaml_names():
    """--sim (and no pool at all) serves the pool yaml's world in-process; a pool naming none is refused, named."""
    from router_r1.pool.client import RouteRequest
    from router_r1.pool.registry import RegistryError
    from router_r1.runtime import open_pool

    with open_pool(sim_seed=1) as pool:
        assert pool.full.world == "sim" and "(seed 1)" in pool.where
        [reply] = pool.client.route([RouteRequest(pool.registry.names[0], "What is the weather like?")])
        assert reply.ok and "can't tell what you are asking" in reply.text  # the world's experts answer
    paper = ROOT / "configs" / "pool" / "paper.yaml"
    with pytest.raises(RegistryError, match=f"{paper}: --sim needs a simulated pool.*names no world"):
        with open_pool(paper, sim=True):
            pass


def test_the_docs_infer_questions_are_about_the_simulated_world():
    """The embedded pool answers questions about its made-up world: the examples must name its entities and a
    relation it knows (a name outside it made the router invent an answer)."""
    from sim.world import SimWorld

    world = SimWorld(seed=0)
    asked = [q for doc in ("README.md", "docs/usage.md", "infer.py")
             for q in re.findall(r'infer\.py --question "([^".][^"]*)"', (ROOT / doc).read_text())]
    assert len(asked) >= 3
    for q in asked:
        assert world.parse(q) is not None, q


def _entry_points() -> list[Path]:
    """Every file of ours that builds an argparse parser (the CLIs and scripts): by hand, from a settings dataclass
    (router_r1/flags.py) or through a shared parser (a benchmark's workload_parser)."""
    files = [*ROOT.glob("router_r1/**/*.py"), *ROOT.glob("data_process/*.py"), *ROOT.glob("gramma/*.py"),
             *ROOT.glob("verl/**/*.py"), *ROOT.glob("tools/**/*.py"), *ROOT.glob("sim/**/*.py"), ROOT / "infer.py"]
    builds = re.compile(r"ArgumentParser\(|parser_for\(|add_flags\(|_parser\(")
    return sorted(f for f in files if builds.search(f.read_text()) and f.name != "flags.py")


@pytest.mark.parametrize("path", _entry_points(), ids=lambda p: str(p.relative_to(ROOT)))
def test_every_flag_of_every_entry_point_has_help(path, monkeypatch):
    """Issue 28.12: `--help` explains each flag (infer.py's --question, --seed, --device had none)."""
    import importlib.util

    class Built(Exception):
        pass

    def grab(parser, *args, **kwargs):
        raise Built(parser)

    monkeypatch.setattr(argparse.ArgumentParser, "parse_args", grab)
    monkeypatch.setattr(argparse.ArgumentParser, "parse_known_args", grab)
    spec = importlib.util.spec_from_file_location(f"entry_{path.stem}", path)
    module = importlib.util.module_from_spec(spec)
    monkeypatch.setitem(sys.modules, spec.name, module)  # dataclasses look their module up
    with pytest.raises(Built) as built:
        spec.loader.exec_module(module)  # a script may build its parser at import
        build = getattr(module, "main", None) or getattr(module, "parse_args", None) or getattr(module, "_parse_args")
        try:
            build([])
        except TypeError:  # a main() that reads sys.argv itself
            build()
    parser = built.value.args[0]
    bare = [a.option_strings or [a.dest] for a in parser._actions
            if not isinstance(a, argparse._HelpAction) and not (a.help or "").strip()]
    assert not bare, f"{path.relative_to(ROOT)}: flags without help: {bare}"
