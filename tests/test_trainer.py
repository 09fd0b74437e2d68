"""The PPO controller end to end on CPU: steps, checkpoints, resume, GRPO, torchrun."""
import json
import os
import shutil
import socket
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest
from hydra import compose, initialize_config_dir

from verl.trainer.main_ppo import CONFIG_DIR, run
from verl.trainer.single_turn import target_char_reward
from verl.trainer.tracking import read_jsonl
from verl.workers.fsdp import CheckpointError

ROOT = Path(__file__).resolve().parents[1]
TOY = "tests/data/toy_prompts.parquet"


def config(tmp_path, *overrides):
    with initialize_config_dir(CONFIG_DIR, version_base=None):
        return compose("ppo_trainer", overrides=[f"trainer.output_dir={tmp_path}", "trainer.logger=[jsonl]",
                                                 f"data.train_files=[{TOY}]",
                                                 f"data.val_files=[{TOY}]",
                                                 "rollout.response_length=24", "actor.lr=1e-3", *overrides])


def by_step(path):
    return {r["step"]: r for r in read_jsonl(path)}


def test_steps_are_updates_and_the_last_step_is_saved(tmp_path, monkeypatch):
    monkeypatch.chdir(ROOT)
    run(config(tmp_path, "trainer.total_steps=3", "trainer.save_freq=2", "trainer.test_freq=0",
               "trainer.dump_rollouts=2"))
    saved = sorted(p.name for p in (tmp_path / "checkpoints").iterdir())
    assert saved == ["step_000002", "step_000003"]  # the reference saved at 210 of 225 and never at the end
    state = json.loads((tmp_path / "checkpoints" / "step_000003" / "trainer_state.json").read_text())
    assert state["global_step"] == 3
    rows = by_step(tmp_path / "metrics.jsonl")
    assert sorted(rows) == [0, 1, 2, 3]  # step 0 = validation before training
    assert "val/reward/mean" in rows[3]  # the last step always validates
    assert (tmp_path / "curves.png").stat().st_size > 0
    assert (tmp_path / "hf" / "config.json").exists()
    dumped = read_jsonl(tmp_path / "rollouts.jsonl")  # the first 2 episodes of each step, scored as trained
    assert [d["step"] for d in dumped] == [1, 1, 2, 2, 3, 3]
    targets = {r["extra_info"]["uid"]: r["target_char"] for r in pd.read_parquet(ROOT / TOY).to_dict("records")}
    for d in dumped:
        assert d["reward"] == pytest.approx(target_char_reward(d["text"], {"target_char": targets[d["uid"]]}))


def test_resume_reproduces_the_next_steps(tmp_path, monkeypatch):
    monkeypatch.chdir(ROOT)
    whole, part = tmp_path / "whole", tmp_path / "part"
    run(config(whole, "trainer.total_steps=4", "trainer.save_freq=2", "trainer.export_hf=false"))
    run(config(part, "trainer.total_steps=2", "trainer.save_freq=2", "trainer.export_hf=false"))
    # A save cut by a kill leaves a directory without its marker: resume must skip it.
    shutil.copytree(part / "checkpoints" / "step_000002", part / "checkpoints" / "step_000003")
    (part / "checkpoints" / "step_000003" / "COMPLETE").unlink()
    run(config(part, "trainer.total_steps=4", "trainer.save_freq=2", "trainer.export_hf=false"))
    a, b = by_step(whole / "metrics.jsonl"), by_step(part / "metrics.jsonl")
    for step in (3, 4):
        for key in ("reward/mean", "actor/pg_loss", "critic/vf_loss", "actor/grad_norm", "response_length/mean"):
            assert b[step][key] == pytest.approx(a[step][key], rel=1e-5, abs=1e-7), (step, key)


def test_incomplete_checkpoint_named_in_the_error(tmp_path, monkeypatch):
    monkeypatch.chdir(ROOT)
    run(config(tmp_path, "trainer.total_steps=1", "trainer.export_hf=false", "trainer.val_before_train=false"))
    step_dir = tmp_path / "checkpoints" / "step_000001"
    (step_dir / "COMPLETE").unlink()
    with pytest.raises(CheckpointError, match="step_000001: checkpoint is incomplete"):
        run(config(tmp_path, "trainer.total_steps=2", f"trainer.resume={step_dir}"))


def test_grpo_runs_without_a_critic(tmp_path, monkeypatch):
    monkeypatch.chdir(ROOT)
    last = run(config(tmp_path, "algorithm.adv_estimator=grpo", "rollout.n=2", "trainer.total_steps=2",
                      "trainer.export_hf=false", "algorithm.use_kl_in_reward=false", "actor.use_kl_loss=true"))
    assert "critic/vf_loss" not in last and "actor/kl_loss" in last
    assert not (tmp_path / "checkpoints" / "step_000002" / "critic").exists()


def test_torchrun_two_processes(tmp_path):
    """The same controller under a plain torch.distributed launch (the GPU machine has no Ray)."""
    env = {**os.environ, "OMP_NUM_THREADS": "1", "CUDA_VISIBLE_DEVICES": ""}
    with socket.socket() as s:  # torchrun's rendezvous needs a real port, not 0
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node=2", "--master_addr=127.0.0.1",
           f"--master_port={port}", "-m", "verl.trainer.main_ppo", f"trainer.output_dir={tmp_path}",
           "trainer.total_steps=2", "trainer.logger=[jsonl]", "rollout.response_length=16",
           "data.val_batch_size=7"]  # 32 val rows: the last batch is short and uneven over ranks
    proc = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    rows = by_step(tmp_path / "metrics.jsonl")
    assert sorted(rows) == [0, 1, 2]
    assert rows[2]["val/n"] == 32
    assert (tmp_path / "checkpoints" / "step_000002" / "COMPLETE").exists()


def test_lora_run_is_its_own_reference_and_saves_adapters(tmp_path, monkeypatch):
    """actor.lora.rank > 0: the reference group is the actor (adapters off, no second model), the
    checkpoint holds the adapters, the HF export is a merged full model."""
    import verl.trainer.main_ppo as main_ppo
    from torch.distributed.checkpoint import FileSystemReader
    from transformers import AutoModelForCausalLM

    monkeypatch.chdir(ROOT)
    built = {}
    real_build = main_ppo.build_groups

    def build(*args, **kw):
        groups, dist = real_build(*args, **kw)
        built.update(groups)
        return groups, dist

    monkeypatch.setattr(main_ppo, "build_groups", build)
    last = run(config(tmp_path, "algorithm.adv_estimator=grpo", "rollout.n=2", "trainer.total_steps=1",
                      "algorithm.use_kl_in_reward=false", "actor.use_kl_loss=true", "actor.lora.rank=4",
                      "actor.lora.target_modules=[q_proj,v_proj]", "trainer.val_before_train=false",
                      "trainer.test_freq=0"))
    assert built["ref"] is built["actor"] and "actor/kl_loss" in last
    saved = FileSystemReader(str(tmp_path / "checkpoints" / "step_000001" / "actor" / "state")).read_metadata()
    weights = {k for k in saved.state_dict_metadata if k.startswith("model.")}
    assert weights and all(".lora_" in k for k in weights)
    exported = AutoModelForCausalLM.from_pretrained(str(tmp_path / "hf"))
    assert not any("lora" in k for k in exported.state_dict())
