"""Before a run loads anything: what its config needs that this machine lacks, all listed at once.

A paper run on a machine without GPUs spent 59 s on hub retries and ended in an OSError; these
checks take about a second: the CUDA GPUs the launch will use where the config needs them (trainer.device=cuda,
or the vLLM rollout) and that an SPMD launch has a process per GPU it asks for, the vLLM and Ray packages, each
logger's package, the data files (with the command that builds them, where the environment knows it), local
model files, and whatever the environment says its own section needs (its factory's optional
`preflight(env_section) -> [problems]`; the routing environment's names the pool yaml and the pool's API key).
An unknown trainer.logger name is refused here too, naming the allowed ones.
"""
from __future__ import annotations

import importlib.util
import os
import re
from pathlib import Path

from omegaconf import DictConfig, OmegaConf

from verl.trainer.env_interface import import_factory
from verl.trainer.tracking import missing_logger_packages, unknown_loggers

_HUB_ID = re.compile(r"[\w.-]+/[\w.-]+")  # org/name; a path with more parts is a local path


class PreflightError(RuntimeError):
    """What this machine lacks for the run, one line per problem (or the config error that stops it first)."""


def _gpus() -> int:
    import torch

    return torch.cuda.device_count()


def _model_problem(key: str, spec) -> str | None:
    """Why a model.* entry cannot load here, or None (hub ids are not fetched: only offline mode is checked)."""
    if not isinstance(spec, str) or spec == "tiny" or os.path.exists(spec):
        return None
    if spec.endswith((".json", ".gguf")) or not _HUB_ID.fullmatch(spec):
        return f"{key}={spec}: no such file or directory"
    if os.environ.get("HF_HUB_OFFLINE", "").lower() in ("1", "true", "yes"):
        from huggingface_hub import try_to_load_from_cache

        if not isinstance(try_to_load_from_cache(spec, "config.json"), str):
            return f"{key}={spec}: not in the hub cache and HF_HUB_OFFLINE is set"
    return None


def _gpu_problems(cfg: DictConfig) -> list[str]:
    """The GPUs this launch uses, against those torch sees here. Ray started here (no trainer.ray_address, one
    node) places trainer.n_gpus_per_node workers on this machine; an SPMD launch (plain python, torchrun) uses one
    GPU per process and reads no n_gpus_per_node, so fewer processes than it asks for would leave GPUs idle."""
    from verl.trainer.main_ppo import pick_backend  # main_ppo imports this module

    t, r = cfg.trainer, cfg.rollout
    if t.ray_address:  # a running cluster's GPUs are not this machine's
        return []
    have = _gpus()
    why = ("trainer.device=cuda" if t.device == "cuda" else "rollout.name=vllm" if t.mode == "ppo" and r.name == "vllm"
           else "trainer.device=auto" if t.device == "auto" and have > 0 else None)
    if why is None:  # a CPU run
        return []
    backend, asked = pick_backend(cfg), t.nnodes * t.n_gpus_per_node
    found = []
    if backend == "ray":
        if t.nnodes > 1:  # the placement fails at once, naming both numbers, when the nodes are not there
            return []
        need, launch = t.n_gpus_per_node, f"trainer.backend=ray, trainer.n_gpus_per_node={t.n_gpus_per_node}"
    else:
        world = int(os.environ.get("WORLD_SIZE", "1"))
        need = int(os.environ.get("LOCAL_WORLD_SIZE", str(world)))
        launch = f"spmd: {world} process{'es' if world > 1 else ''}, one GPU each"
        if world < asked:
            procs = f"{world} process{'es' if world > 1 else ''}"
            found.append(f"trainer.n_gpus_per_node={t.n_gpus_per_node} (x trainer.nnodes={t.nnodes}) asks for {asked} "
                         f"GPUs, but this launch is {procs} (spmd: one GPU each), so {asked - world} would sit idle: "
                         f"launch with Ray (trainer.backend=ray, as `bash train.sh paper` does), with "
                         f"`torchrun --nproc_per_node {t.n_gpus_per_node}`, or set trainer.n_gpus_per_node={world}")
    if have < need:
        found.insert(0, f"{'a CUDA GPU' if need == 1 else f'{need} CUDA GPUs'} ({why}; {launch}): torch sees "
                        f"{have or 'none'} on this machine")
    return found


def _data_problems(cfg: DictConfig, hook) -> list[str]:
    """A line per missing data file; `hook(env_section, directory)`, where the environment has one, names the
    command that builds a directory's files."""
    d = cfg.data
    files = ({"data.train_files": d.train_files, "data.val_files": d.val_files} if cfg.trainer.mode == "ppo"
             else {"data.sft_files": d.sft_files})
    found, commands = [], {}
    for key, paths in files.items():
        for path in paths or []:
            if Path(path).is_file():
                continue
            directory = str(Path(path).parent)
            if hook is not None and directory not in commands:
                commands[directory] = hook(cfg.env, directory)
            how = commands.get(directory)
            found.append(f"{key}: {path} not found" + (f" (build it: {how})" if how else ""))
    return found


def problems(cfg: DictConfig) -> list[str]:
    """Everything the run `cfg` needs that this machine lacks, as readable lines (empty: it can start)."""
    from verl.trainer.main_ppo import pick_backend

    t, r = cfg.trainer, cfg.rollout
    ppo = t.mode == "ppo"
    factory = import_factory(cfg.env.factory) if ppo and cfg.env is not None and "factory" in cfg.env else None
    found = _gpu_problems(cfg)
    if ppo and r.name == "vllm" and importlib.util.find_spec("vllm") is None:
        found.append("the vllm package (rollout.name=vllm): not installed; pip install -e '.[vllm]' (docs/setup.md)")
    if pick_backend(cfg) == "ray" and importlib.util.find_spec("ray") is None:
        found.append("the ray package (trainer.backend=ray): not installed; pip install -e '.[ray]'")
    found += missing_logger_packages(t.logger)
    found += _data_problems(cfg, getattr(factory, "data_command", None))
    for key in ("path", "tokenizer", "critic_path"):
        spec = cfg.model.get(key)
        problem = _model_problem(f"model.{key}", OmegaConf.to_container(spec) if OmegaConf.is_config(spec) else spec)
        if problem:
            found.append(problem)
    hook = getattr(factory, "preflight", None)
    if hook is not None:
        found += hook(cfg.env)
    return found


def check(cfg: DictConfig) -> None:
    """PreflightError listing every problem `problems` finds; nothing when the run can start. An unknown
    logger name is a config error of its own, raised first."""
    unknown = unknown_loggers(cfg.trainer.logger)
    if unknown:
        raise PreflightError(unknown)
    found = problems(cfg)
    if found:
        raise PreflightError("this run cannot start on this machine; missing:\n  - " + "\n  - ".join(found))
