"""The HF export's manifest (each model file, its size and checksum) and its check at load, as checkpoints have.

export_hf writes `export_manifest.json` last, listing the model's files (weights, config) with their size and xxh3-128
digest (verl/trainer/checkpoint.py's digest); a file that was cut (a copy that ran out of disk) or
changed afterwards fails the check naming it. A directory without the manifest (a model from the hub,
an export older than the manifest) is loaded unchecked.
"""
from __future__ import annotations

import json
import os
from pathlib import Path

from verl.trainer.checkpoint import HASH, file_digest

MANIFEST = "export_manifest.json"
# the model's own files; run_config.yaml and prompt_template.txt are written beside them afterwards (and rewritten
# by a later run into the same directory), so they are not listed
MODEL_FILES = ("config.json", "generation_config.json", "*.safetensors", "*.bin", "*.index.json")


class ExportError(ValueError):
    """An HF export that is damaged: a file missing, of another size or checksum, or weights that are not finite."""


def write_manifest(export_dir: str | os.PathLike) -> dict:
    """List the model's files (MODEL_FILES) in export_dir with size and digest in MANIFEST (atomically, last)."""
    export_dir = Path(export_dir)
    rels = sorted({p.name for pattern in MODEL_FILES for p in export_dir.glob(pattern) if p.is_file()})
    manifest = {"hash": HASH, "files": {rel: {"size": (export_dir / rel).stat().st_size,
                                              HASH: file_digest(export_dir / rel)} for rel in rels}}
    tmp = export_dir / (MANIFEST + ".tmp")
    tmp.write_text(json.dumps(manifest, indent=1))
    os.replace(tmp, export_dir / MANIFEST)
    return manifest


def verify(export_dir: str | os.PathLike) -> dict | None:
    """The manifest if every file it lists is there with its size and digest (None: no manifest to check);
    else ExportError naming the file."""
    export_dir = Path(export_dir)
    marker = export_dir / MANIFEST
    if not marker.is_file():
        return None
    try:
        manifest = json.loads(marker.read_text())
        files = manifest["files"]
        hash_name = manifest.get("hash", HASH)
    except (ValueError, KeyError, TypeError) as e:
        raise ExportError(f"{marker}: not an export manifest ({type(e).__name__})") from e
    for rel, want in files.items():
        path = export_dir / rel
        if not path.is_file():
            raise ExportError(f"{path}: missing (listed in {marker})")
        if path.stat().st_size != want["size"]:
            raise ExportError(f"{path}: {path.stat().st_size} bytes, the manifest says {want['size']} (cut or "
                              "replaced after the export)")
        if file_digest(path) != want[hash_name]:
            raise ExportError(f"{path}: checksum mismatch (the file changed after the export)")
    return manifest


def nonfinite_weight(model) -> str | None:
    """The name of the first floating-point weight holding NaN or inf, else None."""
    import torch

    for name, t in model.state_dict().items():
        if t.is_floating_point() and not bool(torch.isfinite(t).all()):
            return name
    return None
