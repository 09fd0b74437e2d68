"""AdaTurn's training modes side by side: one table and two PNGs from run_modes.sh's outputs.

    python -m tools.analysis.adaturn_modes --budgets outputs/adaturn_modes/budgets/budgets.json \
        --metrics forced=outputs/adaturn_modes/forced/grpo/metrics.jsonl ... --out docs/results/adaturn_cpu

Writes modes.json (the evaluation rows and a summary of each training curve), modes.png (EM,
unanswered rate and pool calls against the budget; colour = training mode, dashed = evaluated
with forced) and modes_curves.png (training reward, forced and hit-budget rates, val EM), and
prints the markdown tables that modes.md carries.
"""
from __future__ import annotations

import argparse
import json
from pathlib import Path

from verl.trainer.tracking import read_jsonl

CURVES = [  # (title, key); train keys are per step over 64 sampled episodes, val keys every test_freq steps
    ("train reward (sampled)", "reward/mean"),
    ("train forced rate", "forced/mean"),
    ("train hit-budget rate (no answer)", "hit_budget/mean"),
    ("train format ok", "format_ok/mean"),
    ("val EM (greedy)", "val/em/mean"),
    ("val hit-budget rate", "val/hit_budget/mean"),
]
EVAL_PANELS = [("EM", "em"), ("unanswered (budget or length ran out)", "truncated"), ("pool calls / question", "calls")]


def metrics_rows(path: Path) -> list[dict]:
    """A run's metrics.jsonl rows (verl.trainer.tracking.read_jsonl); an empty file is an error naming it."""
    rows = read_jsonl(path)
    if not rows:
        raise ValueError(f"{path}: no metrics rows")
    return rows


def window_mean(rows: list[dict], key: str, lo: int, hi: int) -> float | None:
    """Mean of `key` over training steps lo..hi (inclusive); None where the key never appears."""
    vals = [r[key] for r in rows if lo <= r["step"] <= hi and key in r]
    return sum(vals) / len(vals) if vals else None


def curve_summary(rows: list[dict]) -> dict:
    last = max(r["step"] for r in rows)
    out = {}
    for _, key in CURVES[:4]:
        out[key] = {"steps_1_10": window_mean(rows, key, 1, 10), f"steps_{last - 9}_{last}": window_mean(rows, key, last - 9, last)}
    for key in ("val/em/mean", "val/hit_budget/mean", "val/forced/mean", "val/route_count/mean", "val/format_ok/mean"):
        out[key] = {r["step"]: r[key] for r in rows if key in r}
    return out


def eval_table(rows: list[dict], budgets: list[int]) -> str:
    head = "| trained with | evaluated with | " + " | ".join(f"B={b}" for b in budgets) + " |"
    lines = [head, "|---" * (head.count("|") - 1) + "|"]
    for run, mode in dict.fromkeys((r["run"], r["mode"]) for r in rows):
        by_b = {r["budget"]: r for r in rows if (r["run"], r["mode"]) == (run, mode)}
        cells = [f"{by_b[b]['em']:.3f} / {by_b[b]['truncated']:.2f} / {by_b[b]['calls']:.2f}" if b in by_b else "-"
                 for b in budgets]
        lines.append(f"| {run} | {mode} | " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def curve_table(summaries: dict[str, dict]) -> str:
    lines = ["| trained with | metric | steps 1-10 | last 10 steps |", "|---|---|---|---|"]
    for mode, s in summaries.items():
        for _, key in CURVES[:4]:
            first, last = s[key].values()
            fmt = lambda v: "-" if v is None else f"{v:.3f}"  # noqa: E731
            lines.append(f"| {mode} | {key} | {fmt(first)} | {fmt(last)} |")
    lines += ["", "| trained with | val EM at steps | val hit-budget | val forced | val calls | val format ok |",
              "|---|---|---|---|---|---|"]
    for mode, s in summaries.items():
        cols = [" ".join(f"{v:.2f}" for v in s[k].values()) for k in
                ("val/em/mean", "val/hit_budget/mean", "val/forced/mean", "val/route_count/mean", "val/format_ok/mean")]
        steps = ",".join(str(k) for k in s["val/em/mean"])
        lines.append(f"| {mode} | {cols[0]} ({steps}) | " + " | ".join(cols[1:]) + " |")
    return "\n".join(lines) + "\n"


def plot_eval(rows: list[dict], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 3, figsize=(15, 4.5))
    runs = list(dict.fromkeys(r["run"] for r in rows))
    for key in dict.fromkeys((r["run"], r["mode"]) for r in rows):
        sel = sorted((r for r in rows if (r["run"], r["mode"]) == key), key=lambda r: r["budget"])
        style = dict(color=plt.get_cmap("tab10")(runs.index(key[0])), marker="o",
                     linestyle="--" if key[1] == "forced" else "-", label=f"{key[0]} (eval {key[1]})")
        for ax, (_, field) in zip(axes, EVAL_PANELS):
            ax.plot([r["budget"] for r in sel], [r[field] for r in sel], **style)
    for ax, (name, _) in zip(axes, EVAL_PANELS):
        ax.set_xscale("log", base=2)
        ax.set_xlabel("turn budget T_max")
        ax.set_ylabel(name)
        ax.grid(alpha=0.3)
    axes[1].legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def plot_curves(metrics: dict[str, list[dict]], path: Path, window: int = 5) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(2, 3, figsize=(15, 7))
    for i, (mode, rows) in enumerate(metrics.items()):
        color = plt.get_cmap("tab10")(i)
        for ax, (title, key) in zip(axes.flat, CURVES):
            pts = [(r["step"], r[key]) for r in rows if key in r]
            if not key.startswith("val/"):  # sampled: trailing moving average over `window` steps
                ys = [p[1] for p in pts]
                pts = [(s, sum(ys[max(0, j - window + 1):j + 1]) / len(ys[max(0, j - window + 1):j + 1]))
                       for j, (s, _) in enumerate(pts)]
            ax.plot(*zip(*pts), color=color, marker="o" if key.startswith("val/") else None, label=mode)
            ax.set_title(title, fontsize=9)
            ax.grid(alpha=0.3)
    axes[0, 0].legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--budgets", required=True, help="eval_budgets.py's budgets.json")
    p.add_argument("--metrics", action="append", default=[], metavar="MODE=JSONL", help="a training run's metrics")
    p.add_argument("--out", required=True, help="output directory of the comparison")
    a = p.parse_args()
    doc = json.loads(Path(a.budgets).read_text())
    metrics = {}
    for arg in a.metrics:
        mode, eq, path = arg.partition("=")
        if not eq:
            raise SystemExit(f"--metrics wants MODE=JSONL, got {arg!r}")
        metrics[mode] = metrics_rows(Path(path))
    summaries = {m: curve_summary(rows) for m, rows in metrics.items()}
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "modes.json").write_text(json.dumps({"eval": doc, "curves": summaries}, indent=2) + "\n")
    plot_eval(doc["rows"], out / "modes.png")
    plot_curves(metrics, out / "modes_curves.png")
    print("EM / unanswered / calls per budget\n")
    print(eval_table(doc["rows"], sorted({r["budget"] for r in doc["rows"]})))
    print(curve_table(summaries))


if __name__ == "__main__":
    main()
