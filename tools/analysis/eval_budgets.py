"""Accuracy and cost per turn budget (AdaTurn): one evaluation per (checkpoint, budget mode, budget).

    python -m tools.analysis.eval_budgets --checkpoint outputs/adaturn/hf --plain outputs/embedded/hf \
        --data outputs/embedded/data/test.parquet --budgets 1 2 4 8 --modes end forced --out outputs/adaturn/budgets

--checkpoint DIR is a budget-aware router: its prompts state the budget. --plain DIR is a
router trained without budgets: its prompts stay as trained and only the limit applies.
Each evaluation is router_r1.eval.evaluate with --budget B --budget-mode M (the same
rollout and scorer as test.sh); the model is loaded once per checkpoint. Writes
budgets.json, budgets.md (EM, cost, calls, forced and truncated rates per budget) and
budgets.png (EM and unanswered rate against the budget), plus each evaluation's own
summary under OUT/<label>/<mode>/budget_<B>/. Any other evaluate flag goes after `--`.
"""
from __future__ import annotations

import argparse
import json
import sys
from dataclasses import replace
from pathlib import Path

from router_r1.eval.evaluate import USER_ERRORS, EvalConfig, _labels, evaluate, parse_args as eval_args
from router_r1.runtime import load_policy, quiet_transformers, resolve_checkpoint


def split_label(arg: str) -> tuple[str | None, str]:
    """"LABEL=DIR" -> (LABEL, DIR); a plain "DIR" -> (None, DIR)."""
    label, eq, path = arg.partition("=")
    return (label, path) if eq and label and "/" not in label else (None, arg)


def budget_rows(base: EvalConfig, runs: list[tuple[str, str, bool]], budgets: list[int], modes: list[str],
                out: Path, load=None, log=print) -> list[dict]:
    """One row per (run, mode, budget): the overall metrics of that evaluation. runs: (label, checkpoint, aware)."""
    rows, cache = [], {}
    for label, ckpt, aware in runs:
        if ckpt not in cache:
            cache.clear()  # one model in memory at a time
            loader = load or (lambda c: load_policy(c, base.device, base.prompt_template, base.rollout,
                                                    base.batch_size))
            cache[ckpt] = loader(ckpt)
        for mode in modes:
            for b in budgets:
                cfg = replace(base, checkpoints=[ckpt], baselines=[], budget=b, budget_mode=mode, budget_text=aware,
                              out=str(out / label / mode / f"budget_{b}"))
                summary = evaluate(cfg, load=lambda c: cache[c], log=lambda msg: None)
                m = summary["runs"][0]["overall"]
                # "truncated": no answer because a budget (turns) or the length ran out
                rows.append({"run": label, "checkpoint": ckpt, "budget_text": aware, "mode": mode, "budget": b,
                             "n": m["n"], "em": m["em"], "em_ci95": m["em_ci95"], "cost_1e6_usd": m["cost_1e6_usd"],
                             "calls": m["calls"], "forced": m["forced"], "format_ok": m["format_ok"],
                             "truncated": m["hit_budget"] + m["truncated"]})
                log(f"{label:<16} {mode:<7} budget {b}: EM {m['em']:.3f} calls {m['calls']:.2f} "
                    f"forced {m['forced']:.2f} truncated {rows[-1]['truncated']:.2f}")
    return rows


def markdown(rows: list[dict]) -> str:
    head = "| run | mode | budget | n | EM [95% CI] | cost (1e-6 USD) | calls | forced | truncated | format ok |"
    lines = [head, "|---" * (head.count("|") - 1) + "|"]
    for r in rows:
        lo, hi = r["em_ci95"]
        lines.append(f"| {r['run']} | {r['mode']} | {r['budget']} | {r['n']} | {r['em']:.3f} [{lo:.3f}, {hi:.3f}] | "
                     f"{r['cost_1e6_usd']:.2f} | {r['calls']:.2f} | {r['forced']:.2f} | {r['truncated']:.2f} | "
                     f"{r['format_ok']:.2f} |")
    return "\n".join(lines) + "\n"


