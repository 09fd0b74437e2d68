"""What routing a router learned, beside the world's accuracy table: per hop domain, each model's share of the hops.

    python -m tools.analysis.routing_vs_accuracy OUT/eval/trajectories.jsonl --pool configs/pool/sim.yaml \
        [--world-seed 0] [--out routing.md] [--plot routing.png]

Each route of each greedy trajectory is matched to the fact it asked (tools.analysis.diagnose_failures.classify);
hops whose query asks no fact of the question are left out. Per run: the share of each domain's hops per model,
the expected hop accuracy of that routing under the pool's `sim.accuracy` (sum of share x accuracy), the share of
hops sent to the domain's best model (highest accuracy, then cheapest), and the output price per hop.
"""
from __future__ import annotations

import argparse
import collections
import json
import sys
from pathlib import Path

from router_r1.pool.registry import ModelRegistry
from sim.embedded import domain_accuracy
from sim.world import DOMAINS, SimWorld
from tools.analysis.diagnose_failures import classify


def pool_table(path: Path) -> tuple[list[str], dict[str, dict[str, float]], dict[str, float]]:
    """(listed model names, accuracy[domain][model], output price per 1M tokens) from a sim pool yaml; models marked
    `unseen: true` are not in the training listing and are left out."""
    specs = list(ModelRegistry.from_yaml(path).seen().models.values())
    per_model = {m.name: domain_accuracy(m) for m in specs}  # an error naming a model without sim.accuracy
    acc = {d: {name: per_model[name][d] for name in per_model} for d in DOMAINS}
    return [m.name for m in specs], acc, {m.name: float(m.price_out_per_m) for m in specs}


def best_model(acc: dict[str, float], price: dict[str, float], listed: list[str]) -> str:
    return min(listed, key=lambda m: (-acc[m], price[m]))


def routing(recs: list[dict], world: SimWorld) -> dict[str, collections.Counter]:
    """hops[domain][model]: greedy hops that asked a fact of that domain, per model."""
    hops: dict[str, collections.Counter] = {d: collections.Counter() for d in DOMAINS}
    for rec in recs:
        for h in classify(world, rec)["hops"]:
            if h["domain"] in hops:
                hops[h["domain"]][h["model"]] += 1
    return hops


def summary(hops, names, acc, price) -> dict:
    """Per-run figures: shares per domain, expected hop accuracy, share to each domain's best model, price/hop."""
    total = sum(sum(c.values()) for c in hops.values())
    used = [m for m in names if any(c[m] for c in hops.values())]
    exp_acc = sum(n * acc[d].get(m, 0.0) for d, c in hops.items() for m, n in c.items()) / max(total, 1)
    to_best = sum(c[best_model(acc[d], price, names)] for d, c in hops.items()) / max(total, 1)
    per_hop_price = sum(n * price.get(m, 0.0) for c in hops.values() for m, n in c.items()) / max(total, 1)
    shares = {d: {m: c[m] / max(sum(c.values()), 1) for m in names} for d, c in hops.items()}
    return {"hops": total, "expected_hop_accuracy": exp_acc, "share_to_best": to_best,
            "price_out_per_m_per_hop": per_hop_price, "shares": shares, "models_used": used}


def markdown(runs: dict[str, dict], names, acc, price) -> str:
    short = [m.split("-Instruct")[0] for m in names]
    head = "| domain | " + " | ".join(short) + " |\n|---|" + "---|" * len(names) + "\n"
    out = ["The world's accuracy per domain (pool yaml `sim.accuracy`; output price per 1M tokens in the header):", "",
           "| domain | " + " | ".join(f"{s} (${price[m]:.2f})" for s, m in zip(short, names)) + " |",
           "|---|" + "---|" * len(names)]
    for d in DOMAINS:
        best = best_model(acc[d], price, names)
        out.append(f"| {d} | " + " | ".join(f"**{acc[d][m]:.2f}**" if m == best else f"{acc[d][m]:.2f}"
                                            for m in names) + " |")
    for run, s in runs.items():
        out += ["", f"{run}: share of each domain's hops per model ({s['hops']} hops; expected hop accuracy "
                f"{s['expected_hop_accuracy']:.3f}, {s['share_to_best']:.0%} to the domain's best model, "
                f"${s['price_out_per_m_per_hop']:.2f} per 1M output tokens a hop on average):", "", head.rstrip("\n")]
        for d in DOMAINS:
            out.append(f"| {d} | " + " | ".join(f"{s['shares'][d][m]:.2f}" for m in names) + " |")
    return "\n".join(out) + "\n"


def plot(runs: dict[str, dict], names, acc, path: Path) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    panels = [("world accuracy", [[acc[d][m] for m in names] for d in DOMAINS])]
    panels += [(f"{run}: share of hops", [[s["shares"][d][m] for m in names] for d in DOMAINS])
               for run, s in runs.items()]
    fig, axes = plt.subplots(1, len(panels), figsize=(4.2 * len(panels), 3.8), squeeze=False)
    for ax, (title, grid) in zip(axes[0], panels):
        ax.imshow(grid, vmin=0, vmax=1, cmap="viridis")
        ax.set_title(title, fontsize=9)
        ax.set_xticks(range(len(names)), [m.split("-Instruct")[0] for m in names], rotation=60, ha="right",
                      fontsize=7)
        ax.set_yticks(range(len(DOMAINS)), DOMAINS, fontsize=8)
        for i, row in enumerate(grid):
            for j, v in enumerate(row):
                ax.text(j, i, f"{v:.2f}", ha="center", va="center", fontsize=6,
                        color="black" if v > 0.5 else "white")
    axes[0][0].set_ylabel("hop domain")
    for ax in axes[0]:
        ax.set_xlabel("model (listing order)", fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=90)
    plt.close(fig)
    from PIL import Image  # matplotlib's own dependency; a 64-colour PNG keeps docs/ small
    Image.open(path).convert("RGB").quantize(colors=64).save(path, optimize=True)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("trajectories", type=Path, help="trajectories.jsonl of an evaluation (one or more runs)")
    ap.add_argument("--pool", type=Path, required=True, help="the simulated pool yaml the run used (its sim: blocks)")
    ap.add_argument("--world-seed", type=int, default=0, help="seed of the simulated world the data came from")
    ap.add_argument("--out", type=Path, help="write the tables here (markdown) as well as to stdout")
    ap.add_argument("--json", type=Path, help="write the per-run figures here")
    ap.add_argument("--plot", type=Path, help="write heatmaps (accuracy, then each run's shares) to this PNG")
    args = ap.parse_args(argv)
    names, acc, price = pool_table(args.pool)
    world = SimWorld(seed=args.world_seed)
    recs: dict[str, list[dict]] = collections.defaultdict(list)
    for i, line in enumerate(args.trajectories.read_text().splitlines(), 1):
        if line.strip():
            try:
                rec = json.loads(line)
                recs[rec["run"]].append(rec)
            except (json.JSONDecodeError, KeyError, TypeError) as e:
                raise SystemExit(f"{args.trajectories}:{i}: not a trajectory record ({e})")
    runs = {run: summary(routing(rs, world), names, acc, price) for run, rs in recs.items()}
    text = markdown(runs, names, acc, price)
    print(text, end="")
    if args.out:
        args.out.write_text(text)
    if args.json:
        args.json.write_text(json.dumps(runs, indent=1) + "\n")
    if args.plot:
        plot(runs, names, acc, args.plot)
    return 0


if __name__ == "__main__":
    sys.exit(main())
