"""Rollout time under each schedule, side by side in one run, on one emulated engine.

Every mode plays the same episodes (a scripted router that routes each hop of a simulated
question to the 70B expert, then answers) against the real simulated pool server with
realistic latency (about 0.5-3 s per call with a heavy tail at `--latency-scale 2`). Each
run gets a fresh server with the repeat's seed, so every mode draws the same latencies (the
server's latency stream, handed out in arrival order); repeats draw new ones.
The engine is emulated with one cost model for all modes, the shape of GPU decoding:
a decode step costs `step_ms + step_row_us * rows`, a prefill `prefill_us` per token
(defaults: 5 ms + 25 us/row, about the H200's 3B hf_static rate of 22.3k tok/s at 256 rows
in docs/results; 10 us/token prefill).

    sync          every turn: one batch generate for all live episodes, then all pool calls
    overlap       the earlier queue: a batch generate for whoever is ready (share/wait knobs)
    per-episode   one coroutine per episode over `as_async` of the batch engine
    continuous    one coroutine per episode over SlotEngine (the hf_static scheduler itself,
                  on an emulated runner): requests join/leave at step boundaries and a later
                  turn prefills only the tokens its slot does not already hold

    streaming     training steps, not one rollout (`--steps` of them, each followed by an emulated
                  update of `--update-s` seconds): StreamingRollout (verl/trainer/streaming.py) keeps
                  `--in-flight` x batch episodes in play over the SlotEngine, a step takes the first
                  batch that finish, decoding pauses during the update while pool calls go on
                  (staleness bound `--max-staleness`). Its baselines run the same steps: sync
                  (one batch rollout, then the update) and continuous; its speedup lines are per
                  training step against those.

    python -m tools.bench.bench_rollout_schedule [--batch 64] [--latency-scale 2] [--repeats 2]

With `--model DIR` (an HF model directory, e.g. a pipeline's SFT policy, with its
prompt_template.txt) the engine is real instead: hf_static (`SlotRollout`) decoding that
policy greedily on `--device`; sync/overlap/per-episode use its batch path, continuous its
slots. The episodes are then whatever the policy writes (the same in every mode, up to
numerics), and the route-count check is skipped.

    python -m tools.bench.bench_rollout_schedule --model outputs/gpu_pipeline/sft --device cuda --batch 128

Ends with one line per mode: `speedup <mode> vs sync: N.NNx`.
"""
from __future__ import annotations

import argparse
import statistics
import time
from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path
from typing import Optional

import torch

from router_r1.flags import add_flags, from_args
from router_r1.pool.client import PoolClient
from router_r1.pool.registry import ModelRegistry
from router_r1.pool.server import ServerThread
from sim.backend import SimBackend
from sim.world import SimWorld
from router_r1.prompts import build_router_prompt, load_template
from router_r1.router_env import RouterEnvConfig, make_env
from verl.trainer.dataset import PromptRow
from verl.trainer.streaming import StreamingRollout
from verl.utils.tiny import tiny_tokenizer
from verl.workers.rollout.base import GenOutput, SamplingParams, as_async
from verl.workers.rollout.slot_engine import SlotEngine

ROOT = Path(__file__).resolve().parents[2]  # the repository root
SIM = ROOT / "configs" / "pool" / "sim.yaml"
ROUTE_TO = "LLaMA-3.1-70B-Instruct"
MODES = ("sync", "overlap", "per-episode", "continuous", "streaming")
THINK = "I should ask a bigger model about this part of the question before I answer it."


@dataclass
class Emulation:
    """The emulated engine, the pool's latency and the episodes' lengths: the settings Cost, bench_env and the engines
    read, flags of this benchmark and of bench_stream_convoy (router_r1/flags.py)."""

    batch: int = 64  # episodes per step
    latency_scale: float = 2.0  # x the sim profiles' latency (the 70B expert: ~1.3 s median at 2, tail x6)
    step_ms: float = 5.0  # fixed milliseconds per decode step
    step_row_us: float = 25.0  # extra microseconds per row in a step
    prefill_us: float = 10.0  # microseconds per prefilled token
    chunk: int = 8  # continuous: decode steps between joins
    concurrency: int = 128  # client's concurrent calls per endpoint
    response_length: int = 128  # tokens per generated turn
    max_obs_length: int = 64  # tokens per <information> block
    min_ready: float = 0.5  # overlap: env.overlap_min_ready
    max_wait: float = 0.5  # overlap: env.overlap_max_wait_s


