"""A damaged HF export (issue 45.17): a cut model.safetensors, a file changed after the export, NaN weights.
Each is refused when evaluate, serve or infer load it, naming the file or the weight, with exit 2."""
from __future__ import annotations

import shutil

import pytest
import torch
from transformers import AutoModelForCausalLM

from router_r1.runtime import EvalError, load_policy
from verl.utils.export_manifest import MANIFEST, verify, write_manifest


@pytest.fixture
def export(trained_router, tmp_path):
    """A copy of the tiny trained router with the manifest export_hf writes."""
    out = tmp_path / "hf"
    shutil.copytree(trained_router, out)
    write_manifest(out)
    return out


def _serve_exit(checkpoint, capsys) -> tuple[int, str]:
    from router_r1.serve import main
    code = main(["--checkpoint", str(checkpoint), "--sim", "--port", "0"])  # 2 before it would listen
    return code, capsys.readouterr().err


def _infer_exit(checkpoint, capsys) -> tuple[int, str]:
    import infer
    code = infer.main(["--checkpoint", str(checkpoint), "--question", "What is the capital of Veloria?", "--sim"])
    return code, capsys.readouterr().err


@pytest.mark.parametrize("manifest", [True, False])
def test_a_cut_safetensors_file_is_named(export, capsys, manifest):
    """Before: safetensors' raw SafetensorError ('incomplete metadata'), naming no file, out of every entry point."""
    if not manifest:  # a model dir from elsewhere: no manifest to check, safetensors' own error is translated
        (export / MANIFEST).unlink()
    weights = export / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[: weights.stat().st_size // 2])
    with pytest.raises(EvalError, match="model.safetensors"):
        load_policy(export)
    for run in (_serve_exit, _infer_exit):
        code, err = run(export, capsys)
        assert code == 2 and str(weights) in err and "Traceback" not in err, err


def test_a_weight_file_changed_after_the_export_fails_its_checksum(export, capsys):
    weights = export / "model.safetensors"
    data = bytearray(weights.read_bytes())
    data[-3] ^= 0x40  # one bit, same size: a loadable file with other weights
    weights.write_bytes(bytes(data))
    with pytest.raises(EvalError, match="model.safetensors: checksum mismatch"):
        load_policy(export)


def test_an_export_with_nan_weights_is_refused(export, capsys):
    """Before: NaN weights loaded and evaluated (every answer garbage) with exit 0."""
    model = AutoModelForCausalLM.from_pretrained(export)
    with torch.no_grad():
        next(model.parameters()).fill_(float("nan"))
    model.save_pretrained(export)
    write_manifest(export)  # as an export of a diverged run would: the files are whole, the weights are not
    assert verify(export) is not None
    with pytest.raises(EvalError, match="NaN"):
        load_policy(export)
    code, err = _serve_exit(export, capsys)
    assert code == 2 and "NaN" in err, err


def test_the_manifest_lists_the_model_files_only(export):
    files = set(verify(export)["files"])
    assert {"model.safetensors", "config.json"} <= files
    assert not files & {"run_config.yaml", "prompt_template.txt"}  # written beside the export later, rewritable
    (export / "run_config.yaml").write_text("env: {}\n")
    assert verify(export) is not None
