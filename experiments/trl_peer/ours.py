"""Our side of the peer comparison: the project's GRPO (verl trainer, algorithm.adv_estimator=grpo) on the
single-turn routing task (experiments/trl_peer/task.py), writing the curve JSONL the summarizer reads.

    python -m experiments.trl_peer.ours --data ROWS.parquet --sft SFT_DIR --out DIR --seed 1 --steps 20
"""
from __future__ import annotations

import argparse
import json
from dataclasses import replace
from pathlib import Path

from router_r1.actions import STOP_STRINGS
from verl.trainer.single_turn import SingleTurnEnv, SingleTurnEnvConfig
from verl.trainer.single_turn import make_env as single_turn_env
from experiments.trl_peer.settings import PeerSettings, add_flags, curve_row, write_curve


class RouteOnceEnv(SingleTurnEnv):
    """The engine's single-turn env, its one generation ending at the first action's closing tag (as a routing
    turn does in router_r1's env); TRL's side stops at the same tokens."""

    def rollout(self, rows, generate, sampling, validate):
        return super().rollout(rows, generate, replace(sampling, stop=STOP_STRINGS), validate)

    async def rollout_async(self, rows, engine, sampling, validate):
        return await super().rollout_async(rows, engine, replace(sampling, stop=STOP_STRINGS), validate)


def make_env(env_cfg, tokenizer) -> RouteOnceEnv:
    """env.factory of our run: SingleTurnEnv's keys (env.reward_fn names task.route_reward)."""
    env = single_turn_env(env_cfg, tokenizer)
    return RouteOnceEnv(env.tokenizer, env.reward_fn, env.max_response_length)


make_env.config_class = SingleTurnEnvConfig


def overrides(s: PeerSettings, data: str, sft: str, out: str, seed: int, steps: int) -> list[str]:
    """The verl run config of one seed: every setting the two trainers share comes from `s`."""
    return [
        "env.factory=experiments.trl_peer.ours:make_env", "env.reward_fn=experiments.trl_peer.task:route_reward",
        f"data.train_files=[{data}]", "data.val_files=[]", "data.shuffle=false", "data.max_prompt_length=512",
        f"data.train_batch_size={s.prompts_per_step}", f"rollout.n={s.group_size}",
        f"rollout.temperature={s.temperature}", f"rollout.response_length={s.max_completion_length}",
        f"rollout.max_response_length={s.max_completion_length}", "rollout.name=hf",
        f"model.path={sft}", f"model.tokenizer={sft}", "model.dtype=fp32",
        "algorithm.adv_estimator=grpo", "algorithm.grpo_norm_by_std=true", "algorithm.use_kl_in_reward=false",
        f"actor.lr={s.lr}", f"actor.weight_decay={s.weight_decay}", f"actor.grad_clip={s.grad_clip}",
        "actor.warmup_steps=0", "actor.lr_schedule=constant", "actor.ppo_epochs=1",
        f"actor.ppo_mini_batch_size={s.samples_per_step}", f"actor.ppo_micro_batch_size={s.samples_per_step}",
        f"actor.clip_ratio_low={s.clip}", f"actor.clip_ratio_high={s.clip}", "actor.loss_agg_mode=token-mean",
        f"actor.use_kl_loss={'true' if s.beta else 'false'}", f"actor.kl_loss_coef={s.beta}", "actor.kl_loss_type=k3",
        "actor.entropy_coef=0.0",
        f"trainer.total_steps={steps}", f"trainer.seed={seed}", f"trainer.output_dir={out}", "trainer.resume=none",
        "trainer.save_freq=0", "trainer.export_hf=false", "trainer.device=cpu", "trainer.val_before_train=false",
        "trainer.console_every=5", "trainer.experiment_name=trl_peer_ours",
    ]


def curve(metrics_jsonl: Path, seed: int) -> list[dict]:
    """The run's per-step batch reward against samples seen, from its metrics.jsonl."""
    rows, seen = [], 0
    for line in metrics_jsonl.read_text().splitlines():
        m = json.loads(line)
        if "reward/mean" not in m:  # a validation-only row
            continue
        seen += int(m["batch/episodes"])
        rows.append(curve_row("ours", seed, int(m["step"]), seen, m["reward/mean"], m.get("timing/step")))
    return rows


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    add_flags(p)
    a = p.parse_args(argv)
    from verl.trainer.main_ppo import load_config, run  # hydra and the workers: only when training

    s = PeerSettings.from_flags(a)
    out = Path(a.out)
    run(load_config("ppo_trainer", overrides(s, a.data, a.sft, str(out / "run"), a.seed, a.steps)))
    path = write_curve(out / "curve.jsonl", curve(out / "run/metrics.jsonl", a.seed))
    print(f"curve -> {path}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
