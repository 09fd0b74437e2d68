"""Choose the alpha of an alpha-conditioned router that meets a cost target on a validation file.

    python -m router_r1.calibrate --checkpoint RUN --data val.parquet --target-cost-per-1k 0.03
    python -m router_r1.calibrate --checkpoint RUN --data val.parquet --target-dear-share 0.25 --alphas 0 0.3 0.6 0.9

The router is evaluated at each candidate alpha (stated in every prompt, as in training and
serving) on the same questions through the evaluation path; the choice is the alpha with the
best EM among those whose cost per 1,000 questions (USD), or whose share of calls to the
dearest model, is at or under the target (RouteLLM calibrates its threshold on a target share
of strong-model calls the same way). Writes calibration.json under --out and prints a table.
No alpha meets the target: exit code 1, with the cheapest point reached. A checkpoint whose run config
does not say it takes alphas (env.alphas) is refused: it was trained at one alpha.
"""
from __future__ import annotations

import json
import math
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Optional

from router_r1.eval.evaluate import (USER_ERRORS, EvalRow, check_row_prompts, load_rows, find_data_files, records_of,
                                     router_episodes, score)
from router_r1.eval.report import bootstrap_ci
from router_r1.flags import from_args, parser_for, run_command
from router_r1.prompts import build_router_prompt
from router_r1.router_env import RouterEnvConfig
from router_r1.routing_collapse import shares_entropy, call_counts
from router_r1.trained_names import check_trained_names
from router_r1.runtime import (EnvOverrides, EvalError, Policy, Pool, PoolFlags, episode_config, fit_context,
                               load_policy, quiet_transformers, resolve_checkpoint, tokenize_prompt)
from router_r1.serve_engine import MODEL_NAME, load_run_settings, model_id, pool_flags
from verl.workers.rollout.base import SamplingParams


def dearest(pool: Pool) -> str:
    """The model of the router's pool with the highest output price."""
    return max(pool.registry.models.values(), key=lambda s: s.price_out_per_m).name


def router_records(policy: Policy, pool: Pool, rows: list[EvalRow], rcfg: RouterEnvConfig, alpha: float | None,
                   label: str, batch_size: int = 64, sampling: SamplingParams | None = None) -> list[dict]:
    """Scored trajectory records of the router on `rows`: with `alpha`, prompts rebuilt from the questions with
    that cost weight stated; with None, the rows' own prompts. The reward column uses `alpha` (0 for None) and
    rcfg's format_rules and reward_metric (the training run's)."""
    if alpha is None:
        check_row_prompts(rows, policy)
        messages = [r.messages for r in rows]
    else:
        for r in rows:
            if not r.question:
                raise EvalError(f"{r.where}: field 'extra_info.question' is missing; the prompt is rebuilt from it")
        messages = [build_router_prompt(r.question, pool.registry, policy.template, alpha=alpha) for r in rows]
    prompts = [tokenize_prompt(policy.tokenizer, m) for m in messages]
    rcfg = fit_context(prompts, [r.where for r in rows], policy, rcfg)
    sampling = sampling or SamplingParams(greedy=True, temperature=0.0)
    records = records_of(label, rows, router_episodes(prompts, policy, pool, rcfg, sampling, batch_size))
    score(records, pool.registry, alpha or 0.0, rcfg.format_rules, rcfg.reward_metric)
    return records


@dataclass
class Point:
    alpha: float
    n: int
    em: float
    em_ci95: tuple[float, float]
    cost_per_1k_usd: float
    dear_share: float  # share of all calls that went to the dearest model
    calls_per_question: float
    call_shares: dict
    entropy_bits: float


def point(alpha: float, records: list[dict], pool: Pool) -> Point:
    counts = call_counts([r["turns"] for r in records], pool.registry.names)
    shares, entropy = shares_entropy(counts)
    n = len(records)
    return Point(alpha, n, sum(r["em"] for r in records) / n, bootstrap_ci([r["em"] for r in records]),
                 1000 * sum(r["cost_usd"] for r in records) / n, shares[dearest(pool)],
                 sum(counts.values()) / n, shares, entropy)


def choose(points: list[Point], target: float, metric: str) -> Point | None:
    """The best-EM point whose `metric` is at or under `target` (ties: the smaller alpha), or None."""
    ok = [p for p in points if getattr(p, metric) <= target + 1e-12]
    return max(ok, key=lambda p: (p.em, -p.alpha)) if ok else None


@dataclass
class CalibrateConfig(PoolFlags, EnvOverrides):
    """Calibration's settings; each field is a flag of `python -m router_r1.calibrate` (router_r1/flags.py)."""

    checkpoint: str = field(default="", metadata={"required": True})  # an alpha-conditioned run's output dir or HF export
    data: list[str] = field(default_factory=list, metadata={"required": True})  # validation parquet file(s)
    target_cost_per_1k: Optional[float] = None  # the target: USD per 1,000 questions (give this or --target-dear-share)
    target_dear_share: Optional[float] = None  # the target: share of calls to the dearest model, in [0, 1]
    alphas: Optional[list[float]] = None  # candidate alphas (default: the run's env.alphas, those it was trained on)
    pool: Optional[str] = None  # pool yaml (default: the run's, in-process when simulated, else at the run's env.pool_url)
    limit: Optional[int] = None  # first N rows of each file
    batch_size: int = 64  # rows per generate call
    device: Optional[str] = None  # torch device (default: cuda if available)
    out: str = "outputs/calibration"  # output dir of calibration.json


