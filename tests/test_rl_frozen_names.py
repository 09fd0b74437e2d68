"""experiments/rl_frozen_names: the warm-start copy whose config names every entity of the world as a frozen row,
built from a real (tiny) warm start's tokenizer; refused where names are not whole tokens."""
import json
import subprocess
import sys
from pathlib import Path

import pytest
from transformers import AutoTokenizer

from sim.warm_start.cli import main as oracle_main
from sim.world import SimWorld
from verl.utils.export_manifest import verify, write_manifest

ROOT = Path(__file__).resolve().parents[1]


def warm_start(tmp_path: Path, *flags: str) -> Path:
    """An SFT_FROM-shaped folder around a real oracle build (its tokenizer stands in for the SFT model's)."""
    src = tmp_path / "src"
    assert oracle_main(["--out-dir", str(src / "oracle"), "--n", "20", "--vocab-size", "600", *flags]) == 0
    sft = src / "sft"
    sft.mkdir()
    for f in (src / "oracle" / "tokenizer").iterdir():
        (sft / f.name).write_bytes(f.read_bytes())
    (sft / "config.json").write_text(json.dumps({"model_type": "llama", "vocab_size": 4096}))
    (sft / "checkpoints").mkdir()
    write_manifest(sft)
    (src / "data").mkdir()
    (src / "world.env").write_text("WORLD_SEED=0\nPOOL=configs/pool/sim.yaml\n")
    return src


def freeze(src: Path, dst: Path):
    return subprocess.run([sys.executable, "-m", "experiments.rl_frozen_names.freeze", str(src), str(dst)],
                          cwd=ROOT, capture_output=True, text=True, timeout=300)


def test_every_entity_name_is_a_frozen_row_and_nothing_else(tmp_path):
    src = warm_start(tmp_path, "--whole-names")
    done = freeze(src, tmp_path / "dst")
    assert done.returncode == 0, done.stderr
    dst = tmp_path / "dst"
    ids = json.loads((dst / "sft" / "config.json").read_text())["frozen_token_ids"]
    tok = AutoTokenizer.from_pretrained(dst / "sft")
    assert sorted(tok.convert_ids_to_tokens(ids)) == sorted(SimWorld(seed=0).entities)
    assert not (dst / "sft" / "checkpoints").exists() and (dst / "data").is_symlink()
    assert "frozen_token_ids" not in json.loads((src / "sft" / "config.json").read_text())  # the source is untouched
    assert verify(dst / "sft")  # evaluation loads the copy: its manifest vouches for the edited config
    (src / "world.env").write_text("WORLD_SEED=3\nPOOL=configs/pool/sim.yaml\n")  # the world is read from there:
    other = freeze(src, tmp_path / "other")  # world 3's names are not this world-0 tokenizer's
    assert other.returncode != 0 and "entity names as one token" in other.stderr


def test_a_tokenizer_without_whole_names_is_refused(tmp_path):
    done = freeze(warm_start(tmp_path), tmp_path / "dst")
    assert done.returncode != 0 and "entity names as one token" in done.stderr
    assert not (tmp_path / "dst").exists()  # nothing half-made
