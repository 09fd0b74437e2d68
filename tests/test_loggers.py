"""trainer.logger: console, jsonl, tensorboard, wandb. An unknown name fails before anything loads, naming the
allowed ones; a logger whose package is missing is listed by the preflight, before any model loads (a run without
wandb used to load its models, then die in a ModuleNotFoundError); TensorBoard gets every numeric metric per step."""
import importlib.util
import os
import subprocess
import sys
from pathlib import Path

import pytest

import verl.trainer.tracking as tracking
from verl.trainer.main_ppo import load_config, run
from verl.trainer.preflight import PreflightError, problems
from verl.trainer.tracking import Tracker

ROOT = Path(__file__).resolve().parents[1]


def test_an_unknown_logger_name_is_refused_naming_the_allowed_ones(tmp_path, monkeypatch):
    with pytest.raises(ValueError, match=r"^trainer.logger: unknown logger 'tensorbord' \(allowed: console, jsonl, "
                                         r"tensorboard, wandb\)$"):
        Tracker(["console", "tensorbord"], tmp_path)
    import verl.trainer.main_ppo as main_ppo

    monkeypatch.chdir(ROOT)
    monkeypatch.setattr(main_ppo, "load_tokenizer", lambda *a: pytest.fail("loaded before the logger was checked"))
    with pytest.raises(PreflightError, match=r"unknown loggers 'consol', 'csv' \(allowed: "):
        run(load_config("ppo_trainer", [f"trainer.output_dir={tmp_path}", "trainer.logger=[consol,jsonl,csv]"]))


def test_the_command_line_says_so_and_exits_2(tmp_path):
    env = {**os.environ, "CUDA_VISIBLE_DEVICES": ""}
    proc = subprocess.run([sys.executable, "-m", "verl.trainer.main_ppo", f"trainer.output_dir={tmp_path / 'out'}",
                           "trainer.logger=[console,tensorbaord]"], cwd=ROOT, env=env, capture_output=True, text=True,
                          timeout=300)
    assert proc.returncode == 2 and "Traceback" not in proc.stderr
    assert ("error: trainer.logger: unknown logger 'tensorbaord' (allowed: console, jsonl, tensorboard, wandb)"
            in proc.stderr)
    assert not (tmp_path / "out").exists()


def test_the_preflight_lists_a_logger_whose_package_is_missing(monkeypatch):
    monkeypatch.chdir(ROOT)
    real = importlib.util.find_spec
    monkeypatch.setattr(tracking.importlib.util, "find_spec",
                        lambda name, *a: None if name in ("wandb", "tensorboard") else real(name, *a))
    found = problems(load_config("ppo_trainer", ["trainer.logger=[console,wandb,tensorboard]"]))
    assert found == ["the wandb package (trainer.logger: wandb): not installed; pip install -e '.[wandb]'",
                     "the tensorboard package (trainer.logger: tensorboard): not installed; "
                     "pip install -e '.[tensorboard]'"]
    assert problems(load_config("ppo_trainer")) == []  # console and jsonl need nothing


def scalars(directory: Path) -> dict[str, list[tuple[int, float]]]:
    """Every scalar of a TensorBoard log directory, read back as TensorBoard reads it."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    acc = EventAccumulator(str(directory))
    acc.Reload()
    return {tag: [(e.step, round(e.value, 6)) for e in acc.Scalars(tag)] for tag in acc.Tags()["scalars"]}


def test_tensorboard_gets_every_numeric_metric_per_step_and_a_resume_replaces_redone_steps(tmp_path):
    pytest.importorskip("tensorboard")  # [dev] installs it; torch's SummaryWriter needs it to write at all
    t = Tracker(["tensorboard"], tmp_path)
    for step in (1, 2, 3):
        t.log({"reward/mean": 0.1 * step, "val/em/mean": 0.5, "note": "text is not a scalar"}, step)
    t.finish()
    assert scalars(tmp_path / "tensorboard") == {"reward/mean": [(1, 0.1), (2, 0.2), (3, 0.3)],
                                                 "val/em/mean": [(1, 0.5), (2, 0.5), (3, 0.5)]}
    t = Tracker(["tensorboard"], tmp_path, resume=True)  # resumed from step 2's checkpoint: step 3 again
    t.log({"reward/mean": 0.9}, 3)
    t.log({"reward/mean": 1.0}, 4)
    t.finish()
    assert scalars(tmp_path / "tensorboard")["reward/mean"] == [(1, 0.1), (2, 0.2), (3, 0.9), (4, 1.0)]


def test_a_run_with_the_tensorboard_logger(tmp_path, monkeypatch):
    pytest.importorskip("tensorboard")
    from test_checkpoint import config

    monkeypatch.chdir(ROOT)
    run(config(tmp_path, "trainer.total_steps=2", "trainer.logger=[jsonl,tensorboard]", "trainer.export_hf=false",
               "trainer.save_freq=0"))
    logged = scalars(tmp_path / "tensorboard")
    assert [s for s, _ in logged["reward/mean"]] == [1, 2] and [s for s, _ in logged["timing/step"]] == [1, 2]
