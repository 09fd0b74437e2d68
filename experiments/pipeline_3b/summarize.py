"""Summarise experiments/pipeline_3b/run.sh: per schedule, tokens per second per GPU in NeMo-RL's unit and the
step's mean time split, from the runs' metrics JSONL (the trainer's batch/* and timing/* keys), as OUT/summary.md
and OUT/summary.json.

    python -m experiments.pipeline_3b.summarize OUT [--runs sync stream] [--skip 2] [--steps 6] [--gpus 1]

Tokens counted: every real token of the batch each step trained on (batch/tokens: its attention mask's sum, so
prompt tokens, the policy's generated tokens and the pool's <information> tokens, no padding; episodes a streaming
run dropped are not in it), over that step's wall time (timing/step: rollout, weight copy and update), averaged
over the steps after the first --skip (warm-up and compilation) up to --steps (run.sh polls the log and stops a
run at STEPS rows; a step that finishes while the stop is on its way is logged but not counted).
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path

# The split, in the order of a step; each is a trainer key (or one derived from them, said in its label).
ROLLOUT = [("weight_sync", "timing/weight_sync"), ("decode", "timing/decode"), ("pool_wait", "timing/env_wait")]
TRAIN = [("old_log_prob", "timing/old_log_prob"), ("ref", "timing/ref"), ("values", "timing/values"),
         ("adv", "timing/adv"), ("update_critic", "timing/update_critic"), ("update_actor", "timing/update_actor")]
REQUIRED = ("timing/step", "batch/tokens", "batch/prompt_tokens", "batch/episodes", "timing/rollout_wait",
            "timing/train", *(k for _, k in ROLLOUT + TRAIN))
LABELS = {"rollout_wait": "rollout (all)", "weight_sync": "weight copy", "decode": "decode",
          "pool_wait": "pool wait", "rollout_other": "rollout other", "old_log_prob": "old log-probs",
          "ref": "reference", "values": "values", "adv": "advantages", "update_critic": "critic update",
          "update_actor": "actor update", "train_other": "train other", "step_other": "step other"}
EXTRA = ("route_count/mean", "pool/calls/mean", "pool/latency_p50_s/mean", "response_length/mean",
         "stream/dropped_total", "stream/staleness_mean")


class MetricsError(ValueError):
    """A metrics file that cannot be summarised; the message names the file (and line or step)."""


def read_steps(path: Path) -> list[dict]:
    """The training rows of a metrics JSONL, each checked for the keys the summary reads. A last line without
    its newline (the run was stopped while writing it) is dropped; any other line that is not a JSON object is
    an error naming the file and line."""
    if not path.is_file():
        raise MetricsError(f"{path}: no such metrics file (did the run start? see its .log beside it)")
    text = path.read_text()
    lines = text.split("\n")
    rows = []
    for i, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
        except json.JSONDecodeError as e:
            if i == len(lines):  # no newline after it: cut by the stop
                continue
            raise MetricsError(f"{path}:{i}: not a JSON line ({e.msg})") from None
        if not isinstance(row, dict):
            raise MetricsError(f"{path}:{i}: a metrics row must be a JSON object, got {type(row).__name__}")
        if "timing/step" in row:
            missing = [k for k in REQUIRED if not isinstance(row.get(k), (int, float))]
            if missing:
                raise MetricsError(f"{path}:{i} (step {row.get('step')}): no number for {', '.join(missing)}")
            rows.append(row)
    return rows


def summarize_run(rows: list[dict], skip: int, gpus: int, where: str, steps: int | None = None) -> dict:
    """Tokens/s/GPU and the mean time split (seconds) over rows skip+1 .. steps (all when steps is None)."""
    counted = rows[skip:steps]
    if not counted:
        raise MetricsError(f"{where}: {len(rows)} training steps; the summary skips the first {skip}, none is left")
    mean = lambda f: statistics.fmean(f(r) for r in counted)  # noqa: E731
    split = {"rollout_wait": mean(lambda r: r["timing/rollout_wait"])}
    for name, key in ROLLOUT:
        split[name] = mean(lambda r: r[key])
    split["rollout_other"] = mean(lambda r: r["timing/rollout_wait"] - sum(r[k] for _, k in ROLLOUT))
    for name, key in TRAIN:
        split[name] = mean(lambda r: r[key])
    split["train_other"] = mean(lambda r: r["timing/train"] - sum(r[k] for _, k in TRAIN))
    split["step_other"] = mean(lambda r: r["timing/step"] - r["timing/rollout_wait"] - r["timing/train"])
    tokens = sum(r["batch/tokens"] for r in counted)
    prompt = sum(r["batch/prompt_tokens"] for r in counted)
    episodes = sum(r["batch/episodes"] for r in counted)
    seconds = sum(r["timing/step"] for r in counted)
    out = {"steps": len(rows), "counted_steps": [r.get("step") for r in counted],
           "tokens_per_s_per_gpu": mean(lambda r: r["batch/tokens"] / r["timing/step"]) / gpus,
           "tokens_per_s_per_gpu_pooled": tokens / seconds / gpus,
           "step_s": seconds / len(counted), "tokens": tokens, "prompt_tokens": prompt,
           "response_tokens": tokens - prompt, "episodes": episodes,
           "prompt_tokens_per_episode": prompt / episodes, "response_tokens_per_episode": (tokens - prompt) / episodes,
           "split_s": split}
    for key in EXTRA:
        vals = [r[key] for r in counted if isinstance(r.get(key), (int, float))]
        if vals:
            out[key] = statistics.fmean(vals)
    return out


def summarize(root: Path, runs: list[str], skip: int, gpus: int, steps: int | None = None) -> dict:
    """Every run that can be summarised; the others' errors (each naming its file) under "errors"."""
    out = {"skip": skip, "max_steps": steps, "gpus": gpus, "runs": {}, "errors": {}}
    for name in runs:
        path = root / name / "metrics.jsonl"
        try:
            out["runs"][name] = summarize_run(read_steps(path), skip, gpus, str(path), steps)
        except MetricsError as e:
            out["errors"][name] = str(e)
            continue
        peak = root / name / "gpu_peak_mib.txt"
        if peak.is_file() and peak.read_text().strip():
            out["runs"][name]["gpu_peak_mib"] = float(peak.read_text())
    meta = root / "pipeline_3b.json"  # run.sh's copy of the model's build summary
    if meta.is_file():
        out["model"] = json.loads(meta.read_text())
    return out


