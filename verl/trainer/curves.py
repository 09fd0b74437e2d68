"""curves.png: a run's metrics against step, drawn so that it answers "did training help?" at a glance.

A metric and its validation twin (em/mean, val/em/mean) share one panel, each labelled with how it was decoded:
training episodes are sampled at rollout.temperature, validation is greedy by default, so the two differ by the
sampling alone (at T 1 a router's sampled EM sat at 0.15-0.40 beside a greedy 0.79-0.84). Validation EM gets its
95% Wilson interval over the validation questions (val/n; 100 questions: about +-0.08), and its best step is
marked beside the step the run exports, which is always the last one (trainer.export_hf).
"""
from __future__ import annotations

import math
import os
from pathlib import Path

from verl.trainer.tracking import read_jsonl

Z95 = 1.959964
BAND_KEYS = ("em/mean",)  # 0 or 1 per question: a binomial interval over val/n holds
BEST_KEYS = ("em/mean", "reward/mean")  # the first of these a panel pair shows gets its best val step marked


def wilson(p: float, n: int, z: float = Z95) -> tuple[float, float]:
    """The Wilson score interval of a proportion p measured on n items (95% at the default z)."""
    if n <= 0:
        return 0.0, 1.0
    d = 1 + z * z / n
    center = (p + z * z / (2 * n)) / d
    half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / d
    return max(0.0, center - half), min(1.0, center + half)


def decoding_labels(rollout) -> dict[str, str]:
    """Legend labels saying how training and validation episodes were decoded (a rollout config section)."""
    train = f"train: sampled at T {rollout.temperature:g}"
    greedy = rollout.val_greedy or rollout.val_temperature == 0
    val = "val: greedy" if greedy else f"val: sampled at T {rollout.val_temperature:g}"
    return {"train_label": train, "val_label": val}


def curve_panels(keys: list[str], rows: list[dict]) -> list[tuple[str | None, str | None]]:
    """(training key, validation key) per panel, in the order of `keys`: a key and its val/ twin, both asked
    for, share one panel; keys no row has are left out."""
    present = {k for r in rows for k, v in r.items() if isinstance(v, (int, float))}
    asked = [k for k in keys if k in present]
    panels, done = [], set()
    for k in asked:
        if k in done:
            continue
        base = k[len("val/"):] if k.startswith("val/") else k
        pair = (base if base in asked else None, "val/" + base if "val/" + base in asked else None)
        done.update(x for x in pair if x)
        panels.append(pair)
    return panels


def _series(rows: list[dict], key: str) -> tuple[list[int], list[float]]:
    pts = [(r["step"], r[key]) for r in rows if isinstance(r.get(key), (int, float))]
    return [p[0] for p in pts], [p[1] for p in pts]


def curves_figure(rows: list[dict], keys: list[str], title: str = "", train_label: str = "train",
                  val_label: str = "val"):
    """The figure plot_curves writes (rows: metrics.jsonl's)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    panels = curve_panels(keys, rows)
    if not panels:
        raise ValueError("none of the requested metrics were logged")
    last = max(r["step"] for r in rows)
    best_base = next((b for b in BEST_KEYS if any(p == (b, "val/" + b) or p == (None, "val/" + b) for p in panels)),
                     None)
    cols = min(3, len(panels))
    nrows = math.ceil(len(panels) / cols)
    fig, axes = plt.subplots(nrows, cols, figsize=(4.4 * cols, 3.2 * nrows), squeeze=False)
    for ax, (train_key, val_key) in zip(axes.flat, panels):
        if train_key:
            x, y = _series(rows, train_key)
            ax.plot(x, y, marker=".", ms=3, lw=0.8, color="C0", label=train_label if val_key else None)
        if val_key:
            base = val_key[len("val/"):]
            x, y = _series(rows, val_key)
            ax.plot(x, y, marker="o", ms=4, lw=1.5, color="C1", label=val_label)
            if base in BAND_KEYS:
                ns = {r["step"]: r.get("val/n") for r in rows if isinstance(r.get(val_key), (int, float))}
                band = [(s, *wilson(v, int(ns[s]))) for s, v in zip(x, y) if isinstance(ns.get(s), (int, float))]
                if band:
                    n = int(ns[band[-1][0]])
                    ax.fill_between([b[0] for b in band], [b[1] for b in band], [b[2] for b in band], color="C1",
                                    alpha=0.18, lw=0, label=f"val 95% CI (Wilson, n={n})")
            if base == best_base and y:
                i = max(range(len(y)), key=lambda j: y[j])  # the first step reaching the maximum
                ax.plot([x[i]], [y[i]], marker="*", ms=13, color="C3", ls="none", zorder=5,
                        label=f"best val {y[i]:.3f} (step {x[i]})")
                ax.axvline(last, color="grey", ls=":", lw=1, label=f"exported: last step ({last})")
        ax.set_title(f"{train_key}: train and val" if train_key and val_key else train_key or val_key, fontsize=9)
        ax.set_xlabel("step")
        ax.grid(alpha=0.3)
    for ax in list(axes.flat)[len(panels):]:
        ax.axis("off")
    legend = {}  # one legend under the panels (inside them it hid the curves), each label once
    for ax in axes.flat:
        for handle, label in zip(*ax.get_legend_handles_labels()):
            legend.setdefault(label, handle)
    if legend:
        fig.legend(list(legend.values()), list(legend), loc="lower center", ncol=min(5, len(legend)), fontsize=8,
                   frameon=False)
    if any(t and v for t, v in panels):
        note = (f"{train_label} | {val_label}: the gap between them is mostly the decoding; "
                "the exported model is the last step's, not the best val step's")
        title = f"{title}\n{note}" if title else note
    if title:
        fig.suptitle(title, fontsize=10)
    fig.tight_layout(rect=(0, 0.06 if legend else 0, 1, 1))
    return fig


def plot_curves(jsonl_path: str | os.PathLike, keys: list[str], png_path: str | os.PathLike, title: str = "",
                train_label: str = "train", val_label: str = "val") -> Path:
    """Write curves_figure of the metrics file `jsonl_path` to `png_path`; ValueError when no key was logged."""
    import matplotlib.pyplot as plt

    rows = read_jsonl(jsonl_path)
    try:
        fig = curves_figure(rows, keys, title, train_label, val_label)
    except ValueError as e:
        raise ValueError(f"{jsonl_path}: {e}") from None
    png_path = Path(png_path)
    fig.savefig(png_path, dpi=110)
    plt.close(fig)
    return png_path
