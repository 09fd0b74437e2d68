"""FSDP2 sharding and sharded state: wrap a model, gather its full weights, save/load checkpoints.

Used only when world_size > 1; a single process trains the plain module (same code
path otherwise, and no process group is needed for CPU tests).
Optimizer state offload: with cpu_offload=True FSDP2's CPUOffloadPolicy keeps params,
grads and optimizer state on CPU (the step runs there); there is no separate
optimizer-only offload.
"""
from __future__ import annotations

import contextlib
import json
import os
import random
import warnings

import numpy as np
import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint.api import CheckpointException
from torch import nn
from torch.distributed.checkpoint.state_dict import StateDictOptions, get_state_dict, set_state_dict
from torch.distributed.fsdp import CPUOffloadPolicy, MixedPrecisionPolicy, fully_shard
from torch.distributed.tensor import DTensor

MARKER = "COMPLETE.json"


class CheckpointError(RuntimeError):
    """A checkpoint directory that is missing, incomplete or damaged."""


def decoder_layers(model: nn.Module) -> list[nn.Module]:
    """The blocks HF marks as not splittable (`_no_split_modules`): one FSDP unit each."""
    names = set()
    for m in model.modules():
        names.update(getattr(m, "_no_split_modules", None) or [])
    layers = [m for m in model.modules() if type(m).__name__ in names]
    if not layers:
        raise ValueError(f"no decoder layers found in {type(model).__name__} (_no_split_modules={sorted(names)})")
    return layers


def apply_fsdp2(model: nn.Module, device_mesh, param_dtype: torch.dtype = torch.float32,
                reduce_dtype: torch.dtype = torch.float32, reshard_after_forward: bool = True,
                cpu_offload: bool = False) -> nn.Module:
    """Shard each decoder layer, then the root (embeddings, final norm, head), in place."""
    kwargs = dict(
        mesh=device_mesh,
        mp_policy=MixedPrecisionPolicy(param_dtype=param_dtype, reduce_dtype=reduce_dtype),
        reshard_after_forward=reshard_after_forward,
    )
    if cpu_offload:
        kwargs["offload_policy"] = CPUOffloadPolicy(pin_memory=torch.cuda.is_available())
    for layer in decoder_layers(model):
        fully_shard(layer, **kwargs)
    fully_shard(model, **kwargs)
    return model


def full_state_dict(model: nn.Module, rank0_only: bool = False) -> dict[str, torch.Tensor]:
    """Unsharded CPU copy of the weights; a collective under FSDP (every rank must call).

    With rank0_only the other ranks get {} (and keep no copy)."""
    keep = not rank0_only or not dist.is_initialized() or dist.get_rank() == 0
    out = {}
    for name, t in model.state_dict().items():
        if isinstance(t, DTensor):
            t = t.full_tensor()
        if keep:
            out[name] = t.detach().to("cpu", copy=True)
    return out


def _rng_state() -> dict:
    return {"torch": torch.get_rng_state(), "numpy": np.random.get_state(), "python": random.getstate(),
            "cuda": torch.cuda.get_rng_state_all() if torch.cuda.is_available() else None}


def _set_rng_state(state: dict) -> None:
    torch.set_rng_state(state["torch"])
    np.random.set_state(state["numpy"])
    random.setstate(state["python"])
    if state["cuda"] is not None and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])


