"""The settings both trainers of the peer comparison share (one home: PeerSettings) and the curve JSONL they write.

`python -m experiments.trl_peer.settings` prints the settings as each trainer spells them.
"""
from __future__ import annotations

import argparse
import gzip
import json
from dataclasses import asdict, dataclass, fields
from pathlib import Path

CURVE_KEYS = ("trainer", "seed", "step", "samples", "reward", "step_s")  # one line per optimizer step


@dataclass(frozen=True)
class PeerSettings:
    """One comparison's settings; each is passed to both trainers (ours.overrides, peer.grpo_config)."""

    group_size: int = 4  # samples per prompt: rollout.n / num_generations
    prompts_per_step: int = 16  # prompts per optimizer step (x group_size samples)
    temperature: float = 1.0  # sampling temperature; both score log-probs at it. At the embedded default's 0.7 the warm start already scores ~0.85 and most groups carry no signal
    max_completion_length: int = 64  # tokens of the one route: rollout.response_length / max_completion_length
    lr: float = 1e-3  # AdamW lr, constant, no warmup (a seed-0 pilot at the embedded default's 1e-4 moved neither trainer in 1,280 samples)
    beta: float = 0.1  # k3 KL to the warm start in the loss: actor.kl_loss_coef / beta (the embedded default's)
    clip: float = 0.2  # PPO clip epsilon, both sides: actor.clip_ratio_low/high / epsilon
    grad_clip: float = 1.0  # max gradient norm: actor.grad_clip / max_grad_norm
    weight_decay: float = 0.0  # AdamW weight decay (0: the trainers pick decayed parameters by different rules)

    @property
    def samples_per_step(self) -> int:
        return self.group_size * self.prompts_per_step

    @classmethod
    def from_flags(cls, args: argparse.Namespace) -> "PeerSettings":
        return cls(**{f.name: getattr(args, f.name) for f in fields(cls)})


def add_flags(p: argparse.ArgumentParser) -> None:
    """The drivers' common flags: data, warm start, output, seed, steps, and one per PeerSettings field."""
    p.add_argument("--data", required=True, help="training rows (python -m experiments.trl_peer.task)")
    p.add_argument("--sft", required=True, help="the warm start: an HF model dir with its tokenizer")
    p.add_argument("--out", required=True, help="run directory; its curve.jsonl is what the summarizer reads")
    p.add_argument("--seed", type=int, default=1, help="sampling seed")
    p.add_argument("--steps", type=int, default=20, help="optimizer steps")
    for f in fields(PeerSettings):
        p.add_argument(f"--{f.name.replace('_', '-')}", type=type(f.default), default=f.default)


def curve_row(trainer: str, seed: int, step: int, samples: int, reward: float, step_s: float | None) -> dict:
    """One step of a run: the mean reward of the batch it trained on, after `samples` samples in all."""
    return {"trainer": trainer, "seed": seed, "step": step, "samples": samples, "reward": float(reward),
            "step_s": None if step_s is None else round(float(step_s), 3)}


def write_curve(path: Path, rows: list[dict]) -> Path:
    if not rows:
        raise ValueError(f"{path}: the run logged no training step")
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def read_curve(path: Path) -> list[dict]:
    """A curve.jsonl (or .jsonl.gz, as records keep it); ValueError naming the file and line of a row without the
    curve's keys."""
    path = Path(path)
    text = gzip.decompress(path.read_bytes()).decode() if path.suffix == ".gz" else path.read_text()
    rows = []
    for i, line in enumerate(text.splitlines(), 1):
        row = json.loads(line)
        missing = [k for k in CURVE_KEYS if k not in row]
        if missing:
            raise ValueError(f"{path}:{i}: missing {', '.join(missing)}")
        rows.append(row)
    return rows


def main(argv: list[str] | None = None) -> int:
    argparse.ArgumentParser(description=__doc__.split("\n\n")[0]).parse_args(argv)
    for k, v in asdict(PeerSettings()).items():
        print(f"{k}: {v}")
    print(f"samples_per_step: {PeerSettings().samples_per_step}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