def plot(rows: list[dict], path: Path) -> None:
    """EM (left) and the unanswered rate (right) against the budget, one line per (run, mode)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (ax_em, ax_tr) = plt.subplots(1, 2, figsize=(11, 4.5))
    runs = list(dict.fromkeys(r["run"] for r in rows))
    colors = plt.get_cmap("tab10" if len(runs) <= 10 else "tab20")
    for key in dict.fromkeys((r["run"], r["mode"]) for r in rows):  # colour = run, line style = mode
        sel = sorted((r for r in rows if (r["run"], r["mode"]) == key), key=lambda r: r["budget"])
        xs = [r["budget"] for r in sel]
        style = dict(color=colors(runs.index(key[0])), linestyle="--" if key[1] == "forced" else "-",
                     marker="o", label=f"{key[0]} ({key[1]})")
        ax_em.plot(xs, [r["em"] for r in sel], **style)
        ax_tr.plot(xs, [r["truncated"] for r in sel], **style)
    for ax, name in ((ax_em, "EM"), (ax_tr, "unanswered (budget or length ran out)")):
        ax.set_xscale("log", base=2)
        ax.set_xlabel("turn budget T_max")
        ax.set_ylabel(name)
        ax.grid(alpha=0.3)
    ax_tr.legend(fontsize=7, loc="upper right")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    rest = argv[argv.index("--") + 1:] if "--" in argv else []
    argv = argv[: argv.index("--")] if "--" in argv else argv
    p = argparse.ArgumentParser(prog="python -m tools.analysis.eval_budgets", description=__doc__.split("\n\n")[0])
    p.add_argument("--checkpoint", action="append", default=[], metavar="[LABEL=]DIR",
                   help="budget-aware checkpoint (repeatable)")
    p.add_argument("--plain", action="append", default=[], metavar="[LABEL=]DIR",
                   help="checkpoint trained without budgets (repeatable)")
    p.add_argument("--data", nargs="+", default=[], help="test parquet file(s)")
    p.add_argument("--merge", nargs="+", default=[], metavar="BUDGETS_JSON",
                   help="no evaluation: join the rows of earlier budgets.json files into one table and plot")
    p.add_argument("--budgets", type=int, nargs="+", default=[1, 2, 4, 8], help="turn budgets to evaluate")
    p.add_argument("--modes", nargs="+", choices=("end", "forced"), default=["end", "forced"],
                   help="what a route past the budget leads to")
    p.add_argument("--out", default="outputs/eval_budgets", help="output directory")
    a = p.parse_args(argv)
    out = Path(a.out)
    if a.merge:
        rows = [r for f in a.merge for r in json.loads(Path(f).read_text())["rows"]]
        write(out, {"merged": a.merge, "rows": rows})
        return 0
    try:
        if not a.checkpoint and not a.plain:
            raise ValueError("pass --checkpoint and/or --plain")
        if not a.data:
            raise ValueError("--data is required (unless --merge)")
        if min(a.budgets) < 0:
            raise ValueError(f"--budgets must be >= 0, got {a.budgets}")
        named = [(*split_label(c), True) for c in a.checkpoint] + [(*split_label(c), False) for c in a.plain]
        named = [(label, str(resolve_checkpoint(c)), aware) for label, c, aware in named]
        base = eval_args(["--data", *a.data, *rest])
        auto = _labels([c for label, c, _ in named if label is None], trained_as=False)  # directory names
        runs = [(label or auto[c], c, aware) for label, c, aware in named]
        if len({r[0] for r in runs}) != len(runs):
            raise ValueError(f"run labels repeat: {[r[0] for r in runs]}; name them LABEL=DIR")
        quiet_transformers()
        rows = budget_rows(base, runs, a.budgets, a.modes, out)
    except (*USER_ERRORS, ValueError) as e:
        print(f"error: {str(e).replace(chr(10), ' ')}", file=sys.stderr)
        return 2
    write(out, {"data": a.data, "budgets": a.budgets, "modes": a.modes, "rows": rows})
    return 0


def write(out: Path, doc: dict) -> None:
    """budgets.json (doc), budgets.md and budgets.png from doc["rows"]."""
    out.mkdir(parents=True, exist_ok=True)
    (out / "budgets.json").write_text(json.dumps(doc, indent=2) + "\n")
    (out / "budgets.md").write_text(markdown(doc["rows"]))
    plot(doc["rows"], out / "budgets.png")
    print(markdown(doc["rows"]))
    print(f"wrote {out / 'budgets.json'}, {out / 'budgets.md'}, {out / 'budgets.png'}")


if __name__ == "__main__":
    sys.exit(main())