@dataclass
class ScheduleBench(Emulation):
    """This benchmark's settings, each a flag."""

    repeats: int = 2  # timed repeats per mode
    two_hop_frac: float = 0.5  # share of two-hop questions
    modes: str = ",".join(MODES)  # comma-separated schedules to time
    steps: int = 4  # streaming: training steps per mode and repeat
    update_s: float = 2.5  # streaming: seconds of emulated update per step (the H200 270M pipeline's training ~2.5 s)
    in_flight: float = 2.0  # streaming: episodes in play, x the batch
    max_staleness: int = 1  # streaming: trainer.max_staleness
    baselines: str = "sync,continuous"  # streaming: the step modes it is compared with
    model: Optional[str] = None  # an HF model directory: decode it with hf_static instead
    device: str = "cpu"  # --model: the device it decodes on
    max_model_len: int = 4096  # --model: hf_static's cache length


class Script:
    """The scripted policy: the next turn's tokens from an episode's context."""

    def __init__(self, tok, questions, prompt_len: int):
        self.tok, self.questions, self.prompt_len = tok, questions, prompt_len
        self._cache: dict[tuple[int, int], list[int]] = {}

    def hop_of(self, ids: list[int]) -> tuple[int, int]:
        q = ids[0] * 256 + ids[1]  # the first two prompt tokens are the question index (see rows below)
        return q, self.tok.decode(ids[self.prompt_len:]).count("<information>")

    def turn(self, ids: list[int]) -> list[int]:
        key = self.hop_of(ids)
        if key not in self._cache:
            q = self.questions[key[0]]
            seen = key[1]
            if seen < len(q.hops):
                text = f"<think>hop {seen}: {THINK}</think><search>{ROUTE_TO}: {q.hops[seen].sub_question}</search>"
            else:
                text = f"<think>done: {THINK}</think><answer>{q.answers[0]}</answer>"
            self._cache[key] = self.tok(text, add_special_tokens=False)["input_ids"]
        return self._cache[key]


class Cost:
    def __init__(self, args):
        self.step_s, self.row_s, self.prefill_s = args.step_ms / 1e3, args.step_row_us / 1e6, args.prefill_us / 1e6
        self.prefill_tokens = 0
        self.steps = 0

    def prefill(self, n_tokens: int) -> None:
        self.prefill_tokens += n_tokens
        time.sleep(self.prefill_s * n_tokens)

    def step(self, rows: int, n: int = 1) -> None:
        self.steps += n
        time.sleep(n * (self.step_s + self.row_s * rows))


def batch_engine(script: Script, cost: Cost, calls: list):
    """A batch generate: prefill every prompt whole, then decode until the longest turn ends."""
    def generate(prompts, sampling):
        turns = [script.turn(p) for p in prompts]
        cost.prefill(sum(len(p) for p in prompts))
        cost.step(len(prompts), max(len(t) for t in turns) - 1)
        calls.append(len(prompts))
        return [GenOutput(t, "stop") for t in turns]
    return generate


class EmulatedSlots:
    """A SlotRunner whose model is the script: same interface and bookkeeping as SlotRollout."""

    def __init__(self, script: Script, cost: Cost, n_slots: int, max_len: int, pad: int):
        self.script, self.cost, self.n_slots, self.max_len, self.pad = script, cost, n_slots, max_len, pad
        self.out: list[list[int]] = [[] for _ in range(n_slots)]
        self.turn: list[list[int]] = [[] for _ in range(n_slots)]
        self.active = [False] * n_slots
        self.prefill_by_hop: dict[int, list[tuple[int, int]]] = defaultdict(list)  # hop -> (prefilled, prompt)

    def start(self, slot, ids, reuse, sampling, u) -> None:
        self.cost.prefill(len(ids) - reuse)
        self.prefill_by_hop[self.script.hop_of(ids)[1]].append((len(ids) - reuse, len(ids)))
        self.turn[slot] = self.script.turn(ids)
        self.out[slot] = self.turn[slot][:1]
        self.active[slot] = True

    def steps(self, n, sampling) -> None:
        live = [s for s in range(self.n_slots) if self.active[s]]
        self.cost.step(len(live), n)
        for s in live:
            t = self.turn[s]
            k = len(self.out[s])
            self.out[s] += t[k:k + n] + [self.pad] * max(0, k + n - len(t))

    def read(self, slots, starts):
        return [(self.out[s][a:], [0.0] * (len(self.out[s]) - a)) for s, a in zip(slots, starts)]

    def stop(self, slot) -> None:
        self.active[slot] = False


