"""Checkpoints on real files: checksums catch same-size damage, resume=auto falls back past a damaged
checkpoint, torch's CheckpointException and non-finite weights become our error naming the path,
and a resumed run's metrics/rollouts JSONL hold one row per step."""
import json
import shutil
from pathlib import Path

import pytest
import torch
from hydra import compose, initialize_config_dir
from tiny import tiny_model

from verl.trainer import checkpoint
from verl.trainer.main_ppo import CONFIG_DIR, run
from verl.trainer.tracking import read_jsonl, trim_jsonl
from verl.workers import fsdp
from verl.workers.fsdp import CheckpointError

ROOT = Path(__file__).resolve().parents[1]
TOY = ROOT / "tests" / "data" / "toy_prompts.parquet"
SMALL = ["trainer.logger=[jsonl]", f"data.train_files=[{TOY}]", "data.val_files=[]", "data.train_batch_size=4",
         "rollout.response_length=8", "trainer.test_freq=0", "trainer.export_hf=false", "trainer.save_freq=1",
         "trainer.dump_rollouts=1", "trainer.max_checkpoints=0"]


def config(out, *overrides):
    with initialize_config_dir(CONFIG_DIR, version_base=None):
        return compose("ppo_trainer", overrides=[f"trainer.output_dir={out}", *SMALL, *overrides])


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    """A real 2-step run, saved after each step."""
    out = tmp_path_factory.mktemp("run")
    run(config(out, "trainer.total_steps=2"))
    return out


@pytest.fixture
def copy(trained, tmp_path):
    out = tmp_path / "run"
    shutil.copytree(trained, out)
    return out


def _flip(path: Path, offset: int = 64) -> None:
    """Change bytes in place: the file keeps its size (the damage a size check misses)."""
    data = bytearray(path.read_bytes())
    data[offset:offset + 8] = bytes(b ^ 0xFF for b in data[offset:offset + 8])
    path.write_bytes(bytes(data))


def _state_file(step_dir: Path) -> Path:
    return next((step_dir / "actor" / "state").glob("*.distcp"))


def test_manifest_lists_every_file_with_a_checksum(trained):
    step_dir = trained / "checkpoints" / "step_000002"
    manifest = json.loads((step_dir / checkpoint.MANIFEST).read_text())
    on_disk = {str(p.relative_to(step_dir)) for p in step_dir.rglob("*") if p.is_file() and p.name != "COMPLETE"}
    assert set(manifest["files"]) == on_disk
    assert {"trainer_state.pt", "actor/COMPLETE.json", "critic/extra.pt"} <= on_disk
    assert manifest["files"]["trainer_state.pt"]["xxh3_128"] == checkpoint.file_digest(step_dir / "trainer_state.pt")
    assert checkpoint.verify(step_dir)["step"] == 2


@pytest.mark.parametrize("damaged", ["actor", "trainer_state.pt"])
def test_same_size_damage_is_an_error_naming_the_file(copy, damaged):
    step_dir = copy / "checkpoints" / "step_000002"
    path = _state_file(step_dir) if damaged == "actor" else step_dir / damaged
    size = path.stat().st_size
    _flip(path)
    assert path.stat().st_size == size
    with pytest.raises(CheckpointError, match=f"{path}: checksum mismatch"):
        run(config(copy, "trainer.total_steps=3", f"trainer.resume={step_dir}"))


def test_auto_resume_skips_a_damaged_newest_checkpoint_and_trims_the_logs(copy, capsys):
    _flip(_state_file(copy / "checkpoints" / "step_000002"))
    before = read_jsonl(copy / "metrics.jsonl")
    assert [r["step"] for r in before] == [0, 1, 2]
    run(config(copy, "trainer.total_steps=2"))  # resume=auto: step 2 is damaged, so step 1, and step 2 is redone
    printed = capsys.readouterr().out
    assert "resume=auto skips a damaged checkpoint" in printed and "step_000002" in printed
    assert f"resumed from {copy / 'checkpoints' / 'step_000001'} (step 1)" in printed
    after = read_jsonl(copy / "metrics.jsonl")
    assert [r["step"] for r in after] == [0, 1, 2]  # one row per step, not the killed run's step 2 as well
    assert after[:2] == before[:2]
    assert [r["step"] for r in read_jsonl(copy / "rollouts.jsonl")] == [1, 2]
    checkpoint.verify(copy / "checkpoints" / "step_000002")  # saved again, whole


