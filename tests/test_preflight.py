"""Preflight: a run names everything this machine lacks (GPUs, vLLM, data files, model files, the pool key)
at once and in seconds, before any hub access (a paper run without GPUs spent 59 s on hub retries, then an
OSError). CPU only: the GPU line is what a machine without GPUs gets."""
import importlib.util
import os
import subprocess
import sys
from pathlib import Path

import pytest

from router_r1.pool.preflight import pool_problems
from verl.trainer.main_ppo import load_config, run
from verl.trainer.preflight import PreflightError, problems

ROOT = Path(__file__).resolve().parents[1]


def test_train_sh_paper_without_gpus_data_or_key_says_what_is_missing(tmp_path):
    env = {k: v for k, v in os.environ.items() if k not in ("ROUTER_POOL_API_KEY", "HF_HUB_OFFLINE")}
    env.update(PYTHON=sys.executable, CUDA_VISIBLE_DEVICES="", HF_HUB_OFFLINE="1")  # no hub call would be quick
    proc = subprocess.run(["bash", "train.sh", "paper", f"data.train_files=[{tmp_path / 'train.parquet'}]",
                           f"data.val_files=[{tmp_path / 'val.parquet'}]", f"trainer.output_dir={tmp_path / 'out'}"],
                          cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 2, proc.stderr[-3000:]
    err = proc.stderr
    assert "error: this run cannot start on this machine; missing:" in err and "Traceback" not in err
    assert "- a CUDA GPU (rollout.name=vllm; the config asks for trainer.n_gpus_per_node=4)" in err
    assert f"- data.train_files: {tmp_path / 'train.parquet'} not found" in err
    assert f"- data.val_files: {tmp_path / 'val.parquet'} not found" in err
    assert "- the pool's API key: ROUTER_POOL_API_KEY is not set (env.pool=configs/pool/paper.yaml: 6 models" in err
    assert ("- the vllm package (rollout.name=vllm): not installed" in err) == (importlib.util.find_spec("vllm") is None)
    assert not (tmp_path / "out").exists()


def test_a_cpu_run_with_everything_present_passes(monkeypatch):
    monkeypatch.chdir(ROOT)
    assert problems(load_config("ppo_trainer")) == []


def test_local_model_files_and_offline_hub_ids_are_checked(tmp_path, monkeypatch):
    monkeypatch.chdir(ROOT)
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "cache"))
    cfg = load_config("ppo_trainer", [f"model.path={tmp_path / 'gone' / 'sft'}", "model.critic_path=nobody/nothing",
                                      "trainer.total_steps=1"])
    found = problems(cfg)
    assert found == [f"model.path={tmp_path / 'gone' / 'sft'}: no such file or directory",
                     "model.critic_path=nobody/nothing: not in the hub cache and HF_HUB_OFFLINE is set"]
    with pytest.raises(PreflightError, match="missing:\n  - model.path="):
        run(cfg)


def test_the_pool_key_is_needed_for_a_remote_endpoint_only(monkeypatch):
    monkeypatch.chdir(ROOT)
    monkeypatch.delenv("ROUTER_POOL_API_KEY", raising=False)
    paper = {"pool": "configs/pool/paper.yaml", "pool_url": None, "seen_only": True}
    assert pool_problems(paper) == ["the pool's API key: ROUTER_POOL_API_KEY is not set (env.pool=configs/pool/"
                                    "paper.yaml: 6 models at a remote endpoint read it; export ROUTER_POOL_API_KEY=...)"]
    assert pool_problems({**paper, "pool_url": "http://127.0.0.1:8000/v1"}) == []  # a local server
    monkeypatch.setenv("ROUTER_POOL_API_KEY", "set")
    assert pool_problems(paper) == []
    assert pool_problems({**paper, "pool": "configs/pool/none.yaml"}) == [
        "env.pool: configs/pool/none.yaml: pool file not found"]