class RealEngine:
    """hf_static on a real policy: its batch path (counting prefilled tokens) and its slots."""

    def __init__(self, args):
        from transformers import AutoModelForCausalLM

        from verl.utils.tokenizer import load_tokenizer
        from verl.workers.rollout import build_rollout

        self.tok = load_tokenizer(args.model)
        model = AutoModelForCausalLM.from_pretrained(args.model, dtype=torch.bfloat16 if
                                                     args.device.startswith("cuda") else torch.float32)
        self.roll = build_rollout({"name": "hf_static", "device": args.device, "max_batch_size": args.batch,
                                   "max_model_len": args.max_model_len}, model, self.tok)
        self.prefill = 0

    def generate(self, prompts, sampling):
        self.prefill += sum(len(p) for p in prompts)
        return self.roll.generate(prompts, sampling)


def bench_env(url: str, schedule: str, tok, args):
    """The routing environment of the benchmark: the sim pool at `url`, four routing turns, `schedule`."""
    registry = ModelRegistry.from_yaml(SIM, base_url=url).seen()
    return make_env(RouterEnvConfig(max_turns=4, max_obs_length=args.max_obs_length, response_length=args.response_length,
                                    max_response_length=2048, schedule=schedule, overlap_min_ready=args.min_ready,
                                    overlap_max_wait_s=args.max_wait),
                    tok, registry=registry, client=PoolClient(registry, max_concurrency_per_endpoint=args.concurrency))


def run_steps(mode: str, url: str, tok, rows, script: Script | None, args, real: RealEngine | None = None) -> dict:
    """`args.steps` training steps of `args.batch` episodes, each followed by `args.update_s` of emulated
    update: sync and continuous play one batch per step; streaming takes the first batch to finish."""
    env, b = bench_env(url, "continuous" if mode == "streaming" else mode, tok, args), args.batch
    slots = int(args.in_flight * b) if mode == "streaming" else b
    if real is not None:
        engine = real.roll if mode != "sync" else real.generate
    elif mode == "sync":
        engine = batch_engine(script, Cost(args), [])
    else:
        engine = SlotEngine(EmulatedSlots(script, Cost(args), n_slots=slots, max_len=1 << 16, pad=tok.pad_token_id),
                            tok, eos_ids=[], chunk=args.chunk)
    sampling = SamplingParams(greedy=True, temperature=0.0, max_new_tokens=args.response_length)
    out = {"wait": [], "drain": [], "staleness": [], "dropped": 0.0}
    t0 = time.perf_counter()
    if mode == "streaming":
        starts = iter(range(0, 1 << 30, b))

        def draw() -> list[int]:  # the rows in the order the other modes play them, batch by batch
            first = next(starts)
            return [(first + i) % len(rows) for i in range(b)]

        stream = StreamingRollout(env, engine, draw=draw, rows_of=lambda i: [rows[i]], sampling=lambda v: sampling,
                                  in_flight=slots, max_staleness=args.max_staleness)
        for k in range(args.steps):
            _, m = stream.take(b, version=k)
            out["wait"].append(m["timing/stream_wait"])
            out["drain"].append(m["timing/stream_drain"])
            out["staleness"].append(m["stream/staleness_mean"])
            out["dropped"] = m["stream/dropped_total"]
            time.sleep(args.update_s)  # decoding paused, pool calls going on
        stream.close()
    else:
        for k in range(args.steps):
            start = time.perf_counter()
            env.rollout([rows[(k * b + i) % len(rows)] for i in range(b)], engine, sampling, validate=False)
            out["wait"].append(time.perf_counter() - start)
            time.sleep(args.update_s)
    out["s"] = time.perf_counter() - t0
    env.client.close()
    return out


