"""Metric logging: console, JSONL, TensorBoard and wandb as trainer.logger names them; timers; metrics files."""
from __future__ import annotations

import gzip
import importlib.util
import json
import os
import sys
import time
from contextlib import contextmanager
from pathlib import Path
from typing import Any


def _plain(v: Any) -> Any:
    """Make tensors / numpy scalars JSON-friendly."""
    if hasattr(v, "item") and getattr(v, "ndim", 0) == 0:
        return v.item()
    return v


# The console's compact line: (label, metric keys tried in order, format). The full set goes to JSONL/wandb.
CONSOLE_FIELDS = (
    ("loss", ("actor/sft_loss",), ".3f"), ("ctx_loss", ("actor/context_loss",), ".3f"),  # trainer.mode=sft
    ("reward", ("reward/mean",), ".3f"), ("em", ("em/mean",), ".3f"), ("format", ("format_ok/mean",), ".2f"),
    ("cost", ("cost_usd/mean",), ".2e"), ("calls", ("route_count/mean",), ".2f"),
    ("pool_fail", ("pool/failure_rate/mean",), ".2f"), ("pool_fail_run", ("pool/run_failure_rate/mean",), ".2f"),
    ("kl", ("actor/reward_kl", "actor/kl_loss"), ".2e"), ("tok/s", ("timing/tokens_per_s",), ".0f"),
    ("step_s", ("timing/step",), ".1f"),
    ("val_reward", ("val/reward/mean",), ".3f"), ("val_em", ("val/em/mean",), ".3f"),
)


def console_line(metrics: dict[str, Any], step: int, total: int | None = None) -> str:
    """One line per step: reward, EM, format, cost, calls, KL, tokens/s, step time (and validation when
    there is one); a metric the run does not produce is left out."""
    parts = [f"step {step}" + (f"/{total}" if total else "")]
    for label, keys, fmt in CONSOLE_FIELDS:
        key = next((k for k in keys if isinstance(metrics.get(k), (int, float))), None)
        if key is not None:
            parts.append(f"{label} {metrics[key]:{fmt}}")
    return " | ".join(parts[:1] + [" ".join(parts[1:])]) if len(parts) > 1 else parts[0]


def summary_table(rows: list[dict[str, Any]]) -> str:
    """The console fields over a run's metrics.jsonl rows: first and last value (with their steps), min, max."""
    lines = [f"{'metric':<11} {'first':>10} {'(step)':>7} {'last':>10} {'(step)':>7} {'min':>10} {'max':>10}"]
    for label, keys, fmt in CONSOLE_FIELDS:
        key = next((k for k in keys if any(isinstance(r.get(k), (int, float)) for r in rows)), None)
        if key is None:
            continue
        seen = [(r["step"], r[key]) for r in rows if isinstance(r.get(key), (int, float))]
        vals = [v for _, v in seen]
        lines.append(f"{label:<11} {seen[0][1]:>10{fmt}} {seen[0][0]:>7} {seen[-1][1]:>10{fmt}} {seen[-1][0]:>7} "
                     f"{min(vals):>10{fmt}} {max(vals):>10{fmt}}")
    return "\n".join(lines)


def on_terminal(stream=None) -> bool:
    """Whether `stream` (default stderr, where progress bars go) is a terminal, not a file or a pipe."""
    stream = sys.stderr if stream is None else stream
    return bool(getattr(stream, "isatty", lambda: False)())


def hide_library_bars() -> None:
    """Turn off transformers' and the hub's progress bars (loading and writing weights) when stderr is
    not a terminal: in a redirected log each redraw is a line of its own."""
    if on_terminal():
        return
    from huggingface_hub.utils import disable_progress_bars
    from transformers.utils import logging as hf_logging

    disable_progress_bars()
    hf_logging.disable_progress_bar()


# trainer.logger's names -> (the package a logger imports, the extra that installs it); None: nothing to install
LOGGERS = {"console": None, "jsonl": None, "tensorboard": ("tensorboard", "tensorboard"), "wandb": ("wandb", "wandb")}


def unknown_loggers(names) -> str | None:
    """Why `names` (trainer.logger) cannot be used, naming the allowed ones; None when every name is known."""
    bad = [n for n in names if n not in LOGGERS]
    if not bad:
        return None
    return (f"trainer.logger: unknown logger{'s' if len(bad) > 1 else ''} {', '.join(repr(n) for n in bad)} "
            f"(allowed: {', '.join(LOGGERS)})")


def missing_logger_packages(names) -> list[str]:
    """A readable line per configured logger whose package does not import here (the preflight lists them)."""
    out = []
    for name in dict.fromkeys(names):
        need = LOGGERS.get(name)
        if need and importlib.util.find_spec(need[0]) is None:
            out.append(f"the {need[0]} package (trainer.logger: {name}): not installed; pip install -e '.[{need[1]}]'")
    return out


