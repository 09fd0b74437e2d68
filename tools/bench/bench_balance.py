"""Balanced vs uniform assignment of rollout requests to engines, on simulated engines.

A batch is P prompts x n samples (contiguous, as the trainer builds it); each prompt has a
turn budget drawn from 1..B. An engine plays its requests one after another, so its time
is the sum of its requests' times; a request takes budget x per-turn time x noise (the
noise is unknown to the scheduler, which only sees the budget). The step waits for the
slowest engine. Prints max-engine time and imbalance (max / mean) side by side.

    python -m tools.bench.bench_balance [--prompts 64] [--n 5] [--trials 200]
"""
from __future__ import annotations

import argparse

import numpy as np

from verl.trainer.balance import assign_balanced, assign_uniform, engine_loads, imbalance


def simulate(rng, prompts: int, n: int, max_budget: int, engines: int, turn_s: float, noise: float):
    budgets = np.repeat(rng.integers(1, max_budget + 1, size=prompts), n)  # (prompts * n,)
    times = budgets * turn_s * rng.lognormal(0.0, noise, size=budgets.size)  # what really happens
    out = {}
    for name, plan in (("uniform", assign_uniform(len(budgets), engines)),
                       ("balanced", assign_balanced(budgets.tolist(), engines))):
        per_engine = engine_loads(times, plan)
        out[name] = (max(per_engine), imbalance(per_engine))
    return out


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--prompts", type=int, default=64, help="prompts per simulated batch")
    p.add_argument("--n", type=int, default=5, help="samples per prompt")
    p.add_argument("--trials", type=int, default=200, help="batches drawn")
    p.add_argument("--turn-s", type=float, default=1.0, help="seconds per turn")
    p.add_argument("--noise", type=float, default=0.3, help="sigma of the lognormal noise on a request's time")
    p.add_argument("--seed", type=int, default=0, help="seed of the draws")
    args = p.parse_args()
    rng = np.random.default_rng(args.seed)
    print(f"{args.prompts} prompts x {args.n} samples, {args.trials} trials, per-turn {args.turn_s}s, "
          f"noise sigma {args.noise}; times are means over trials")
    header = (f"{'budgets':>8} {'engines':>7} | {'uniform max_s':>13} {'imbal':>6} | "
              f"{'balanced max_s':>14} {'imbal':>6} | {'speedup':>7}")
    print(header)
    print("-" * len(header))
    for max_budget in (6, 8):
        for engines in (2, 4, 8):
            runs = [simulate(rng, args.prompts, args.n, max_budget, engines, args.turn_s, args.noise)
                    for _ in range(args.trials)]
            u_max, u_imb = np.mean([r["uniform"] for r in runs], axis=0)
            b_max, b_imb = np.mean([r["balanced"] for r in runs], axis=0)
            print(f"{'1-' + str(max_budget):>8} {engines:>7} | {u_max:>13.1f} {u_imb:>6.3f} | "
                  f"{b_max:>14.1f} {b_imb:>6.3f} | {u_max / b_max:>6.2f}x")


if __name__ == "__main__":
    main()