def parse_args(argv: list[str] | None = None) -> CalibrateConfig:
    p = parser_for(CalibrateConfig, "python -m router_r1.calibrate", __doc__.split("\n\n")[0])
    a = from_args(CalibrateConfig, p.parse_args(argv))
    if (a.target_cost_per_1k is None) == (a.target_dear_share is None):
        p.error("give one of --target-cost-per-1k and --target-dear-share")
    return a


def calibrate(a: CalibrateConfig, log=print) -> dict:
    """Evaluate every candidate alpha, choose one, write calibration.json; returns what it wrote."""
    if a.target_dear_share is not None and not 0 <= a.target_dear_share <= 1:
        raise EvalError(f"--target-dear-share must be in [0, 1], got {a.target_dear_share}")
    if a.target_cost_per_1k is not None and not a.target_cost_per_1k >= 0:
        raise EvalError(f"--target-cost-per-1k must be >= 0, got {a.target_cost_per_1k}")
    if a.alphas is not None and any(not 0 <= x <= 1 for x in a.alphas):
        raise EvalError(f"--alphas must lie in [0, 1], got {a.alphas}")
    ckpt = resolve_checkpoint(a.checkpoint)
    settings = load_run_settings(ckpt, a)
    if not settings.alphas:  # every alpha would be stated to a router that never read one: its EM would mislead
        raise EvalError(f"{ckpt}: nothing to calibrate: {settings.fixed_alpha()}")
    alphas = sorted(set(settings.alphas if a.alphas is None else a.alphas))
    untrained = [x for x in alphas if x not in settings.alphas]
    if untrained:
        log(f"warning: alphas {' '.join(f'{x:g}' for x in untrained)} are not among the trained "
            f"{list(settings.alphas)} ({settings.source}); a conditioned router snaps those to a trained one")
    rows = load_rows(find_data_files(a.data), a.limit)
    metric, target = (("cost_per_1k_usd", a.target_cost_per_1k) if a.target_cost_per_1k is not None
                      else ("dear_share", a.target_dear_share))
    env = settings.env
    with pool_flags(a, settings).open(env, settings.pool) as pool:
        log(f"pool: {pool.where}")
        check_trained_names(ckpt, pool.registry, None, a.allow_unseen_models, log)
        quiet_transformers()
        policy = load_policy(ckpt, a.device, max_batch_size=a.batch_size, constrain_names=env.constrain_names)
        rcfg = episode_config(env, schedule="sync")
        points = []
        for alpha in alphas:
            points.append(point(alpha, router_records(policy, pool, rows, rcfg, alpha, f"alpha={alpha:g}",
                                                      a.batch_size), pool))
            p = points[-1]
            log(f"alpha {alpha:<4g} EM {p.em:.3f}  cost/1k ${p.cost_per_1k_usd:.4f}  {dearest(pool)} share "
                f"{p.dear_share:.2f}  calls/q {p.calls_per_question:.2f}  entropy {p.entropy_bits:.2f} bits")
        best = choose(points, target, metric)
        out = {"checkpoint": str(ckpt), "data": a.data, "n": len(rows), "target": {metric: target},
               "dearest_model": dearest(pool),
               "settings": EnvOverrides.values_in(env),
               "settings_from": settings.source, "pool": pool.where,
               "chosen_alpha": None if best is None else best.alpha,
               "model": None if best is None else model_id(MODEL_NAME, best.alpha),  # the server's id for it
               "points": [{k: (None if isinstance(v, float) and math.isnan(v) else v) for k, v in p.__dict__.items()}
                          for p in points]}
    Path(a.out).mkdir(parents=True, exist_ok=True)
    (Path(a.out) / "calibration.json").write_text(json.dumps(out, indent=2))
    if best is None:
        cheapest = min(points, key=lambda p: getattr(p, metric))
        log(f"no alpha meets {metric} <= {target:g}; the lowest reached is {getattr(cheapest, metric):.4g} "
            f"at alpha {cheapest.alpha:g}")
    else:
        log(f"chosen alpha {best.alpha:g}: EM {best.em:.3f}, {metric} {getattr(best, metric):.4g} <= {target:g} "
            f"(serve it as {out['model']}); wrote {Path(a.out) / 'calibration.json'}")
    return out


def main(argv: list[str] | None = None) -> int:
    a = parse_args(argv)
    return run_command(lambda: calibrate(a), USER_ERRORS, lambda out: 0 if out["chosen_alpha"] is not None else 1,
                       code=2)


if __name__ == "__main__":
    sys.exit(main())