def test_auto_resume_with_every_checkpoint_damaged_is_an_error(copy):
    for step in (1, 2):
        _flip(copy / "checkpoints" / f"step_00000{step}" / "trainer_state.pt", offset=8)
    with pytest.raises(CheckpointError, match="all 2 checkpoints are damaged"):
        run(config(copy, "trainer.total_steps=3"))


def test_auto_resume_names_each_checkpoint_it_skips_for_a_missing_manifest(tmp_path):
    """A step directory whose manifest was deleted (or never written) is passed over by name and step."""
    ck = tmp_path / "checkpoints"
    for step in (1, 2, 3):
        (ck / f"step_{step:06d}").mkdir(parents=True)
        torch.save({"global_step": step}, ck / f"step_{step:06d}" / "trainer_state.pt")
        checkpoint.write_manifest(ck / f"step_{step:06d}", step)
    (ck / "step_000003" / checkpoint.MANIFEST).unlink()
    logs, loaded = [], []
    assert checkpoint.resume_newest(tmp_path, loaded.append, logs.append) == ck / "step_000002"
    assert loaded == [ck / "step_000002"]
    assert logs == [f"WARNING: resume=auto skips {ck / 'step_000003'} (step 3): no COMPLETE manifest (the save was "
                    "cut, or the manifest was removed); trying the previous one"]
    for step in (1, 2):
        (ck / f"step_{step:06d}" / checkpoint.MANIFEST).unlink()
    logs.clear()
    assert checkpoint.resume_newest(tmp_path, loaded.append, logs.append) is None
    assert [line.split(" (step ")[1][:1] for line in logs[:3]] == ["3", "2", "1"]
    assert all(line.endswith("no older checkpoint is left") for line in logs[:3])
    assert logs[3] == f"WARNING: resume=auto found no complete checkpoint under {ck}: training starts from step 0"


def test_trim_jsonl_drops_redone_steps_and_a_cut_line(tmp_path):
    path = tmp_path / "metrics.jsonl"
    path.write_text("".join(json.dumps({"step": s, "x": s}) + "\n" for s in (0, 1, 2, 3)) + '{"step": 4, "x"')
    assert trim_jsonl(path, 2) == 2
    assert [r["step"] for r in read_jsonl(path)] == [0, 1, 2]
    assert trim_jsonl(path, 0) == 3 and path.read_text() == ""  # a fresh start keeps nothing


def _saved_tiny(tmp_path, poison=None):
    torch.manual_seed(0)
    model = tiny_model(64)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    if poison is not None:
        with torch.no_grad():
            dict(model.named_parameters())[poison].view(-1)[3] = float("nan")
    path = str(tmp_path / "actor")
    fsdp.save_checkpoint(path, model, opt, {"scheduler": {}})
    return path, model, opt


def test_nonfinite_weights_are_refused_at_load(tmp_path):
    name = "model.layers.0.mlp.up_proj.weight"
    path, model, opt = _saved_tiny(tmp_path, poison=name)
    with pytest.raises(CheckpointError, match=f"damaged checkpoint {path}: weight {name} holds NaN"):
        fsdp.load_checkpoint(path, model, opt)


def test_torch_checkpoint_exception_is_wrapped_naming_the_path(tmp_path):
    path, model, opt = _saved_tiny(tmp_path)
    # A shard file cut short, with the size list rewritten to match: only DCP's read can notice, and it
    # raises CheckpointException, which `except Exception` does not catch.
    shard = next(Path(path, "state").glob("*.distcp"))
    shard.write_bytes(shard.read_bytes()[:100])
    marker = Path(path, fsdp.MARKER)
    info = json.loads(marker.read_text())
    info["files"][str(shard.relative_to(path))] = 100
    marker.write_text(json.dumps(info))
    with pytest.raises(CheckpointError, match=f"could not read checkpoint {path}: CheckpointException"):
        fsdp.load_checkpoint(path, model, opt)


def test_read_jsonl_skips_only_a_cut_last_line_and_names_a_broken_one_before_it(tmp_path):
    path = tmp_path / "metrics.jsonl"
    rows = "".join(json.dumps({"step": s}) + "\n" for s in (1, 2))
    path.write_text(rows + '{"step": 3, "x"')  # a run killed mid-write
    assert [r["step"] for r in read_jsonl(path)] == [1, 2]
    path.write_text('{"step": 1}\n{"step": 2, "x\n{"step": 3}\n\n')
    with pytest.raises(ValueError, match=r"metrics.jsonl:2: not a JSON line"):
        read_jsonl(path)
