"""CI installs vLLM beside the CPU torch (`--no-deps`, tests/requirements-vllm-cpu.txt), so the real-vLLM glue
tests run there instead of skipping, and a vLLM API change cannot land unseen."""
import importlib
import importlib.util
import os
import re
from pathlib import Path

import pytest

from verl.workers.rollout.vllm_rollout import check_vllm_version

ROOT = Path(__file__).resolve().parents[1]
REQUIREMENTS = ROOT / "tests" / "requirements-vllm-cpu.txt"


def pins() -> dict[str, str]:
    lines = [line.split("#", 1)[0].strip() for line in REQUIREMENTS.read_text().splitlines()]
    return dict(line.split("==", 1) for line in lines if line)


def test_ci_installs_the_pinned_vllm_without_its_dependencies():
    ci = [line for line in (ROOT / ".ci/run").read_text().splitlines() if line.strip() and not line.startswith("#")]
    assert "pip install --no-deps -r tests/requirements-vllm-cpu.txt" in ci[-1]
    assert ci[-1].index("--no-deps") < ci[-1].index("pytest")  # installed before the tests run
    found = pins()
    assert all(re.fullmatch(r"[\w.-]+", v) for v in found.values()) and "torch" not in found  # every line pinned
    check_vllm_version(found["vllm"])  # within the [vllm] extra's supported range


@pytest.mark.skipif(os.environ.get("CI") != "true", reason="CI only: elsewhere vLLM is optional")
def test_in_ci_vllm_and_the_worker_module_import():
    """The glue tests importorskip vllm (and its GPU worker module): in CI a skip would hide them, so fail."""
    assert importlib.util.find_spec("vllm") is not None, "CI must install vllm (tests/requirements-vllm-cpu.txt)"
    importlib.import_module("vllm.v1.worker.gpu_worker")
    import vllm

    assert vllm.__version__ == pins()["vllm"]