def markdown(summary: dict) -> str:
    runs = summary["runs"]
    head = ["schedule", "steps counted", "step s", "tokens/step", "tokens/s/GPU", "(pooled)"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for name, r in runs.items():
        lines.append(f"| {name} | {len(r['counted_steps'])} of {r['steps']} | {r['step_s']:.2f} | "
                     f"{r['tokens'] / len(r['counted_steps']):,.0f} | {r['tokens_per_s_per_gpu']:,.0f} | "
                     f"{r['tokens_per_s_per_gpu_pooled']:,.0f} |")
    lines += ["", "Mean seconds per step (the rollout's parts and the training passes add up to their totals; "
              "'other' is the remainder):", ""]
    lines += ["| part | " + " | ".join(runs) + " |", "|---|" + "---|" * len(runs)]
    parts = ["rollout_wait"] + [n for n, _ in ROLLOUT] + ["rollout_other"] + [n for n, _ in TRAIN] + [
        "train_other", "step_other"]
    for part in parts:
        label = LABELS[part] if part in ("rollout_wait", "step_other") else f"- {LABELS[part]}"
        lines.append(f"| {label} | " + " | ".join(f"{r['split_s'][part]:.2f}" for r in runs.values()) + " |")
    lines.append("| step | " + " | ".join(f"{r['step_s']:.2f}" for r in runs.values()) + " |")
    lines += ["", "Per episode: " + "; ".join(
        f"{name} {r['prompt_tokens_per_episode']:.0f} prompt + {r['response_tokens_per_episode']:.0f} response "
        f"tokens, {r.get('route_count/mean', float('nan')):.2f} routes" for name, r in runs.items())]
    peaks = [f"{name} {r['gpu_peak_mib'] / 1024:.1f} GiB" for name, r in runs.items() if "gpu_peak_mib" in r]
    if peaks:
        lines.append("Peak GPU memory (nvidia-smi, 1 s samples): " + "; ".join(peaks))
    for name, error in summary["errors"].items():
        lines.append(f"Not summarised: {name}: {error}")
    m = summary.get("model")
    if m:
        lines.append(f"Model: {m['shape']}, {m['params'] / 1e9:.2f}B parameters (random init), vocabulary "
                     f"{m['vocab']:,}, {m['action_tokens']:,} whole-action ids (1 in {m['turn_tokens']}; build.py)")
    lines += ["", f"Tokens counted: batch/tokens, every real token of each trained batch (prompt, generated and "
              f"<information> tokens, no padding), over timing/step, per GPU ({summary['gpus']}); mean over steps "
              f"after the first {summary['skip']} ('pooled': their tokens over their seconds)."]
    return "\n".join(lines) + "\n"


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("dir", type=Path, help="run.sh's OUT: <run>/metrics.jsonl per run")
    p.add_argument("--runs", nargs="+", default=["sync", "stream"], help="the runs (sub-folders) to summarise")
    p.add_argument("--skip", type=int, default=2, help="leading steps left out (warm-up, compilation)")
    p.add_argument("--steps", type=int, default=None,
                   help="count steps up to this one at most (run.sh's STEPS; a later logged step is left out)")
    p.add_argument("--gpus", type=int, default=1, help="GPUs the runs used")
    args = p.parse_args(argv)
    if args.skip < 0 or args.gpus < 1 or (args.steps is not None and args.steps <= args.skip):
        p.error("--skip must be >= 0, --steps > --skip and --gpus >= 1")
    summary = summarize(args.dir, args.runs, args.skip, args.gpus, args.steps)
    if summary["runs"]:
        table = markdown(summary)
        (args.dir / "summary.json").write_text(json.dumps(summary, indent=1) + "\n")
        (args.dir / "summary.md").write_text(table)
        print(table, end="")
    for error in summary["errors"].values():
        print(f"summarize: {error}", file=sys.stderr)
    return 1 if summary["errors"] else 0


if __name__ == "__main__":
    raise SystemExit(main())
