"""Rollout step time: overlapped schedule vs turn-synchronous schedule, side by side.

Both schedules run the same episodes (a scripted router that routes every hop of a
simulated question, then answers) against the real simulated pool server with realistic
latency (about 0.5-3 s per call with a heavy tail, `--latency-scale`). Generation is
emulated by a sleep of `gen_fixed + gen_per_row * rows` per call, the shape of batched
GPU decoding, so the measurement isolates the schedule.

    python scripts/bench_rollout_schedule.py [--batch 64] [--latency-scale 4] [--repeats 2]
"""
from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from router_r1.pool.client import PoolClient  # noqa: E402
from router_r1.pool.registry import ModelRegistry  # noqa: E402
from router_r1.pool.server import ServerThread, SimBackend  # noqa: E402
from router_r1.pool.sim_world import SimWorld  # noqa: E402
from router_r1.reward.score import RewardConfig  # noqa: E402
from router_r1.rollout.manager import RouterConfig, RouterEnv  # noqa: E402
from verl.trainer.dataset import PromptRow  # noqa: E402
from verl.utils.tiny import tiny_tokenizer  # noqa: E402
from verl.workers.rollout.base import GenOutput, SamplingParams  # noqa: E402

SIM = ROOT / "configs" / "pool" / "sim.yaml"
ROUTE_TO = "LLaMA-3.1-70B-Instruct"


def scripted_generate(tok, questions, gen_fixed: float, gen_per_row: float, calls: list):
    def generate(prompts, sampling):
        time.sleep(gen_fixed + gen_per_row * len(prompts))
        calls.append(len(prompts))
        outs = []
        for ids in prompts:
            q = questions[ids[0]]  # the first prompt token is the question index (see rows below)
            seen = tok.decode(ids[1:]).count("<information>")
            if seen < len(q.hops):
                text = f"<think>hop {seen}</think><search>{ROUTE_TO}: {q.hops[seen].sub_question}</search>"
            else:
                text = f"<think>done</think><answer>{q.answers[0]}</answer>"
            outs.append(GenOutput(tok(text, add_special_tokens=False)["input_ids"], "stop"))
        return outs

    return generate


def run_once(schedule: str, url: str, tok, questions, args) -> tuple[float, int]:
    registry = ModelRegistry.from_yaml(SIM, base_url=url).seen()
    env = RouterEnv(RouterConfig(max_turns=4, max_obs_length=64, response_length=64, max_response_length=2048,
                                 schedule=schedule, overlap_min_ready=args.min_ready,
                                 overlap_max_wait_s=args.max_wait), tok, registry, PoolClient(registry, max_concurrency_per_endpoint=args.concurrency),
                    RewardConfig())
    rows = [PromptRow([i], f"q{i}", {}) for i in range(len(questions))]
    calls: list[int] = []
    gen = scripted_generate(tok, questions, args.gen_fixed, args.gen_per_row, calls)
    t0 = time.perf_counter()
    result = env.rollout(rows, gen, SamplingParams(max_new_tokens=64), validate=False)
    elapsed = time.perf_counter() - t0
    env.client.close()
    assert sum(result.info["route_count"]) == sum(len(q.hops) for q in questions)
    return elapsed, len(calls)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--batch", type=int, default=64)
    p.add_argument("--latency-scale", type=float, default=2.0,
                   help="x the sim profiles' latency (the 70B expert: ~1.3 s median at 2, tail x6)")
    p.add_argument("--gen-fixed", type=float, default=0.3, help="seconds per generate call")
    p.add_argument("--gen-per-row", type=float, default=0.002, help="extra seconds per row in a call")
    p.add_argument("--repeats", type=int, default=2)
    p.add_argument("--concurrency", type=int, default=128, help="client's concurrent calls per endpoint")
    p.add_argument("--min-ready", type=float, default=0.5, help="RouterConfig.overlap_min_ready")
    p.add_argument("--max-wait", type=float, default=0.5, help="RouterConfig.overlap_max_wait_s")
    p.add_argument("--two-hop-frac", type=float, default=0.5)
    args = p.parse_args()

    tok = tiny_tokenizer()
    questions = SimWorld(seed=0).questions(args.batch, seed=7, split="test", two_hop_frac=args.two_hop_frac)
    times = {"sync": [], "overlap": []}
    gens = {}
    with ServerThread(SimBackend.from_pool_yaml(SIM, seed=0, latency_scale=args.latency_scale)) as srv:
        for _ in range(args.repeats):
            for schedule in ("sync", "overlap"):  # interleaved, so drift hits both
                t, n_gen = run_once(schedule, srv.url, tok, questions, args)
                times[schedule].append(t)
                gens[schedule] = n_gen
    sync, over = statistics.median(times["sync"]), statistics.median(times["overlap"])
    print(f"batch {args.batch}, pool latency x{args.latency_scale}, generation {args.gen_fixed}s + "
          f"{args.gen_per_row * 1000:.1f}ms/row, {args.repeats} repeats (median)")
    print(f"{'schedule':<10} {'rollout s':>10} {'generate calls':>15}")
    print(f"{'sync':<10} {sync:>10.2f} {gens['sync']:>15}")
    print(f"{'overlap':<10} {over:>10.2f} {gens['overlap']:>15}")
    print(f"speed-up of overlap over sync: {sync / over:.2f}x")


if __name__ == "__main__":
    main()
