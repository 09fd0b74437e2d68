"""Markdown table of evaluation summaries (router_r1.eval.evaluate's summary.json), one row per run.

    python -m tools.analysis.eval_table eval_summary.json alpha06_eval_summary.json
"""
from __future__ import annotations

import json
import sys
from pathlib import Path

SHORT = {"Qwen2.5-7B-Instruct": "Qwen-7B", "LLaMA-3.1-8B-Instruct": "Llama-8B", "Mistral-7B-Instruct": "Mistral-7B",
         "LLaMA-3.1-70B-Instruct": "Llama-70B", "Gemma-2-27B-Instruct": "Gemma-27B",
         "Mixtral-8x22B-Instruct": "Mixtral-8x22B"}


def rows(path: Path) -> list[str]:
    summary = json.loads(path.read_text())
    alpha = summary["config"]["alpha"]
    out = []
    for run in summary["runs"]:
        o = run["overall"]
        lo, hi = o["em_ci95"]
        shares = ", ".join(f"{SHORT.get(m, m)} {s:.2f}" for m, s in o["model_share"].items() if s >= 0.005)
        out.append(f"| {run['label']} ({path.name}) | {o['em']:.3f} [{lo:.3f}, {hi:.3f}] | {o['format_ok']:.2f} "
                   f"| {o['reward']:.3f} (alpha {alpha:g}) | {o['calls']:.2f} | {o['cost_1e6_usd']:.2f} | {shares} |")
    return out


def main(argv: list[str]) -> None:
    if not argv:
        raise SystemExit(__doc__)
    print("| run | EM [95% CI] | format ok | reward | calls | cost (1e-6 USD) | share of questions per model |")
    print("|---|---|---|---|---|---|---|")
    for p in argv:
        print("\n".join(rows(Path(p))))


if __name__ == "__main__":
    main(sys.argv[1:])
