"""Before a run loads anything: what its config needs that this machine lacks, all listed at once.

A paper run on a machine without GPUs spent 59 s on hub retries and ended in an OSError; these
checks take about a second: a CUDA GPU where the config needs one (trainer.device=cuda, or the
vLLM rollout), the vLLM package, the data files, local model files, and whatever the environment
says its own section needs (its factory's optional `preflight(env_section) -> [problems]`; the
routing environment's names the pool yaml and the pool's API key).
"""
from __future__ import annotations

import importlib.util
import os
import re
from pathlib import Path

from omegaconf import DictConfig, OmegaConf

from verl.trainer.env_interface import import_factory

_HUB_ID = re.compile(r"[\w.-]+/[\w.-]+")  # org/name; a path with more parts is a local path


class PreflightError(RuntimeError):
    """What this machine lacks for the run, one line per problem."""


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


def problems(cfg: DictConfig) -> list[str]:
    """Everything the run `cfg` needs that this machine lacks, as readable lines (empty: it can start)."""
    found = []
    t, r, d = cfg.trainer, cfg.rollout, cfg.data
    ppo = t.mode == "ppo"
    needs_gpu = t.device == "cuda" or (ppo and r.name == "vllm")
    if needs_gpu and t.backend != "ray" and not t.ray_address and _gpus() == 0:
        why = "trainer.device=cuda" if t.device == "cuda" else "rollout.name=vllm"
        found.append(f"a CUDA GPU ({why}; the config asks for trainer.n_gpus_per_node={t.n_gpus_per_node}): "
                     "torch sees none on this machine")
    if ppo and r.name == "vllm" and importlib.util.find_spec("vllm") is None:
        found.append("the vllm package (rollout.name=vllm): not installed")
    files = {"data.train_files": d.train_files, "data.val_files": d.val_files} if ppo else {"data.sft_files": d.sft_files}
    for key, paths in files.items():
        for path in paths or []:
            if not Path(path).is_file():
                found.append(f"{key}: {path} not found")
    for key in ("path", "tokenizer", "critic_path"):
        spec = cfg.model.get(key)
        problem = _model_problem(f"model.{key}", OmegaConf.to_container(spec) if OmegaConf.is_config(spec) else spec)
        if problem:
            found.append(problem)
    if ppo and cfg.env is not None and "factory" in cfg.env:
        hook = getattr(import_factory(cfg.env.factory), "preflight", None)
        if hook is not None:
            found += hook(cfg.env)
    return found


def check(cfg: DictConfig) -> None:
    """PreflightError listing every problem `problems` finds; nothing when the run can start."""
    found = problems(cfg)
    if found:
        raise PreflightError("this run cannot start on this machine; missing:\n  - " + "\n  - ".join(found))
