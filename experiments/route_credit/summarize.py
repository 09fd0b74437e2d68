"""Table and plot of route_ascent readings: P(best) per update, one line per credit estimator.

    python -m experiments.route_credit.summarize RUN_DIR [--records docs/results/route_credit]
"""
from __future__ import annotations

import argparse
import json
import shutil
import sys
from pathlib import Path

DOMAINS = ("science", "business", "geography", "sports", "people", "arts")


def read(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def table(runs: dict[str, list[dict]], at=(0, 100, 200, 300, 600)) -> str:
    """P(best) over all hops at chosen updates, then each run's last reading per domain."""
    head = "| estimator | " + " | ".join(f"update {u}" for u in at) + " | last: " + ", ".join(DOMAINS) + " |"
    lines = [head, "|---|" + "---|" * (len(at) + 1)]
    for name, rs in runs.items():
        by = {r["update"]: r for r in rs}
        cells = [f"{by[u]['p_best/all']:.2f}" if u in by else "-" for u in at]
        last = rs[-1]
        doms = " ".join(f"{last.get(f'p_best/{d}', float('nan')):.2f}" for d in DOMAINS)
        lines.append(f"| {name} | " + " | ".join(cells) + f" | {doms} (update {last['update']}) |")
    return "\n".join(lines)


def plot(runs: dict[str, list[dict]], out: Path) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fig, ax = plt.subplots(figsize=(7.5, 3.6))
    for name, rs in runs.items():
        ax.plot([r["update"] for r in rs], [r["p_best/all"] for r in rs], marker="o", ms=3, label=name)
    ax.set_xlabel("optimizer updates (Adam, lr 1e-4; 48 hops each unless the name says)")
    ax.set_ylabel("P(best model), held-out hops")
    ax.set_ylim(0, 1.02)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.01, 1.0))
    fig.tight_layout()
    fig.savefig(out, dpi=64)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("run_dir", type=Path, help="where run.sh wrote NAME.jsonl per variant")
    ap.add_argument("--records", type=Path, default=None, help="copy the readings here and write table.md, p_best.png")
    args = ap.parse_args(argv)
    files = sorted(args.run_dir.glob("*.jsonl"))
    if not files:
        raise SystemExit(f"summarize: no *.jsonl readings in {args.run_dir}")
    runs = {f.stem: read(f) for f in files}
    empty = [n for n, rs in runs.items() if not rs]
    if empty:
        raise SystemExit(f"summarize: no readings in {', '.join(empty)}")
    dest = args.records or args.run_dir
    dest.mkdir(parents=True, exist_ok=True)
    for f in files:
        if f.parent.resolve() != dest.resolve():
            shutil.copy(f, dest / f.name)
    text = table(runs)
    (dest / "table.md").write_text(text + "\n")
    plot(runs, dest / "p_best.png")
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
