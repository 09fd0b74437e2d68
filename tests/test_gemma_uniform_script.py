"""experiments/gemma_h200/run_gemma_uniform.sh refuses two listings side by side on a GPU too small for them."""
import os
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_two_listings_on_an_80gb_gpu_are_refused_before_the_bundle(tmp_path):
    """Session 27: on an H100 the second listing's SFT ran out of memory after the whole bundle was carried."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    smi = bin_dir / "nvidia-smi"
    smi.write_text("#!/bin/sh\necho 81559\n")  # what an H100 80GB HBM3 reports, in MiB
    smi.chmod(0o755)
    env = {**os.environ, "PATH": f"{bin_dir}:{os.environ['PATH']}", "LISTINGS": "domain card",
           "PIECES": str(tmp_path / "no_pieces")}
    env.pop("SIDE_BY_SIDE", None)
    out = subprocess.run(["bash", "experiments/gemma_h200/run_gemma_uniform.sh", str(tmp_path / "results")],
                         cwd=ROOT, env=env, capture_output=True, text=True, timeout=60)
    assert out.returncode == 2, out.stderr
    assert "81559 MiB" in out.stderr and "LISTINGS=domain, then LISTINGS=card" in out.stderr
    assert not (tmp_path / "results").exists()
