"""Does the update slow down beside a streaming rollout? Small torch ops (the launch-bound update of a
small policy, as in tools/bench/bench_gil_convoy.py) counted per second in three states:

    alone      no rollout in the process
    decoding   beside a StreamingRollout whose gate is open: episodes decode and call the pool
               (what one-step off-policy does while the update runs)
    paused     beside the same rollout after `take` closed the gate: no decoding, the pool calls in
               flight go on (what streaming does while the update runs)

The rollout is the real one (RouterEnv, StreamingRollout, PoolClient) against the simulated pool
server in a process of its own at realistic latency; the policy is the scripted router of
tools/bench/bench_rollout_schedule.py and the engine its emulated SlotEngine, whose decode step spends
`--decode-host-ms` in Python (the host side of a decode step: scheduler, sampling, stop checks,
kernel launches) and the rest of `--step-ms` asleep (the device's share, no interpreter lock held).

    python -m tools.bench.bench_stream_convoy [--batch 32] [--window-s 2] [--cycles 4]

Prints ops/s per state (median over cycles), each state's slowdown against alone, and the paired
ratio of adjacent paused and decoding windows (the machine's drift cancels there).
"""
from __future__ import annotations

import json
import re
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

import torch

from router_r1.flags import from_args, parser_for
from router_r1.pool.registry import ModelRegistry
from sim.world import SimWorld
from router_r1.prompts import build_router_prompt
from verl.trainer.dataset import PromptRow
from verl.trainer.streaming import StreamingRollout
from verl.utils.tiny import tiny_tokenizer
from verl.workers.rollout.base import SamplingParams
from verl.workers.rollout.slot_engine import SlotEngine
from tools.bench.bench_rollout_schedule import ROOT, SIM, Cost, EmulatedSlots, Emulation, Script, bench_env


@dataclass
class ConvoyBench(Emulation):
    """This benchmark's settings, each a flag but the overlap schedule's (the rollout here is continuous)."""

    batch: int = 32  # episodes per take; 2x that in play
    decode_host_ms: float = 2.0  # Python per decode step (of --step-ms)
    window_s: float = 2.0  # seconds each state's ops are counted
    cycles: int = 4  # timed cycles
    min_ready: float = field(default=0.5, metadata={"no_flag": True})
    max_wait: float = field(default=0.5, metadata={"no_flag": True})


class HostBoundCost(Cost):
    """A decode step: `host_s` of host work (small torch ops, as kernel launches, and a little Python
    between them), then the device's share asleep."""

    def __init__(self, args):
        super().__init__(args)
        self.host_s = args.decode_host_ms / 1e3
        self.y = torch.zeros(8)

    def step(self, rows: int, n: int = 1) -> None:
        self.steps += n
        for _ in range(n):
            end = time.perf_counter() + self.host_s
            while time.perf_counter() < end:
                for _ in range(20):
                    self.y.add_(1.0)
                json.dumps({"rows": rows})
            time.sleep(max(0.0, self.step_s + self.row_s * rows - self.host_s))


def ops_per_s(window_s: float, x: torch.Tensor) -> float:
    """Small in-place ops for `window_s` seconds; their rate."""
    n, end = 0, time.perf_counter() + window_s
    while time.perf_counter() < end:
        for _ in range(100):
            x.add_(1.0)
        n += 100
    return n / window_s


def start_server(latency_scale: float, log: Path) -> tuple[subprocess.Popen, str]:
    """The simulated pool in a process of its own (a real pool's Python is not ours); its /v1 URL."""
    with open(log, "w") as f:
        proc = subprocess.Popen([sys.executable, "-m", "router_r1.pool.server", "--backend", "sim", "--pool", str(SIM),
                                 "--port", "0", "--latency-scale", str(latency_scale)], cwd=ROOT, stdout=f,
                                stderr=subprocess.STDOUT)
    for _ in range(300):
        m = re.search(r"http://\S+/v1", log.read_text())
        if m:
            return proc, m.group(0)
        if proc.poll() is not None:
            break
        time.sleep(0.1)
    proc.terminate()
    raise RuntimeError(f"the pool server did not start; see {log}")