def run_once(mode: str, url: str, tok, rows, script: Script | None, args, real: RealEngine | None = None) -> dict:
    env = bench_env(url, {"per-episode": "continuous"}.get(mode, mode), tok, args)
    cost, calls, slots = Cost(args), [], None
    if real is not None:
        real.prefill, stats = 0, real.roll.engine.stats
        before = (stats.prefill_tokens, stats.steps)
        engine = {"per-episode": as_async(real.generate), "continuous": real.roll}.get(mode, real.generate)
    else:
        engine = batch_engine(script, cost, calls)
        if mode == "per-episode":
            engine = as_async(engine)
        elif mode == "continuous":
            slots = EmulatedSlots(script, cost, n_slots=len(rows), max_len=1 << 16, pad=tok.pad_token_id)
            engine = SlotEngine(slots, tok, eos_ids=[], chunk=args.chunk)
    sampling = SamplingParams(greedy=True, temperature=0.0, max_new_tokens=args.response_length)
    t0 = time.perf_counter()
    result = env.rollout(rows, engine, sampling, validate=False)
    elapsed = time.perf_counter() - t0
    env.client.close()
    # no schedule can finish before the episode whose own pool calls took longest has made them
    path = max(result.info["pool_latency_s"])
    if real is not None:
        prefill = real.prefill + stats.prefill_tokens - before[0]
        return {"s": elapsed, "prefill": prefill, "steps": stats.steps - before[1], "calls": 0, "by_hop": None,
                "responses": result.response_ids, "routes": sum(result.info["route_count"]), "path": path}
    want = sum(len(script.questions[script.hop_of(r.prompt_ids)[0]].hops) for r in rows)
    if sum(result.info["route_count"]) != want:
        raise RuntimeError(f"{mode}: {sum(result.info['route_count'])} pool calls, expected {want}")
    return {"s": elapsed, "prefill": cost.prefill_tokens, "steps": cost.steps, "calls": len(calls),
            "by_hop": slots.prefill_by_hop if slots else None, "responses": result.response_ids,
            "routes": want, "path": path}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_flags(p, ScheduleBench)
    args = from_args(ScheduleBench, p.parse_args())
    modes = args.modes.split(",")
    if args.device == "cpu":
        torch.set_num_threads(1)

    roll = [m for m in modes if m != "streaming"]  # the one-rollout modes
    n_questions = args.batch * 4 if "streaming" in modes else args.batch  # steps cycle through them
    questions = SimWorld(seed=0).questions(n_questions, seed=7, split="test", two_hop_frac=args.two_hop_frac)
    registry = ModelRegistry.from_yaml(SIM, base_url="http://unused").seen()
    real, script = (RealEngine(args), None) if args.model else (None, None)
    if real is not None:
        tok = real.tok
        tpl = Path(args.model) / "prompt_template.txt"
        template = load_template(tpl) if tpl.exists() else None
        rows, body = [], []
        for i, q in enumerate(questions):
            text = tok.apply_chat_template(build_router_prompt(q.question, registry, template),
                                           add_generation_prompt=True, tokenize=False)
            rows.append(PromptRow(tok(text, add_special_tokens=False)["input_ids"], f"q{i}", {}))
        body = rows[0].prompt_ids[1:]
    else:
        tok = tiny_tokenizer()
        text = tok.apply_chat_template(build_router_prompt("{question}", registry), add_generation_prompt=True,
                                       tokenize=False)
        body = tok(text, add_special_tokens=False)["input_ids"]
        rows = [PromptRow([i // 256, i % 256] + body, f"q{i}", {}) for i in range(len(questions))]
        script = Script(tok, questions, prompt_len=2 + len(body))
    runs: dict[str, list[dict]] = {m: [] for m in roll}
    step_modes = [*args.baselines.split(","), "streaming"] if "streaming" in modes else []
    if step_modes and ("sync" not in step_modes or not set(step_modes) <= {"sync", "continuous", "streaming"}):
        raise SystemExit(f"--baselines: sync, and continuous if wanted; got {args.baselines!r}")
    steps: dict[str, list[dict]] = {m: [] for m in step_modes}
    for rep in range(args.repeats):
        for mode in roll:  # interleaved, so drift hits every mode
            with ServerThread(SimBackend.from_pool_yaml(SIM, seed=rep, latency_scale=args.latency_scale)) as srv:
                runs[mode].append(run_once(mode, srv.url, tok, rows[:args.batch], script, args, real))
        for mode in steps:
            with ServerThread(SimBackend.from_pool_yaml(SIM, seed=rep, latency_scale=args.latency_scale)) as srv:
                steps[mode].append(run_steps(mode, srv.url, tok, rows, script, args, real))
    if roll:
        report_rollouts(roll, runs, args, real, len(rows[0].prompt_ids))
    if steps:
        report_steps(steps, args)


def report_steps(steps: dict[str, list[dict]], args) -> None:
    """The streaming comparison: seconds per training step (rollout wait + the emulated update), paired."""
    b, k = args.batch, args.steps
    print(f"training steps: {k} steps of {b} episodes, each + {args.update_s:g} s of emulated update; streaming "
          f"keeps {args.in_flight:g}x the batch in play (max staleness {args.max_staleness})")
    print(f"{'mode':<12} {'s/step':>8} {'per repeat s/step':>24} {'waited s/step':>14} {'drain s':>8} "
          f"{'staleness':>10} {'dropped':>8}")
    for m, rs in steps.items():
        per = [r["s"] / k for r in rs]
        wait = statistics.mean(x for r in rs for x in r["wait"])
        drain = statistics.mean(x for r in rs for x in r["drain"]) if rs[0]["drain"] else 0.0
        stale = statistics.mean(x for r in rs for x in r["staleness"]) if rs[0]["staleness"] else 0.0
        dropped = statistics.mean(r["dropped"] for r in rs)
        print(f"{m:<12} {statistics.median(per):>8.2f} {' '.join(f'{x:.2f}' for x in per):>24} {wait:>14.2f} "
              f"{drain:>8.2f} {stale:>10.2f} {dropped:>8.1f}")
    for base in [m for m in steps if m != "streaming"]:
        ratios = [x["s"] / s["s"] for x, s in zip(steps[base], steps["streaming"])]
        print(f"  streaming vs {base}: per-repeat speedups " + " ".join(f"{x:.2f}" for x in ratios))
    for base in [m for m in steps if m != "streaming"]:
        ratios = [x["s"] / s["s"] for x, s in zip(steps[base], steps["streaming"])]
        print(f"speedup streaming vs {base}: {statistics.median(ratios):.2f}x")


def report_rollouts(modes: list[str], runs: dict[str, list[dict]], args, real, prompt_len: int) -> None:
    """One rollout of one batch per mode (the schedules' comparison)."""
    rows = args.batch
    for m in modes:  # the same episodes as the first mode's with the same latency seed (its replies)
        differ = max(sum(a != b for a, b in zip(r["responses"], f["responses"])) for r, f in zip(runs[m], runs[modes[0]]))
        if differ and real is None:
            raise RuntimeError(f"{m}: episodes differ from {modes[0]}'s")
        if differ:  # a real model in bf16: batch composition may flip a near-tie argmax
            print(f"note: {m}: up to {differ} of {rows} greedy episodes differ from {modes[0]}'s")

    hops = runs[modes[0]][0]["routes"]
    engine = (f"hf_static on {args.model} ({args.device})" if real else
              f"emulated: step {args.step_ms} ms + {args.step_row_us} us/row, prefill {args.prefill_us} us/token")
    print(f"batch {args.batch} ({hops} pool calls, prompt {prompt_len} tokens), pool latency x{args.latency_scale}, "
          f"{engine}, "
          f"{args.repeats} repeats (median; latency seeds 0..{args.repeats - 1})")
    print("rollout s: median over repeats; per repeat: rollout s / the slowest episode's own pool time (a floor "
          "for any schedule)")
    print(f"{'mode':<12} {'rollout s':>10} {'per repeat':>32} {'gen calls':>10} {'steps':>7} {'prefill tok':>12}")
    med = {m: statistics.median(r["s"] for r in runs[m]) for m in modes}
    for m in modes:
        r = runs[m][-1]
        each = " ".join(f"{x['s']:.1f}/{x['path']:.1f}" for x in runs[m])
        print(f"{m:<12} {med[m]:>10.2f} {each:>32} {r['calls'] or '-':>10} {r['steps']:>7} {r['prefill']:>12}")
    if "continuous" in modes and real is None:
        by_hop = runs["continuous"][-1]["by_hop"]
        print("continuous prefill per request, by turn (tokens prefilled / context tokens without reuse):")
        for h in sorted(by_hop):
            done, full = sum(a for a, _ in by_hop[h]), sum(b for _, b in by_hop[h])
            print(f"  turn {h + 1}: {len(by_hop[h]):>3} requests, {done / len(by_hop[h]):>8.1f} / "
                  f"{full / len(by_hop[h]):>8.1f}  ({1 - done / full:.1%} saved)")
        total = sum(b for v in by_hop.values() for _, b in v)
        print(f"prefill tokens per rollout: {runs['continuous'][-1]['prefill']} with reuse, {total} without "
              f"({total / max(runs['continuous'][-1]['prefill'], 1):.2f}x)")
    if "sync" in modes:  # paired: each repeat's ratio (same latency draws), then the median
        for m in modes:
            if m != "sync":
                ratios = [s["s"] / x["s"] for s, x in zip(runs["sync"], runs[m])]
                print(f"  {m}: per-repeat speedups " + " ".join(f"{x:.2f}" for x in ratios))
        for m in modes:
            if m != "sync":
                ratios = [s["s"] / x["s"] for s, x in zip(runs["sync"], runs[m])]
                print(f"speedup {m} vs sync: {statistics.median(ratios):.2f}x")


if __name__ == "__main__":
    main()