@contextlib.contextmanager
def _quiet_single_process():
    """DCP warns on every call without a process group; one process is a supported case here."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="torch.distributed is disabled")
        yield


def _barrier() -> None:
    if dist.is_initialized():
        dist.barrier()


def save_checkpoint(path: str, model: nn.Module, optimizer, extra: dict, adapter_only: bool = False) -> None:
    """Sharded model + optimizer (torch.distributed.checkpoint), `extra` and per-rank RNG;
    rank 0 writes the marker last, listing every file and its size. `adapter_only`: the frozen
    parameters (a LoRA run's base weights, which the model spec reloads) are left out."""
    rank = dist.get_rank() if dist.is_initialized() else 0
    marker = os.path.join(path, MARKER)
    if rank == 0:
        os.makedirs(path, exist_ok=True)
        if os.path.exists(marker):  # overwriting: a crash from here on must read as incomplete
            os.remove(marker)
    _barrier()
    model_sd, optim_sd = get_state_dict(model, optimizer, options=StateDictOptions(ignore_frozen_params=adapter_only))
    with _quiet_single_process():
        dcp.save({"model": model_sd, "optim": optim_sd}, checkpoint_id=os.path.join(path, "state"))
    torch.save(_rng_state(), os.path.join(path, f"rng_rank{rank}.pt"))
    if rank == 0:
        torch.save(extra, os.path.join(path, "extra.pt"))
    _barrier()
    if rank == 0:
        files = {}
        for root, _, names in os.walk(path):
            for name in names:
                full = os.path.join(root, name)
                files[os.path.relpath(full, path)] = os.path.getsize(full)
        world = dist.get_world_size() if dist.is_initialized() else 1
        with open(marker + ".tmp", "w") as f:
            json.dump({"world_size": world, "adapter_only": adapter_only, "files": files}, f, indent=1)
        os.replace(marker + ".tmp", marker)
    _barrier()


def verify_checkpoint(path: str) -> dict:
    """Raise CheckpointError naming the path unless the marker is there and every file it lists is whole."""
    marker = os.path.join(path, MARKER)
    if not os.path.isdir(path):
        raise CheckpointError(f"checkpoint directory not found: {path}")
    if not os.path.isfile(marker):
        raise CheckpointError(f"incomplete checkpoint {path}: marker {MARKER} is missing (save was interrupted?)")
    with open(marker) as f:
        info = json.load(f)
    for rel, size in info["files"].items():
        full = os.path.join(path, rel)
        if not os.path.isfile(full):
            raise CheckpointError(f"damaged checkpoint: {full} is missing")
        if os.path.getsize(full) != size:
            raise CheckpointError(f"damaged checkpoint: {full} has {os.path.getsize(full)} bytes, expected {size}")
    return info


def _nonfinite_weight(model: nn.Module) -> str | None:
    """Which loaded weight holds NaN/inf (this rank's shard), agreed over ranks; None if all are finite."""
    found = None
    for name, t in model.state_dict().items():
        t = t.to_local() if isinstance(t, DTensor) else t
        if t.is_floating_point() and not bool(torch.isfinite(t).all()):
            found = f"weight {name} holds NaN or inf"
            break
    if dist.is_initialized() and dist.get_world_size() > 1:  # every rank must raise, or the others hang
        device = next(model.parameters()).device
        flag = torch.tensor([found is not None], dtype=torch.int32, device=device)
        dist.all_reduce(flag, op=dist.ReduceOp.MAX)
        if flag.item() and found is None:
            found = "another rank's shard holds NaN or inf weights"
    return found


def load_checkpoint(path: str, model: nn.Module, optimizer, adapter_only: bool = False) -> dict:
    """Load what save_checkpoint wrote (any world size); returns `extra`. RNG is restored
    only when the checkpoint was written with the current world size. `adapter_only` must
    match the save (a LoRA checkpoint holds no base weights; a full one is not an adapter)."""
    info = verify_checkpoint(path)
    saved = info.get("adapter_only", False)
    if saved != adapter_only:
        what = {True: "LoRA adapters only", False: "full weights"}
        raise CheckpointError(f"checkpoint {path} holds {what[saved]}, but this model trains {what[adapter_only]} "
                              "(check actor.lora.rank / critic.lora.rank)")
    rank = dist.get_rank() if dist.is_initialized() else 0
    world = dist.get_world_size() if dist.is_initialized() else 1
    options = StateDictOptions(ignore_frozen_params=adapter_only)
    model_sd, optim_sd = get_state_dict(model, optimizer, options=options)
    state = {"model": model_sd, "optim": optim_sd}
    try:
        with _quiet_single_process():
            dcp.load(state, checkpoint_id=os.path.join(path, "state"))
        # Our own files hold numpy / python RNG state, which weights_only rejects.
        extra = torch.load(os.path.join(path, "extra.pt"), weights_only=False)
        rng_file = os.path.join(path, f"rng_rank{rank}.pt")
        rng = torch.load(rng_file, weights_only=False) if info["world_size"] == world else None
    except (Exception, CheckpointException) as e:  # DCP's CheckpointException is a BaseException
        raise CheckpointError(f"could not read checkpoint {path}: {type(e).__name__}: {str(e)[:2000]}") from e
    # dcp.load already failed on any key it was asked for and did not find; the frozen ones are not asked for
    set_state_dict(model, optimizer, model_state_dict=state["model"], optim_state_dict=state["optim"],
                   options=StateDictOptions(ignore_frozen_params=adapter_only, strict=not adapter_only))
    bad = _nonfinite_weight(model)
    if bad:
        raise CheckpointError(f"damaged checkpoint {path}: {bad}")
    if rng is not None:
        _set_rng_state(rng)
    return extra
