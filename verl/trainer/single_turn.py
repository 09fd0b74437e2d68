"""The simplest environment: one generation per prompt, scored by a rule.

It is the engine's own smoke-test task and the template for new environments. The
reward function is named in the config (`env.reward_fn: module:function`) and called as
`fn(response_text, row_fields) -> float`.
"""
from __future__ import annotations

import asyncio
import importlib
from dataclasses import dataclass

import numpy as np
from omegaconf import II

from verl.trainer.config import section_to_dataclass
from verl.trainer.env_interface import GenerateFn, RolloutResult
from verl.workers.rollout.base import SamplingParams


def target_char_reward(text: str, fields: dict) -> float:
    """Share of non-space characters equal to the row's `target_char` (default "a")."""
    target = (fields.get("target_char") or "a")[0]
    chars = [c for c in text if not c.isspace()]
    return sum(c == target for c in chars) / max(1, len(chars))


class SingleTurnEnv:
    def __init__(self, tokenizer, reward_fn, max_response_length: int):
        self.tokenizer = tokenizer
        self.reward_fn = reward_fn
        self.max_response_length = max_response_length

    def rollout(self, rows, generate: GenerateFn, sampling: SamplingParams, validate: bool) -> RolloutResult:
        return self._result([r.prompt_ids for r in rows], generate([r.prompt_ids for r in rows], sampling), sampling)

    async def rollout_async(self, rows, engine, sampling: SamplingParams, validate: bool) -> RolloutResult:
        """The same episodes through an engine's async `generate_one` (streaming rollouts play groups so)."""
        outs = await asyncio.gather(*(engine.generate_one(list(r.prompt_ids), sampling) for r in rows))
        return self._result([r.prompt_ids for r in rows], list(outs), sampling)

    def _result(self, prompts, outs, sampling: SamplingParams) -> RolloutResult:
        responses = [o.token_ids[: self.max_response_length] for o in outs]
        info = {"finish_reason": [o.finish_reason for o in outs]}
        if sampling.return_logprobs:  # the sampling engine's own log-probs (off-policy training reads them)
            info["rollout_log_probs"] = [o.logprobs[: len(r)] for o, r in zip(outs, responses)]
        return RolloutResult(prompts, responses, [[1] * len(r) for r in responses], info=info)

    def score(self, result: RolloutResult, rows, validate: bool):
        texts = self.tokenizer.batch_decode(result.response_ids, skip_special_tokens=True)
        scores = np.array([self.reward_fn(t, r.fields) for t, r in zip(texts, rows)], dtype=np.float32)
        return scores, {"reward": scores.tolist(), "response_length": [len(r) for r in result.response_ids]}

    def state_dict(self) -> dict:
        return {}

    def load_state_dict(self, state: dict) -> None:
        pass


@dataclass
class SingleTurnEnvConfig:
    """`env` of the engine's own one-turn task (configs/env/single_turn.yaml): the smoke default."""

    factory: str = "verl.trainer.single_turn:make_env"  # "module:function" the engine calls with (env section, tokenizer)
    reward_fn: str = "verl.trainer.single_turn:target_char_reward"  # "module:function" (text, row fields) -> score
    max_response_length: int = II("rollout.response_length")  # tokens of the one response


def make_env(env_cfg, tokenizer) -> SingleTurnEnv:
    """Factory named by `env.factory` in the trainer config."""
    cfg = section_to_dataclass(SingleTurnEnvConfig, env_cfg, "env")
    module_name, _, attr = cfg.reward_fn.partition(":")
    fn = getattr(importlib.import_module(module_name), attr)
    return SingleTurnEnv(tokenizer, fn, cfg.max_response_length)


make_env.config_class = SingleTurnEnvConfig
