"""Metric logging: console, JSONL, and wandb when configured; timers; PNG curves."""
from __future__ import annotations

import json
import math
import os
import time
from contextlib import contextmanager
from pathlib import Path
from typing import Any


def _plain(v: Any) -> Any:
    """Make tensors / numpy scalars JSON-friendly."""
    if hasattr(v, "item") and getattr(v, "ndim", 0) == 0:
        return v.item()
    return v


class Tracker:
    """Fan metrics out to the configured sinks ("console", "jsonl", "wandb")."""

    def __init__(self, sinks: list[str], out_dir: str | os.PathLike, project: str = "router-r1",
                 run_name: str = "run", config: dict | None = None, resume: bool = False):
        self.sinks = list(sinks)
        self.out_dir = Path(out_dir)
        self.out_dir.mkdir(parents=True, exist_ok=True)
        self.jsonl_path = self.out_dir / "metrics.jsonl"
        if "jsonl" in self.sinks and not resume and self.jsonl_path.exists():
            self.jsonl_path.unlink()
        self._wandb = None
        if "wandb" in self.sinks:
            import wandb  # optional dependency

            self._wandb = wandb.init(project=project, name=run_name, config=config, resume="allow")

    def log(self, metrics: dict[str, Any], step: int) -> None:
        metrics = {k: _plain(v) for k, v in metrics.items()}
        if "console" in self.sinks:
            keys = sorted(k for k in metrics if isinstance(metrics[k], (int, float)))
            shown = " ".join(f"{k}={metrics[k]:.4g}" for k in keys if not k.startswith("timing/"))
            print(f"[step {step}] {shown}", flush=True)
        if "jsonl" in self.sinks:
            with open(self.jsonl_path, "a") as f:
                f.write(json.dumps({"step": step, **metrics}, default=str) + "\n")
        if self._wandb is not None:
            self._wandb.log(metrics, step=step)

    def finish(self) -> None:
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
    """Rows of a metrics JSONL file; a cut last line (killed run) is skipped."""
    rows = []
    with open(path) as f:
        for line in f:
            try:
                rows.append(json.loads(line))
            except json.JSONDecodeError:
                continue
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


def plot_curves(jsonl_path: str | os.PathLike, keys: list[str], png_path: str | os.PathLike,
                title: str = "") -> Path:
    """One subplot per metric key against step; missing keys are skipped."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = read_jsonl(jsonl_path)
    keys = [k for k in keys if any(k in r for r in rows)]
    if not keys:
        raise ValueError(f"{jsonl_path}: none of the requested metrics were logged")
    cols = min(3, len(keys))
    nrows = math.ceil(len(keys) / cols)
    fig, axes = plt.subplots(nrows, cols, figsize=(4.2 * cols, 3.0 * nrows), squeeze=False)
    for ax, key in zip(axes.flat, keys):
        pts = [(r["step"], r[key]) for r in rows if key in r and isinstance(r[key], (int, float))]
        ax.plot([p[0] for p in pts], [p[1] for p in pts], marker=".", lw=1)
        ax.set_title(key, fontsize=9)
        ax.set_xlabel("step")
        ax.grid(alpha=0.3)
    for ax in list(axes.flat)[len(keys):]:
        ax.axis("off")
    if title:
        fig.suptitle(title)
    fig.tight_layout()
    png_path = Path(png_path)
    fig.savefig(png_path, dpi=110)
    plt.close(fig)
    return png_path
