"""One rule for what --checkpoint names (router_r1.runtime.resolve_checkpoint): a run's dir (train.sh's OUT), its
ppo/ output dir, its hf/ export or any HF model dir, the same for evaluate, test.sh, infer.py, the server and
calibration."""
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

import infer
import router_r1.calibrate
import router_r1.serve
from own_qa_run import tiny_run
from router_r1.eval.evaluate import main as evaluate_main
from router_r1.runtime import EvalError, resolve_checkpoint
from sim_split import sim_test_split

REPO = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def run(trained_router, tmp_path_factory):
    return tiny_run(trained_router, tmp_path_factory.mktemp("own") / "RUN")


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    return sim_test_split(tmp_path_factory.mktemp("data"), test_size=2)


def test_each_form_names_its_export_and_a_step_dir_is_explained(run):
    assert resolve_checkpoint(run) == run / "hf"
    assert resolve_checkpoint(run / "ppo") == run / "ppo" / "hf"
    assert resolve_checkpoint(run / "hf") == resolve_checkpoint(str(run / "hf")) == run / "hf"
    step = run / "ppo" / "checkpoints" / "step_000002"
    step.mkdir(parents=True)
    (step / "COMPLETE").write_text("{}")
    with pytest.raises(EvalError, match=rf"no checkpoint at {step} is a training checkpoint .*hf/ export"):
        resolve_checkpoint(step)
    with pytest.raises(EvalError, match=rf"no checkpoint at {run / 'nowhere'} or {run / 'nowhere' / 'hf'}"):
        resolve_checkpoint(run / "nowhere")
    # the server and calibration resolve with this same function, not a copy of it
    assert router_r1.serve.resolve_checkpoint is router_r1.calibrate.resolve_checkpoint is resolve_checkpoint
    assert infer.resolve_checkpoint is resolve_checkpoint


def test_evaluate_test_sh_and_infer_take_a_run_s_dir(run, data, tmp_path, capsys):
    out = tmp_path / "ppo_dir"
    code = evaluate_main(["--checkpoint", str(run / "ppo"), "--data", str(data), "--sim", "--limit", "1",
                          "--out", str(out), "--device", "cpu"])
    assert code == 0, capsys.readouterr().err  # was "no checkpoint at RUN/ppo"
    assert json.loads((out / "summary.json").read_text())["config"]["checkpoints"] == [str(run / "ppo" / "hf")]

    env = {**os.environ, "PYTHON": sys.executable, "OMP_NUM_THREADS": "1"}
    proc = subprocess.run(["bash", "test.sh", "--checkpoint", str(run), "--data", str(data), "--limit", "1",
                           "--out", str(tmp_path / "run_dir"), "--device", "cpu"], cwd=REPO, env=env,
                          capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-2000:]
    summary = json.loads((tmp_path / "run_dir" / "summary.json").read_text())
    assert summary["config"]["checkpoints"] == [str(run / "hf")]

    proc = subprocess.run([sys.executable, "infer.py", "--question", "What is the capital of Veloria?",
                           "--checkpoint", str(run / "ppo"), "--json", "--device", "cpu"], cwd=REPO, env=env,
                          capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert json.loads(proc.stdout)["checkpoint"] == str(run / "ppo" / "hf")
