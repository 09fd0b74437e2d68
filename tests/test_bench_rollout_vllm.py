"""tools/bench/bench_rollout_vllm.py and experiments/vllm/run_vllm.sh without a GPU: the workload flags reach the
HBM floor (bench_rollout.hbm_floor, computed before any engine starts), every printed figure sits beside the floor,
and `run_vllm.sh bench` passes its flags through and returns the benchmark's exit status."""
import os
import stat
import subprocess
import sys
from pathlib import Path

import pytest

from tools.bench import bench_rollout, bench_rollout_vllm

ROOT = Path(__file__).resolve().parents[1]
FLOOR = {"bytes_per_step": 12.2e9, "floor_tok_s": 50_000.0}


def test_floor_is_computed_for_each_shape_and_batch_from_the_workload_flags(monkeypatch):
    calls = []
    monkeypatch.setattr(bench_rollout, "hbm_floor", lambda *a: calls.append(a) or FLOOR, raising=False)
    got = bench_rollout_vllm.floors(["qwen2.5-0.5b", "qwen2.5-3b"], [128], 1024, 512)
    assert calls == [("qwen2.5-0.5b", 128, 1024, 512), ("qwen2.5-3b", 128, 1024, 512)]
    assert got[("qwen2.5-3b", 128)] is FLOOR


def test_main_takes_the_floor_before_starting_an_engine(monkeypatch):
    """A floor that fails costs no GPU time: main stops before building a model or starting vLLM."""
    calls = []

    def floor(*a):
        calls.append(a)
        raise RuntimeError("no floor")

    def no_engine(*a, **k):
        raise AssertionError("an engine started before the floor was known")

    monkeypatch.setattr(bench_rollout, "hbm_floor", floor, raising=False)
    monkeypatch.setattr(bench_rollout_vllm, "build", no_engine)
    monkeypatch.setattr(bench_rollout_vllm, "VLLMRollout", no_engine)
    monkeypatch.setattr(sys, "argv", ["bench_rollout_vllm", "--shape", "qwen2.5-3b", "--batch", "128",
                                      "--prompt-len", "1024", "--new-tokens", "512", "--skip-generate"])
    with pytest.raises(RuntimeError, match="no floor"):
        bench_rollout_vllm.main()
    assert calls == [("qwen2.5-3b", 128, 1024, 512)]


def test_row_prints_both_engines_the_ratio_and_the_floor():
    row = {"shape": "qwen2.5-3b", "batch": 128, "prompt_len": 1024, "new_tokens": 512,
           "vllm_tok_s": 10_000.0, "hf_static_compiled_tok_s": 20_000.0}
    bench_rollout_vllm.add_ratios(row, FLOOR)
    assert row["vllm_vs_hf_static"] == pytest.approx(0.5)
    assert row["vllm_x_floor"] == pytest.approx(5.0) and row["hf_static_compiled_x_floor"] == pytest.approx(2.5)
    assert row["hbm_floor_tok_s"] == 50_000.0 and row["hbm_bytes_per_step"] == 12.2e9
    line = bench_rollout_vllm.row_line(row)
    for part in ("vLLM     10000 tok/s (5.0x the floor)", "hf_static compiled     20000 tok/s (2.5x the floor)",
                 "vLLM/hf_static 0.50x", "HBM floor 50,000 tok/s (decode only, 12.2 GB a step;", "prompt 1024 + 512 new"):
        assert part in line, (part, line)
    assert "generate" not in line.replace("hf_static", "")  # --skip-generate: no reference figure invented


def test_row_with_generate_prints_its_floor_distance_too():
    row = {"shape": "qwen2.5-0.5b", "batch": 64, "prompt_len": 512, "new_tokens": 256, "vllm_tok_s": 16_000.0,
           "hf_static_compiled_tok_s": 32_000.0, "generate_tok_s": 4_000.0, "vllm_vs_generate": 4.0,
           "hf_static_vs_generate": 8.0}
    line = bench_rollout_vllm.row_line(bench_rollout_vllm.add_ratios(row, FLOOR))
    assert "generate     4000 tok/s (12.5x the floor)" in line and "vLLM/generate 4.0x" in line


def _fake_python(tmp_path: Path, rc: int) -> dict:
    """A python3 first on PATH that records its arguments and exits with rc."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    fake = bin_dir / "python3"
    fake.write_text(f'#!/bin/sh\necho "$@" > "{tmp_path}/args"\nexit {rc}\n')
    fake.chmod(fake.stat().st_mode | stat.S_IEXEC)
    return {**os.environ, "PATH": f"{bin_dir}:{os.environ['PATH']}"}


@pytest.mark.parametrize("flags, expected", [
    (["--shape", "qwen2.5-3b", "--batch", "128", "--prompt-len", "1024", "--new-tokens", "512", "--skip-generate"],
     "--shape qwen2.5-3b --batch 128 --prompt-len 1024 --new-tokens 512 --skip-generate"),
    ([], "--shape qwen2.5-0.5b qwen2.5-3b --batch 64 256"),  # none given: the recorded workload
])
def test_run_vllm_bench_passes_its_flags_and_the_exit_status(tmp_path, flags, expected):
    res = tmp_path / "res"
    p = subprocess.run(["bash", "experiments/vllm/run_vllm.sh", "bench", str(res), *flags], cwd=ROOT,
                       env=_fake_python(tmp_path, 3), capture_output=True, text=True, timeout=60)
    assert p.returncode == 3, p.stdout + p.stderr
    assert (tmp_path / "args").read_text().split() == (
        ["-m", "tools.bench.bench_rollout_vllm", *expected.split(), "--out", f"{res}/bench_rollout_vllm.json"])
