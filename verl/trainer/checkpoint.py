"""A training checkpoint's manifest (every file, its size and checksum), its check, and which one to resume.

A step directory holds actor/, critic/ (the workers' sharded state), trainer_state.pt and
trainer_state.json. The controller writes `COMPLETE` last: a JSON manifest of every other
file with its size and xxh3-128 digest. A save cut by a kill has no manifest; a file that
was changed afterwards (a bit flip, a scaled tensor, a truncated copy) fails the digest
even when its size is unchanged. xxh3 detects accidental damage, not tampering; it hashes
~5x faster than sha256 here (tools/bench/bench_checksum.py measures both).
"""
from __future__ import annotations

import json
import os
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Callable

import xxhash

from verl.workers.fsdp import CheckpointError

MANIFEST = "COMPLETE"  # written last into a step directory
HASH = "xxh3_128"
CHUNK = 16 << 20  # bytes read per update; xxhash releases the GIL on large buffers


def file_digest(path: str | os.PathLike) -> str:
    """xxh3-128 hex digest of a file's bytes."""
    h = xxhash.xxh3_128()
    with open(path, "rb", buffering=0) as f:
        buf = bytearray(CHUNK)
        view = memoryview(buf)
        while n := f.readinto(buf):
            h.update(view[:n])
    return h.hexdigest()


def _digests(root: Path, rels: list[str]) -> list[str]:
    # Files are hashed in parallel: a sharded save has one state file per rank.
    with ThreadPoolExecutor(max_workers=min(8, os.cpu_count() or 1, max(1, len(rels)))) as pool:
        return list(pool.map(lambda rel: file_digest(root / rel), rels))


def write_manifest(step_dir: str | os.PathLike, step: int) -> dict:
    """List every file under step_dir with size and digest in `COMPLETE` (atomically, last)."""
    step_dir = Path(step_dir)
    rels = sorted(str(p.relative_to(step_dir)) for p in step_dir.rglob("*")
                  if p.is_file() and p.name not in (MANIFEST, MANIFEST + ".tmp"))
    files = {rel: {"size": (step_dir / rel).stat().st_size, HASH: d}
             for rel, d in zip(rels, _digests(step_dir, rels))}
    manifest = {"step": step, "hash": HASH, "files": files}
    tmp = step_dir / (MANIFEST + ".tmp")
    tmp.write_text(json.dumps(manifest, indent=1))
    os.replace(tmp, step_dir / MANIFEST)
    return manifest


def verify(step_dir: str | os.PathLike) -> dict:
    """The manifest if every file it lists is there with its size and digest; else CheckpointError naming the file."""
    step_dir = Path(step_dir)
    marker = step_dir / MANIFEST
    if not step_dir.is_dir():
        raise CheckpointError(f"{step_dir}: checkpoint directory not found")
    if not marker.is_file():
        raise CheckpointError(f"{step_dir}: checkpoint is incomplete (no {MANIFEST} manifest): the save was cut, "
                              "or the manifest was removed")
    try:
        manifest = json.loads(marker.read_text())
        files = manifest["files"]
    except (ValueError, KeyError, TypeError) as e:  # a pre-checksum "ok" marker, or a damaged one
        raise CheckpointError(f"{marker}: not a checkpoint manifest ({type(e).__name__}); "
                              "the checkpoint cannot be verified") from e
    if "trainer_state.pt" not in files:
        raise CheckpointError(f"{step_dir}: the manifest does not list trainer_state.pt")
    for rel, want in files.items():
        path = step_dir / rel
        if not path.is_file():
            raise CheckpointError(f"{path}: missing (listed in {marker})")
        if path.stat().st_size != want["size"]:
            raise CheckpointError(f"{path}: {path.stat().st_size} bytes, the manifest says {want['size']}")
    rels = list(files)
    for rel, got in zip(rels, _digests(step_dir, rels)):
        if got != files[rel][manifest.get("hash", HASH)]:
            raise CheckpointError(f"{step_dir / rel}: checksum mismatch (the file changed after it was saved)")
    return manifest


def step_dirs(root: str | os.PathLike) -> list[Path]:
    """Checkpoint directories under root/checkpoints that have a manifest, oldest first."""
    root = Path(root) / "checkpoints"
    return sorted(p for p in root.glob("step_*") if (p / MANIFEST).exists()) if root.is_dir() else []


