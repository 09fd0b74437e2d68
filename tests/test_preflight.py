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
    assert ("- 4 CUDA GPUs (rollout.name=vllm; trainer.backend=ray, trainer.n_gpus_per_node=4): torch sees none on "
            "this machine") in err  # train.sh paper launches with Ray, the launcher that reads n_gpus_per_node
    build = f"(build it: python -m data_process.build_qa --out-dir {tmp_path} (the paper's NQ + HotpotQA from the hub"
    assert f"- data.train_files: {tmp_path / 'train.parquet'} not found {build}" in err
    assert f"- data.val_files: {tmp_path / 'val.parquet'} not found {build}" in err
    assert "- the pool's API key: ROUTER_POOL_API_KEY is not set (env.pool=configs/pool/paper.yaml: 6 models" in err
    assert ("- the vllm package (rollout.name=vllm): not installed" in err) == (importlib.util.find_spec("vllm") is None)
    assert not (tmp_path / "out").exists()


def test_train_sh_grpo_launches_with_ray_as_paper_does(tmp_path):
    """router_r1_grpo inherits n_gpus_per_node 4: a plain launch would leave 3 GPUs idle, and is refused."""
    env = {k: v for k, v in os.environ.items() if k not in ("ROUTER_POOL_API_KEY", "HF_HUB_OFFLINE")}
    env.update(PYTHON=sys.executable, CUDA_VISIBLE_DEVICES="", HF_HUB_OFFLINE="1")
    proc = subprocess.run(["bash", "train.sh", "grpo", f"data.train_files=[{tmp_path / 'train.parquet'}]",
                           f"data.val_files=[{tmp_path / 'val.parquet'}]", f"trainer.output_dir={tmp_path / 'out'}"],
                          cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 2, proc.stderr[-3000:]
    assert "- 4 CUDA GPUs (rollout.name=vllm; trainer.backend=ray, trainer.n_gpus_per_node=4)" in proc.stderr
    assert "sit idle" not in proc.stderr


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


def gpus(monkeypatch, n: int) -> None:
    import verl.trainer.preflight as preflight

    monkeypatch.setattr(preflight, "_gpus", lambda: n)


def test_a_plain_launch_of_a_config_asking_for_4_gpus_is_refused_not_run_on_one(monkeypatch):
    """SPMD (plain python, torchrun) reads no trainer.n_gpus_per_node: one process used 1 of 4 GPUs, silently."""
    monkeypatch.chdir(ROOT)
    monkeypatch.delenv("WORLD_SIZE", raising=False)
    monkeypatch.delenv("LOCAL_WORLD_SIZE", raising=False)
    gpus(monkeypatch, 4)
    cfg = load_config("router_r1", ["rollout.name=hf"])
    idle = [p for p in problems(cfg) if p.startswith("trainer.n_gpus_per_node")]
    assert idle == ["trainer.n_gpus_per_node=4 (x trainer.nnodes=1) asks for 4 GPUs, but this launch is 1 process "
                    "(spmd: one GPU each), so 3 would sit idle: launch with Ray (trainer.backend=ray, as "
                    "`bash train.sh paper` does), with `torchrun --nproc_per_node 4`, or set trainer.n_gpus_per_node=1"]
    monkeypatch.setenv("WORLD_SIZE", "4")  # torchrun --nproc_per_node 4
    assert not any("n_gpus_per_node" in p for p in problems(cfg))
    monkeypatch.delenv("WORLD_SIZE")
    assert not any("n_gpus_per_node" in p or "CUDA" in p for p in problems(load_config("router_r1", [
        "rollout.name=hf", "trainer.backend=ray"])))  # Ray places the 4 workers
    gpus(monkeypatch, 2)
    assert "- 4 CUDA GPUs (trainer.device=auto; trainer.backend=ray, trainer.n_gpus_per_node=4): torch sees 2 on " \
           "this machine" in "- " + "\n- ".join(problems(load_config("router_r1", ["rollout.name=hf",
                                                                                 "trainer.backend=ray"])))


def test_a_cpu_run_is_not_asked_for_gpus(monkeypatch):
    monkeypatch.chdir(ROOT)
    gpus(monkeypatch, 0)
    assert not any("GPU" in p for p in problems(load_config("router_r1", ["rollout.name=hf", "trainer.device=cpu"])))


def test_the_ray_package_is_checked_when_the_launch_uses_ray(monkeypatch):
    import verl.trainer.preflight as preflight

    monkeypatch.chdir(ROOT)
    real = importlib.util.find_spec
    monkeypatch.setattr(preflight.importlib.util, "find_spec",
                        lambda name, *a: None if name == "ray" else real(name, *a))
    line = "the ray package (trainer.backend=ray): not installed; pip install -e '.[ray]'"
    assert line in problems(load_config("ppo_trainer", ["trainer.backend=ray"]))
    assert line not in problems(load_config("ppo_trainer"))


def test_missing_simulated_data_names_the_command_that_builds_it(tmp_path, monkeypatch):
    monkeypatch.chdir(ROOT)
    out = tmp_path / "run"
    cfg = load_config("embedded", [f"data.train_files=[{out / 'data' / 'train.parquet'}]",
                                   f"data.val_files=[{out / 'data' / 'val.parquet'}]"])
    found = [p for p in problems(cfg) if p.startswith("data.")]
    assert found == [f"data.train_files: {out / 'data' / 'train.parquet'} not found (build it: SFT_ONLY=1 OUT={out} "
                     "bash train.sh (the simulated world's questions and the warm start))",
                     f"data.val_files: {out / 'data' / 'val.parquet'} not found (build it: SFT_ONLY=1 OUT={out} "
                     "bash train.sh (the simulated world's questions and the warm start))"]
