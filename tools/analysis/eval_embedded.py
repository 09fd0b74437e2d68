"""Evaluate a router checkpoint on held-out simulated questions with the real rollout and pool.

    python -m tools.analysis.eval_embedded --model data/embedded/sft --n 100

Greedy decoding, the multi-turn RouterEnv of the RL stage, and the simulated pool served
over HTTP on 127.0.0.1 (a real ServerThread). Prints format_ok, EM, mean routes and mean
cost: the numbers before (or after) PPO.
"""
from __future__ import annotations

import argparse
import sys
import time
from collections import Counter
from pathlib import Path

from sim.qa import SimConfig, draw_questions
from sim.embedded import render_compact_template
from router_r1.flags import add_flags, from_args
from router_r1.pool.registry import ModelRegistry
from router_r1.prompts import build_router_prompt, load_template
from router_r1.runtime import EnvOverrides, Policy, episode_config, episode_env, open_pool, resolve_env
from verl.trainer.dataset import PromptDataset, PromptRow
from verl.workers.rollout.base import SamplingParams
from verl.workers.rollout.hf_rollout import HFRollout

ROOT = Path(__file__).resolve().parents[2]  # the repository root
SIM_POOL = ROOT / "configs" / "pool" / "sim.yaml"


def question_rows(tokenizer, registry: ModelRegistry, n: int, template: str | None, world_seed: int) -> list[PromptRow]:
    """The first n held-out test questions of sim.qa's draw, prompted with `template`."""
    questions = draw_questions(SimConfig(out_dir=".", world_seed=world_seed, test_size=n, val_size=1,
                                         train_size=1))["test"]
    template = template or render_compact_template(registry)
    rows = []
    for q in questions:
        text = tokenizer.apply_chat_template(build_router_prompt(q.question, registry, template),
                                             add_generation_prompt=True, tokenize=False)
        rows.append(PromptRow(tokenizer(text, add_special_tokens=False)["input_ids"], q.uid,
                              {"reward_model": {"ground_truth": {"target": q.answers}}, "question": q.question,
                               "data_source": "sim_1hop" if len(q.hops) == 1 else "sim_2hop"}))
    return rows


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model", required=True, help="HF model directory (with its tokenizer unless --tokenizer)")
    p.add_argument("--tokenizer", default=None, help="tokenizer directory (default: --model)")
    p.add_argument("--n", type=int, default=100, help="held-out questions")
    p.add_argument("--data", default=None, help="a sim.qa parquet (e.g. test.parquet) instead of drawing questions")
    p.add_argument("--template", default=None, help="prompt template file (default: compact template + compact pool)")
    p.add_argument("--pool", default=str(SIM_POOL), help="pool yaml, served simulated")
    p.add_argument("--world-seed", type=int, default=0, help="seed of the simulated world (must match the data's)")
    # the episode's env: the checkpoint's run_config.yaml, else configs/embedded.yaml's; a flag overrides a key
    add_flags(p, EnvOverrides)
    p.add_argument("--batch-size", type=int, default=64, help="rows per generate call")
    p.add_argument("--show", type=int, default=2, help="print this many trajectories")
    args = p.parse_args(argv)
    env_cfg = episode_config(resolve_env([args.model], from_args(EnvOverrides, args), fallback="embedded"),
                             schedule="sync")

    from transformers import AutoModelForCausalLM, AutoTokenizer

    tok = AutoTokenizer.from_pretrained(args.tokenizer or args.model)
    model = AutoModelForCausalLM.from_pretrained(args.model)
    with open_pool(args.pool, sim=True, sim_seed=args.world_seed, call_timeout_s=env_cfg.call_timeout_s,
                   call_deadline_s=env_cfg.call_deadline_s, max_concurrency=env_cfg.max_concurrency) as pool:
        if args.data:
            rows = PromptDataset(args.data, tok, limit=args.n).rows
        else:
            template = load_template(args.template) if args.template else None
            rows = question_rows(tok, pool.registry, args.n, template, args.world_seed)
        rollout = HFRollout(model, tok, max_batch_size=args.batch_size)
        env = episode_env(env_cfg, Policy(tok, rollout.generate), pool)
        t0 = time.perf_counter()
        result = env.rollout(rows, rollout.generate, SamplingParams(greedy=True), validate=True)
        seconds = time.perf_counter() - t0
        scores, m = env.score(result, rows, validate=True)

    n = len(rows)
    mean = lambda k: sum(m[k]) / n  # noqa: E731
    calls = Counter({k[len("calls/"):]: int(sum(v)) for k, v in m.items() if k.startswith("calls/") and sum(v)})
    print(f"n={n} format_ok={mean('format_ok'):.3f} em={mean('em'):.3f} f1={mean('f1'):.3f} "
          f"routes={mean('route_count'):.2f} cost={1e6 * mean('cost_usd'):.2f}e-6 USD "
          f"score={float(scores.mean()):.3f} hit_budget={mean('hit_budget'):.2f} rollout_s={seconds:.1f}")
    print("calls: " + ", ".join(f"{k}={v}" for k, v in calls.most_common()))
    sources = [r.fields.get("data_source", "?") for r in rows]
    for src in sorted(set(sources)):
        idx = [i for i, s in enumerate(sources) if s == src]
        print(f"  {src}: n={len(idx)} em={sum(m['em'][i] for i in idx) / len(idx):.3f} "
              f"format_ok={sum(m['format_ok'][i] for i in idx) / len(idx):.3f}")
    for i in range(min(args.show, n)):
        print(f"--- {rows[i].fields.get('question') or rows[i].uid}\n{result.info['text'][i]}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
