"""tools/bench/bench_decode_attention.py's CPU smoke mode (--tiny): the whole sweep in Triton's interpreter,
so a GPU call does not die on a typo; a tile that computes something else is reported, never the best."""
import json

import pytest
import torch

pytest.importorskip("triton")

from tools.bench import bench_decode_attention  # noqa: E402

pytestmark = pytest.mark.usefixtures("one_thread")
ARGS = ["--tiny", "--shape", "qwen2.5-3b", "--blocks", "32", "64", "--targets", "512", "--warps", "4"]


def test_tiny_sweep_times_every_tile_and_agrees_with_the_matmul_path(tmp_path, capsys):
    bench_decode_attention.main(ARGS + ["--out", str(tmp_path / "r.json")])
    (row,) = json.loads((tmp_path / "r.json").read_text())
    assert (row["shape"], row["rows"], row["context"]) == ("qwen2.5-3b", 2, 200)
    for block in (32, 64):
        assert row[f"triton_b{block}_t512_w4_us"] > 0
        assert row[f"triton_b{block}_t512_w4_maxdiff"] < 1e-4
    assert "best: block" in capsys.readouterr().out


def test_pipeline_stages_are_a_tile_setting(tmp_path):
    """--stages sweeps the kernel's num_stages; a staged tile is timed, checked and handed to bench_rollout."""
    bench_decode_attention.main(ARGS[:4] + ["32", "--targets", "512", "--warps", "4", "--stages", "0", "3",
                                            "--out", str(tmp_path / "r.json")])
    (row,) = json.loads((tmp_path / "r.json").read_text())
    assert row["triton_b32_t512_w4_us"] > 0 and row["triton_b32_t512_w4_s3_us"] > 0
    assert row["triton_b32_t512_w4_s3_maxdiff"] < 1e-4
    staged = row["triton_b32_t512_w4_s3_us"] < row["triton_b32_t512_w4_us"]
    assert row["best"].get("num_stages") == (3 if staged else None)


def test_a_wrong_tile_is_flagged_and_never_the_best(monkeypatch, capsys):
    kernel = pytest.importorskip("verl.workers.rollout.triton_decode_attention")
    monkeypatch.setattr(kernel, "triton_decode_attention", lambda q, *a, **k: torch.zeros_like(q))
    bench_decode_attention.main(ARGS)
    out = capsys.readouterr().out
    assert out.count("MISMATCH") == 2 and "best:" not in out


def test_the_best_tile_reaches_bench_rollout(tmp_path):
    """The sweep's JSON names each shape's fastest correct tile; bench_rollout --tiles reads it back as kwargs."""
    bench_decode_attention.main(ARGS + ["--out", str(tmp_path / "r.json")])
    from tools.bench import bench_rollout  # after the sweep: its imports load triton (see --tiny)
    (row,) = json.loads((tmp_path / "r.json").read_text())
    timed = {b: row[f"triton_b{b}_t512_w4_us"] for b in (32, 64)}
    assert row["best"]["block"] == min(timed, key=timed.get)
    assert bench_rollout.best_tile(str(tmp_path / "r.json"), "qwen2.5-3b") == dict(
        block=row["best"]["block"], target=512, num_warps=4)
    assert bench_rollout.best_tile(str(tmp_path / "r.json"), "qwen2.5-0.5b") is None
