"""The interface between the engine and an environment (routing, search, a graph, ...).

The trainer hands an environment a batch of prompts and a `generate` function; the
environment runs its episodes (one turn or many) and returns token lists plus a
`response_mask` that is 1 exactly on the tokens the policy wrote. It also scores the
finished trajectories. The engine knows nothing else about the task.
"""
from __future__ import annotations

import importlib
from dataclasses import dataclass, field
from typing import Any, Callable, Protocol

import numpy as np

from verl.workers.rollout.base import GenOutput, SamplingParams

GenerateFn = Callable[[list[list[int]], SamplingParams], list[GenOutput]]


@dataclass
class RolloutResult:
    """Finished episodes, one entry per trajectory, in the order of the prompts."""

    prompt_ids: list[list[int]]
    response_ids: list[list[int]]
    response_mask: list[list[int]]  # 1 = written by the policy, 0 = written by the environment
    info: dict[str, list[Any]] = field(default_factory=dict)  # per-trajectory extras (cost, turns, text)

    def __post_init__(self):
        n = len(self.prompt_ids)
        for name, col in [("response_ids", self.response_ids), ("response_mask", self.response_mask),
                          *self.info.items()]:
            if len(col) != n:
                raise ValueError(f"RolloutResult.{name} has {len(col)} rows, expected {n}")


def pick_episodes(results: list[RolloutResult], idx: list[int]) -> RolloutResult:
    """Episodes `idx` of `results` laid end to end."""
    def column(get) -> list:
        flat = [x for r in results for x in get(r)]
        return [flat[i] for i in idx]

    return RolloutResult(column(lambda r: r.prompt_ids), column(lambda r: r.response_ids),
                         column(lambda r: r.response_mask),
                         {k: column(lambda r, k=k: r.info[k]) for k in results[0].info})


class Env(Protocol):
    def rollout(self, rows: list, generate: GenerateFn, sampling: SamplingParams,
                validate: bool) -> RolloutResult: ...

    def score(self, result: RolloutResult, rows: list, validate: bool) -> tuple[np.ndarray, dict[str, list]]:
        """Scores (batch,) and per-trajectory metrics (name -> list of numbers)."""

    def state_dict(self) -> dict: ...

    def load_state_dict(self, state: dict) -> None: ...

    # Optional: `check_row(fields) -> str | None`, why a data row cannot be used; PromptDataset
    # runs it on every row at load time (main_ppo passes it when the env has one).
    # Optional: `check_run()`, called once after training finished and printed its table; raises to
    # fail a run whose result cannot be trusted (the routing env: its pool calls mostly failed).


def import_factory(factory: str) -> Callable:
    """The function a "package.module:function" string names; ValueError naming it otherwise."""
    module_name, _, attr = str(factory).partition(":")
    if not attr:
        raise ValueError(f"env.factory must look like 'package.module:function', got {factory!r}")
    try:
        return getattr(importlib.import_module(module_name), attr)
    except (ImportError, AttributeError) as e:
        raise ValueError(f"env.factory {factory!r} cannot be imported: {e}") from e


def load_env(factory: str, env_cfg: Any, tokenizer) -> Env:
    """Import "package.module:function" and call it with (env_cfg, tokenizer)."""
    return import_factory(factory)(env_cfg, tokenizer)
