"""The peer: TRL's GRPOTrainer (the `peer` extra: pip install -e ".[peer]") on the same single-turn routing task,
model, rows, reward function and settings as experiments/trl_peer/ours.py, writing the same curve JSONL.

    python -m experiments.trl_peer.peer --data ROWS.parquet --sft SFT_DIR --out DIR --seed 1 --steps 20
"""
from __future__ import annotations

import argparse
import time
from pathlib import Path

from router_r1.actions import STOP_STRINGS
from experiments.trl_peer.settings import PeerSettings, add_flags, curve_row, write_curve
from experiments.trl_peer.task import TrlReward


def grpo_config(s: PeerSettings, out: str, seed: int, steps: int):
    """TRL's GRPOConfig with every setting the two trainers share taken from `s` (one process, CPU, fp32)."""
    from trl import GRPOConfig

    return GRPOConfig(
        output_dir=out, seed=seed, max_steps=steps, use_cpu=True, bf16=False, fp16=False,
        per_device_train_batch_size=s.samples_per_step, gradient_accumulation_steps=1, steps_per_generation=1,
        num_generations=s.group_size, num_iterations=1, shuffle_dataset=False,
        temperature=s.temperature, top_p=1.0, top_k=0, max_completion_length=s.max_completion_length,
        learning_rate=s.lr, lr_scheduler_type="constant", warmup_steps=0, weight_decay=s.weight_decay,
        max_grad_norm=s.grad_clip, adam_beta1=0.9, adam_beta2=0.999, adam_epsilon=1e-8,
        epsilon=s.clip, epsilon_high=s.clip, beta=s.beta, loss_type="dapo", scale_rewards="group",
        # TRL 1.16 multiplies the k3 term by the (differentiable) ratio by default; ours' KL loss is plain k3
        use_bias_correction_kl=False,
        mask_truncated_completions=False, gradient_checkpointing=False, disable_dropout=True,
        logging_steps=1, save_strategy="no", report_to="none", remove_unused_columns=False,
        dataloader_num_workers=0,
    )


def dataset(path: str):
    """The rows as TRL reads them: the chat `prompt` and the `reward_model` column the reward needs."""
    import pandas as pd
    from datasets import Dataset

    df = pd.read_parquet(path)
    to_list = lambda v: [to_list(x) for x in v] if hasattr(v, "tolist") and not isinstance(v, str) else v  # noqa: E731
    rows = [{"prompt": [dict(m) for m in r["prompt"]],
             "reward_model": {"ground_truth": {"target": [str(t) for t in to_list(
                 r["reward_model"]["ground_truth"]["target"])]}}} for _, r in df.iterrows()]
    return Dataset.from_list(rows)


def stop_token_ids(tokenizer) -> list[int]:
    """The end of a turn as token ids: eos and each closing action tag (one token each in the router's tokenizer)."""
    ids = [tokenizer.eos_token_id]
    for tag in STOP_STRINGS:
        tid = tokenizer(tag, add_special_tokens=False)["input_ids"]
        if len(tid) != 1:
            raise ValueError(f"{tag!r} is {len(tid)} tokens in this tokenizer: TRL can stop only at single tokens")
        ids.append(tid[0])
    return ids


def build_trainer(s: PeerSettings, data: str, sft: str, out: str, seed: int, steps: int, reward=None):
    """GRPOTrainer over the warm start; generation ends at eos or a closing action tag, as our env's does."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from trl import GRPOTrainer

    tokenizer = AutoTokenizer.from_pretrained(sft)
    model = AutoModelForCausalLM.from_pretrained(sft, dtype=torch.float32)
    model.generation_config.eos_token_id = stop_token_ids(tokenizer)  # TRL stops and masks at these
    model.generation_config.pad_token_id = tokenizer.pad_token_id
    return GRPOTrainer(model=model, reward_funcs=[reward or TrlReward()], args=grpo_config(s, out, seed, steps),
                       train_dataset=dataset(data), processing_class=tokenizer)


def curve(log_history: list[dict], seed: int, samples_per_step: int, step_s: list[float]) -> list[dict]:
    """One row per logged training step: TRL's `reward` is the mean over the step's generation batch."""
    logs = [m for m in log_history if "reward" in m and "step" in m]
    return [curve_row("trl", seed, int(m["step"]), int(m["step"]) * samples_per_step, m["reward"],
                      step_s[i] if i < len(step_s) else None) for i, m in enumerate(logs)]


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    add_flags(p)
    a = p.parse_args(argv)
    from transformers import TrainerCallback

    class StepClock(TrainerCallback):  # seconds per optimizer step, generation included
        def __init__(self):
            self.times, self.t0 = [], None

        def on_step_begin(self, args, state, control, **kw):
            self.t0 = time.perf_counter()

        def on_step_end(self, args, state, control, **kw):
            self.times.append(time.perf_counter() - self.t0)

    s = PeerSettings.from_flags(a)
    out = Path(a.out)
    trainer = build_trainer(s, a.data, a.sft, str(out / "run"), a.seed, a.steps)
    clock = StepClock()
    trainer.add_callback(clock)
    trainer.train()
    path = write_curve(out / "curve.jsonl", curve(trainer.state.log_history, a.seed, s.samples_per_step, clock.times))
    print(f"curve -> {path}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