def main(argv=None) -> int:
    p = parser_for(ConvoyBench, "python -m tools.bench.bench_stream_convoy", __doc__.split("\n\n")[0])
    args = from_args(ConvoyBench, p.parse_args(argv))
    torch.set_num_threads(1)
    x = torch.zeros(8)

    tok = tiny_tokenizer()
    registry = ModelRegistry.from_yaml(SIM, base_url="http://unused").seen()
    n = args.batch * 4  # the draws cycle through them
    questions = SimWorld(seed=0).questions(n, seed=7, split="test", two_hop_frac=0.5)
    text = tok.apply_chat_template(build_router_prompt("{question}", registry), add_generation_prompt=True,
                                   tokenize=False)
    body = tok(text, add_special_tokens=False)["input_ids"]
    rows = [PromptRow([i // 256, i % 256] + body, f"q{i}", {}) for i in range(n)]
    script = Script(tok, questions, prompt_len=2 + len(body))
    server, url = start_server(args.latency_scale, Path(tempfile.gettempdir()) / "bench_stream_convoy_pool.log")
    rates: dict[str, list[float]] = {"alone": [], "decoding": [], "paused": []}
    busy: dict[str, list[float]] = {"alone": [], "decoding": [], "paused": []}  # engine's busy share per window
    try:
        env = bench_env(url, "continuous", tok, args)
        engine = SlotEngine(EmulatedSlots(script, HostBoundCost(args), n_slots=2 * args.batch, max_len=1 << 16,
                                          pad=tok.pad_token_id), tok, eos_ids=[], chunk=args.chunk)
        starts = iter(range(0, 1 << 30, args.batch))

        def draw() -> list[int]:
            first = next(starts)
            return [(first + i) % n for i in range(args.batch)]

        sampling = SamplingParams(greedy=True, temperature=0.0, max_new_tokens=args.response_length)
        rates["alone"].append(ops_per_s(args.window_s, x))
        stream = StreamingRollout(env, engine, draw, lambda i: [rows[i]], lambda v: sampling,
                                  in_flight=2 * args.batch, max_staleness=1 << 20)
        def window(state: str) -> None:
            before = engine.stats.busy_s
            rates[state].append(ops_per_s(args.window_s, x))
            busy[state].append((engine.stats.busy_s - before) / args.window_s)

        for cycle in range(args.cycles):
            stream.take(args.batch, version=cycle)  # returns with the gate closed
            window("paused")
            stream._call(stream._resume(cycle))  # noqa: SLF001 - the open gate, as an update beside decoding sees it
            window("decoding")
        stream.close()
        env.client.close()
        rates["alone"].append(ops_per_s(args.window_s, x))
    finally:
        server.terminate()
        server.wait()
    alone = statistics.median(rates["alone"])
    print(f"small torch ops per second, {args.window_s:g} s windows, {args.cycles} cycles (median); streaming "
          f"rollout of {args.batch} per take, {2 * args.batch} in play, pool latency x{args.latency_scale:g}, "
          f"decode step {args.step_ms:g} ms of which {args.decode_host_ms:g} ms Python")
    for state, rs in rates.items():
        med = statistics.median(rs)
        share = statistics.mean(busy[state]) if busy[state] else 0.0
        print(f"{state:<9} {med:>12,.0f} ops/s  ({alone / med:.2f}x slower than alone; engine busy {share:.0%} of "
              f"the window)  per window: " + " ".join(f"{r:,.0f}" for r in rs))
    paired = [p / d for p, d in zip(rates["paused"], rates["decoding"])]  # adjacent windows: the same drift
    print(f"paused vs decoding, paired per cycle: median {statistics.median(paired):.2f}x the ops rate "
          f"(per cycle: {' '.join(f'{r:.2f}' for r in paired)})")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
