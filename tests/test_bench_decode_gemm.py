"""tools/bench/bench_decode_gemm.py's CPU smoke mode: every GEMM of a step is run both ways and checked,
and a compiled GEMM that computes something else is flagged and not counted as the faster path."""
import json

import torch

from tools.bench import bench_decode_gemm

ARGS = ["--tiny", "--shape", "qwen2.5-3b"]


def test_tiny_run_covers_a_steps_gemms(tmp_path, one_thread):
    bench_decode_gemm.main(ARGS + ["--out", str(tmp_path / "r.json")])
    rows = json.loads((tmp_path / "r.json").read_text())
    assert [r["gemm"] for r in rows] == ["qkv", "o", "gate_up", "down", "lm_head", "step"]
    qkv = rows[0]
    assert (qkv["k"], qkv["n"], qkv["calls"]) == (128, 160, 36)  # (16 + 2 x 2 heads) x 128 / 16
    assert all(r["maxdiff"] < 1e-4 for r in rows[:-1])
    step = rows[-1]
    assert step["autotuned_ms"] > 0 and step["floor_ms"] > 0


def test_a_wrong_compiled_gemm_is_flagged(monkeypatch, capsys, one_thread):
    monkeypatch.setattr(torch, "compile", lambda fn, **kw: (lambda x, w: torch.zeros(x.shape[0], w.shape[0])))
    rows = bench_decode_gemm.main(ARGS)
    out = capsys.readouterr().out
    assert out.count("MISMATCH") == 5
    step = rows[-1]
    per_gemm = sum(r["calls"] * r["cublas_ms"] for r in rows[:-1])
    assert step["autotuned_ms"] == step["cublas_ms"] == per_gemm  # the wrong path's times are not counted
