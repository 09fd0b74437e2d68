"""tools/bench/bench_decode_gemm.py's CPU smoke mode (the split-K kernel in Triton's interpreter): every GEMM of a
step is run each way and checked, and a path that computes something else is flagged and not counted as faster."""
import json

import pytest
import torch

from tools.bench import bench_decode_gemm

pytest.importorskip("triton")
ARGS = ["--tiny", "--shape", "qwen2.5-3b"]


def test_tiny_run_covers_a_steps_gemms(tmp_path, one_thread):
    bench_decode_gemm.main(ARGS + ["--autotune", "--cublaslt", "--out", str(tmp_path / "r.json")])
    rows = json.loads((tmp_path / "r.json").read_text())
    assert [r["gemm"] for r in rows] == ["qkv", "o", "gate_up", "down", "lm_head", "step"]
    qkv = rows[0]
    assert (qkv["k"], qkv["n"], qkv["calls"]) == (128, 160, 36)  # (16 + 2 x 2 heads) x 128 / 16
    assert all(r["maxdiff"] < 1e-4 for r in rows[:-1])
    step = rows[-1]
    assert step["autotuned_ms"] > 0 and step["splitk_ms"] > 0 and step["cublaslt_ms"] > 0 and step["floor_ms"] > 0
    assert step["best"] == bench_decode_gemm.sweep(True)[0] and step["best_ms"] > 0


def test_a_wrong_path_is_flagged(monkeypatch, capsys, one_thread):
    from verl.workers.rollout import triton_decode_linear
    monkeypatch.setattr(torch, "compile", lambda fn, **kw: (lambda x, w: torch.zeros(x.shape[0], w.shape[0])))
    monkeypatch.setattr(triton_decode_linear, "linear", lambda x, w, b, **kw: torch.zeros(x.shape[0], w.shape[0]))
    rows = bench_decode_gemm.main(ARGS + ["--autotune"])
    out = capsys.readouterr().out
    assert out.count("MISMATCH") == 10  # 5 GEMMs x 2 wrong paths
    step = rows[-1]
    per_gemm = sum(r["calls"] * r["cublas_ms"] for r in rows[:-1])
    assert step["autotuned_ms"] == step["splitk_ms"] == step["cublas_ms"] == per_gemm  # wrong paths not counted


@pytest.mark.parametrize("name, tb_s", [("NVIDIA H100 80GB HBM3\n", 3.35), ("NVIDIA H100 PCIe\n", 2.0),
                                        ("NVIDIA H200\n", 4.8), ("NVIDIA A100-SXM4-80GB\n", 4.8), (None, 4.8)])
def test_the_floor_follows_the_cards_datasheet_bandwidth(monkeypatch, request, name, tb_s):
    from tools.bench import bench_rollout

    def smi(*a, **k):
        if name is None:
            raise FileNotFoundError("nvidia-smi")
        return type("Done", (), {"stdout": name})()
    monkeypatch.setattr(bench_rollout.subprocess, "run", smi)
    bench_rollout.hbm_bytes_per_s.cache_clear()  # each case names another card; no stub card outlives the test
    request.addfinalizer(bench_rollout.hbm_bytes_per_s.cache_clear)
    assert bench_rollout.hbm_bytes_per_s() == pytest.approx(tb_s * 1e12)
    floor = bench_rollout.hbm_floor("qwen2.5-0.5b", 64, 512, 256)
    assert floor["floor_step_s"] == pytest.approx(floor["bytes_per_step"] / (tb_s * 1e12))