class Tracker:
    """Fan metrics out to the configured sinks ("console": one compact line, "jsonl": every metric to
    metrics.jsonl, "tensorboard": every numeric metric as a scalar under out_dir/tensorboard, "wandb"). On a
    terminal the console line comes every step; redirected, every `console_every` steps and at the first, the
    last and any step with validation metrics."""

    def __init__(self, sinks: list[str], out_dir: str | os.PathLike, project: str = "router-r1",
                 run_name: str = "run", config: dict | None = None, resume: bool = False, console_every: int = 1):
        problem = unknown_loggers(sinks)
        if problem:
            raise ValueError(problem)
        self.sinks = list(sinks)
        self.console_every = max(1, console_every)
        self.out_dir = Path(out_dir)
        self.out_dir.mkdir(parents=True, exist_ok=True)
        self.jsonl_path = self.out_dir / "metrics.jsonl"
        self.tensorboard_dir = self.out_dir / "tensorboard"
        if "jsonl" in self.sinks and not resume and self.jsonl_path.exists():
            self.jsonl_path.unlink()
        self._resume = resume
        self._tb = None  # opened at the first step logged: a resumed run purges the events it redoes from there
        self._wandb = None
        if "wandb" in self.sinks:
            import wandb  # optional dependency

            self._wandb = wandb.init(project=project, name=run_name, config=config, resume="allow")

    def log(self, metrics: dict[str, Any], step: int, total: int | None = None) -> None:
        metrics = {k: _plain(v) for k, v in metrics.items()}
        if "console" in self.sinks and self._console_step(metrics, step, total):
            from tqdm import tqdm

            tqdm.write(console_line(metrics, step, total))  # above a progress bar, not through it
        if "jsonl" in self.sinks:
            with open(self.jsonl_path, "a") as f:
                f.write(json.dumps({"step": step, **metrics}, default=str) + "\n")
        if "tensorboard" in self.sinks:
            self._tensorboard(metrics, step)
        if self._wandb is not None:
            self._wandb.log(metrics, step=step)

    def _tensorboard(self, metrics: dict[str, Any], step: int) -> None:
        if self._tb is None:
            from torch.utils.tensorboard import SummaryWriter

            # a resume redoes the steps after its checkpoint: TensorBoard drops the killed run's events from here
            self._tb = SummaryWriter(str(self.tensorboard_dir), purge_step=step if self._resume else None)
        for key, value in metrics.items():
            if isinstance(value, (int, float)):
                self._tb.add_scalar(key, value, step)
        self._tb.flush()  # a killed run keeps every step it logged

    def _console_step(self, metrics: dict[str, Any], step: int, total: int | None) -> bool:
        return (on_terminal(sys.stdout) or step <= 1 or step % self.console_every == 0 or step == total
                or any(k.startswith("val/") for k in metrics))

    def finish(self) -> None:
        if self._tb is not None:
            self._tb.close()
        if self._wandb is not None:
            self._wandb.finish()


@contextmanager
def timer(name: str, into: dict[str, float]):
    """Add the wall time of the block to `into["timing/<name>"]` (seconds)."""
    t0 = time.perf_counter()
    try:
        yield
    finally:
        into[f"timing/{name}"] = into.get(f"timing/{name}", 0.0) + time.perf_counter() - t0


def read_jsonl(path: str | os.PathLike) -> list[dict]:
    """Rows of a metrics JSONL file, or of its .jsonl.gz (as docs/results keeps them); a cut last line (killed run)
    is skipped, a broken line before it is an error naming the file and line (resuming trims cut lines)."""
    with gzip.open(path, "rt") if str(path).endswith(".gz") else open(path) as f:
        lines = [(i, line) for i, line in enumerate(f, 1) if line.strip()]
    rows = []
    for k, (i, line) in enumerate(lines):
        try:
            rows.append(json.loads(line))
        except json.JSONDecodeError as e:
            if k == len(lines) - 1:
                continue
            raise ValueError(f"{path}:{i}: not a JSON line ({e.msg}); only the last line may be cut") from None
    return rows


def trim_jsonl(path: str | os.PathLike, last_step: int) -> int:
    """Keep the rows of steps <= last_step (none on a fresh start, last_step 0); returns rows dropped.

    A resumed run redoes the steps after its checkpoint; their rows from the killed run would
    otherwise stay beside the new ones (two values for one step)."""
    path = Path(path)
    if not path.exists():
        return 0
    kept, dropped = [], 0
    with open(path, "rb") as f:
        for line in f:
            try:
                step = json.loads(line)["step"]
            except (ValueError, KeyError, TypeError):  # a line cut by the kill
                dropped += 1
                continue
            if last_step > 0 and step <= last_step:
                kept.append(line if line.endswith(b"\n") else line + b"\n")
            else:
                dropped += 1
    if dropped:
        tmp = path.with_name(path.name + ".tmp")
        tmp.write_bytes(b"".join(kept))
        os.replace(tmp, path)
    return dropped