def resume_newest(root: str | os.PathLike, load: Callable[[Path], None], log: Callable[[str], None] = print,
                  check: Callable[[Path], object] = verify) -> Path | None:
    """`check` and `load` the newest complete checkpoint under root; a damaged one, or one without its
    manifest, is reported by name and step and the one before it tried (resume=auto). Returns the
    directory loaded, or None when there is none."""
    base = Path(root) / "checkpoints"
    found = sorted(p for p in base.glob("step_*") if p.is_dir()) if base.is_dir() else []
    dirs = step_dirs(root)
    for step_dir in reversed(found):
        older = "trying the previous one" if any(d < step_dir for d in dirs) else "no older checkpoint is left"
        if step_dir not in dirs:
            step = step_dir.name.removeprefix("step_").lstrip("0") or "0"
            log(f"WARNING: resume=auto skips {step_dir} (step {step}): no {MANIFEST} manifest (the save was cut, "
                f"or the manifest was removed); {older}")
            continue
        try:
            check(step_dir)
            load(step_dir)
            return step_dir
        except CheckpointError as e:
            log(f"WARNING: resume=auto skips a damaged checkpoint: {e}; {older}")
    if dirs:
        raise CheckpointError(f"{base}: all {len(dirs)} checkpoints are damaged "
                              "(see the warnings above); set trainer.resume=none to start over")
    if found:
        log(f"WARNING: resume=auto found no complete checkpoint under {base}: training starts from step 0")
    return None


class RunDirError(RuntimeError):
    """trainer.output_dir holds a run this command would overwrite, continue with other settings, or not train."""


RUN_MARKS = ("checkpoints", "metrics.jsonl", "rollouts.jsonl")  # what makes an output_dir a used one


def move_aside(out_dir: str | os.PathLike, log: Callable[[str], None] = print) -> Path | None:
    """trainer.resume=none: a used out_dir (checkpoints, metrics.jsonl or rollouts.jsonl) is renamed to the
    sibling out_dir.old-<time>[-N] (created atomically, never an existing one) and the move is logged;
    returns where it went, or None for an unused or missing directory. Nothing is deleted."""
    out_dir = Path(out_dir)
    marks = [m for m in RUN_MARKS if (out_dir / m).exists()]
    if not marks:
        return None
    stamp = time.strftime("%Y%m%d-%H%M%S")
    for n in range(1, 1000):
        dest = out_dir.with_name(f"{out_dir.name}.old-{stamp}" + (f"-{n}" if n > 1 else ""))
        try:
            dest.mkdir()
            break
        except FileExistsError:
            continue
    else:
        raise RunDirError(f"{out_dir}: no free name to move the old run aside")
    os.replace(out_dir, dest)  # onto the empty directory just reserved: atomic, no copy
    log(f"trainer.resume=none: {out_dir} held a run ({', '.join(marks)}); moved it to {dest}")
    return dest


def verified(step_dir: Path) -> bool:
    """Whether `verify` passes."""
    try:
        verify(step_dir)
        return True
    except CheckpointError:
        return False


def step_of(step_dir: Path) -> int:
    """The training step a checkpoint directory was saved at (trainer_state.json; else its name)."""
    try:
        return int(json.loads((step_dir / "trainer_state.json").read_text())["global_step"])
    except (OSError, ValueError, KeyError, TypeError):
        return int(step_dir.name.removeprefix("step_"))


def check_resume(step_dir: Path, cfg, log: Callable[[str], None] = print) -> None:
    """RunDirError when resuming from step_dir would train nothing (the run already reached
    trainer.total_steps), or train on with training settings other than the checkpoint's (config.training_changes)
    without trainer.resume_changed_ok; other differences are logged."""
    from omegaconf import OmegaConf

    from verl.trainer.config import RUN_CONFIG, config_changes, env_config_class, training_changes

    t = cfg.trainer
    step = step_of(step_dir)
    if step >= t.total_steps and verified(step_dir):  # a damaged one would be skipped for an older one
        raise RunDirError(
            f"{t.output_dir} holds a finished run: {step_dir.name} is step {step}, and trainer.total_steps="
            f"{t.total_steps} asks for nothing more. Raise trainer.total_steps to train on, set "
            "trainer.resume=none to start a new run there (the old one is moved aside), or choose another "
            "trainer.output_dir")
    saved = step_dir / RUN_CONFIG
    if not saved.is_file():
        return
    saved_cfg = OmegaConf.load(saved)
    factory = OmegaConf.select(cfg, "env.factory")
    cls = env_config_class(factory) if factory else None
    training = training_changes(saved_cfg, cfg, getattr(cls, "not_training", ()), cls)
    if training and not t.get("resume_changed_ok", False):
        raise RunDirError(
            f"{t.output_dir}: resuming {step_dir.name} (step {step}) with other training settings than it was "
            f"trained with, in {len(training)} key(s): " + "; ".join(training) + ". Set "
            "trainer.resume_changed_ok=true if the change is meant, trainer.resume=none for a new run (the old "
            "one is moved aside), or choose another trainer.output_dir")
    changes = config_changes(saved_cfg, cfg)
    if changes:
        kind = "training settings among them, allowed by trainer.resume_changed_ok" if training else \
            "no training setting among them"
        log(f"note: the config differs from the one {step_dir.name} was saved with, in {len(changes)} key(s) "
            f"({kind}): " + "; ".join(changes))
