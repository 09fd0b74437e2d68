"""A run's output dir is never silently overwritten or mislabelled (issue 45, items 1, 2, 5): a finished run
is not re-trained for nothing, a resume with other training settings is refused naming them, resume=none
moves a used dir aside, and a metrics row lost to a kill after its checkpoint comes back from the checkpoint."""
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from omegaconf import OmegaConf
from test_checkpoint import SMALL, config

from verl.trainer.checkpoint import RunDirError
from verl.trainer.config import training_changes
from verl.trainer.main_ppo import run
from verl.trainer.tracking import read_jsonl

ROOT = Path(__file__).resolve().parents[1]
pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.fixture(scope="module")
def finished(tmp_path_factory):
    """A finished 2-step run with its HF export, saved after each step."""
    out = tmp_path_factory.mktemp("finished") / "run"
    run(config(out, "trainer.total_steps=2", "trainer.export_hf=true"))
    return out


@pytest.fixture
def copy(finished, tmp_path):
    out = tmp_path / "run"
    shutil.copytree(finished, out)
    return out


def _files(out: Path) -> dict[str, bytes]:
    return {n: (out / n).read_bytes() for n in ("run_config.yaml", "hf/run_config.yaml", "metrics.jsonl")}


def test_a_finished_run_asked_for_no_more_steps_exits_non_zero(copy):
    before = _files(copy)
    proc = subprocess.run([sys.executable, "-m", "verl.trainer.main_ppo", f"trainer.output_dir={copy}", *SMALL,
                           "trainer.total_steps=2", "trainer.export_hf=true", "actor.lr=1e-5"],
                          cwd=ROOT, env={**os.environ, "OMP_NUM_THREADS": "1"}, capture_output=True, text=True,
                          timeout=300)
    assert proc.returncode == 2, proc.stderr[-2000:]
    assert "holds a finished run: step_000002 is step 2, and trainer.total_steps=2 asks for nothing more" in proc.stderr
    assert _files(copy) == before  # nothing re-exported, no run config rewritten


def test_a_resume_with_other_training_settings_is_refused_naming_them(copy):
    before = _files(copy)
    with pytest.raises(RunDirError, match=r"in 2 key\(s\): actor.lr: 1e-06 -> 1e-05; algorithm.gamma: 1.0 -> 0.9\. "
                                          r"Set trainer.resume_changed_ok=true"):
        run(config(copy, "trainer.total_steps=3", "trainer.export_hf=true", "actor.lr=1e-5", "algorithm.gamma=0.9",
                   "trainer.test_freq=5"))  # test_freq is no training setting: not named
    assert _files(copy) == before


def test_resume_changed_ok_trains_on_and_lists_the_change(copy, capsys):
    run(config(copy, "trainer.total_steps=3", "actor.lr=1e-5", "trainer.resume_changed_ok=true"))
    printed = capsys.readouterr().out
    assert f"resumed from {copy / 'checkpoints' / 'step_000002'} (step 2)" in printed
    assert "(training settings among them, allowed by trainer.resume_changed_ok)" in printed
    assert "actor.lr: 1e-06 -> 1e-05" in printed
    assert [r["step"] for r in read_jsonl(copy / "metrics.jsonl")] == [0, 1, 2, 3]


def test_training_settings_are_the_keys_that_shape_the_weights():
    base = {"actor": {"lr": 1e-3, "lr_schedule": "constant", "warmup_ratio": 0.0, "warmup_steps": 0},
            "rollout": {"temperature": 1.0, "max_batch_size": 64}, "env": {"alpha": 0.0, "pool_url": "http://a"},
            "trainer": {"total_steps": 4, "test_freq": 2, "logger": ["jsonl"], "output_dir": "a", "seed": 1}}
    saved = OmegaConf.create(base)

    def changed(*overrides, not_training=("pool_url",)):
        cur = OmegaConf.merge(saved, OmegaConf.from_dotlist(list(overrides)))
        return [line.split(":")[0] for line in training_changes(saved, cur, not_training)]

    assert changed("trainer.test_freq=5", "trainer.logger=[console]", "trainer.output_dir=b",
                   "rollout.max_batch_size=8", "env.pool_url=http://b", "trainer.total_steps=8") == []
    assert changed("env.alpha=0.6", "rollout.temperature=0.7", "trainer.seed=2") == \
        ["env.alpha", "rollout.temperature", "trainer.seed"]
    assert changed("env.pool_url=http://b", not_training=()) == ["env.pool_url"]
    # a key the schema gained after the checkpoint was saved: no change at its default, a change otherwise
    assert changed("algorithm.decision_entropy_coef=0.0") == []
    assert changed("algorithm.decision_entropy_coef=0.5") == ["algorithm.decision_entropy_coef"]
    from router_r1.router_env import RouterEnvConfig  # the same for a key the env's config class gained
    cur = OmegaConf.merge(saved, OmegaConf.from_dotlist(["env.branch_turns=[]"]))
    assert training_changes(saved, cur, env_class=RouterEnvConfig) == []
    cur = OmegaConf.merge(saved, OmegaConf.from_dotlist(["env.branch_turns=[0]"]))
    assert [x.split(":")[0] for x in training_changes(saved, cur, env_class=RouterEnvConfig)] == ["env.branch_turns"]
    # more steps lengthen a cosine schedule: then total_steps shapes the weights too
    assert changed("actor.lr_schedule=cosine", "trainer.total_steps=8") == ["actor.lr_schedule", "trainer.total_steps"]


def test_resume_none_moves_a_used_dir_aside_and_auto_continues_the_new_run(copy, capsys):
    old = read_jsonl(copy / "metrics.jsonl")
    run(config(copy, "trainer.total_steps=1", "trainer.resume=none"))
    (aside,) = copy.parent.glob("run.old-*")
    assert f"trainer.resume=none: {copy} held a run (checkpoints, metrics.jsonl, rollouts.jsonl); moved it to " \
           f"{aside}" in capsys.readouterr().out
    assert read_jsonl(aside / "metrics.jsonl") == old  # nothing deleted
    assert sorted(p.name for p in (aside / "checkpoints").iterdir()) == ["step_000001", "step_000002"]
    assert sorted(p.name for p in (copy / "checkpoints").iterdir()) == ["step_000001"]  # no stale step 2
    assert [r["step"] for r in read_jsonl(copy / "metrics.jsonl")] == [0, 1]
    run(config(copy, "trainer.total_steps=2"))
    assert f"resumed from {copy / 'checkpoints' / 'step_000001'} (step 1)" in capsys.readouterr().out
    assert [r["step"] for r in read_jsonl(copy / "metrics.jsonl")] == [0, 1, 2]


def test_a_row_lost_after_its_checkpoint_comes_back_and_older_gaps_are_named(copy, capsys):
    path = copy / "metrics.jsonl"
    rows = path.read_text().splitlines(keepends=True)
    saved = read_jsonl(path)
    assert [r["step"] for r in saved] == [0, 1, 2]
    path.write_text(rows[0])  # a kill after step 2's COMPLETE, before its row; step 1's row lost some other way
    run(config(copy, "trainer.total_steps=3"))
    printed = capsys.readouterr().out
    assert "step 2's row was missing (a kill after its checkpoint); logged it again from step_000002" in printed
    assert f"WARNING: {path} has no row for step(s) 1 (up to the resumed step 2): those metrics are lost" in printed
    after = read_jsonl(path)
    assert [r["step"] for r in after] == [0, 2, 3]
    assert after[1] == saved[2]  # the very row the killed run would have written
