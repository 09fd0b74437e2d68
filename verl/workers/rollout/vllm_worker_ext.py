"""Runs inside vLLM's GPU worker: receives the actor's weights in buckets and loads them.

vLLM mixes this class into its worker when the engine is built with
`worker_extension_cls="verl.workers.rollout.vllm_worker_ext.WeightSyncExtension"` (an import
path: the worker lives in vLLM's engine process, so a class object cannot be sent). The trainer
then calls its methods by name through `collective_rpc`, whose arguments vLLM V1 msgpack-encodes:
so the only argument is `bytes` (a pickled CUDA IPC handle of one bucket plus the names, dtypes,
shapes and byte offsets of its tensors). The weights themselves never leave the GPU.

Call order per sync: `load_weight_bucket(payload)` once per bucket, then `finish_weight_sync()`.
"""
from __future__ import annotations

import pickle
from dataclasses import dataclass

import torch

# torch's rebuild_cuda_tensor arguments (torch.multiprocessing.reductions.reduce_tensor): index 6
# is the CUDA device index in the sender's numbering; the engine process may number the same GPU
# differently (it sees only its own GPU, as cuda:0), so the receiver puts its own index there.
_IPC_DEVICE_ARG = 6


@dataclass(frozen=True)
class BucketEntry:
    name: str
    dtype: str            # torch dtype name without the "torch." prefix
    shape: tuple[int, ...]
    offset: int           # bytes from the start of the bucket; a multiple of ALIGN
    nbytes: int


ALIGN = 256  # bytes; every entry starts aligned so a uint8 slice can be viewed as any dtype


def bucket_tensors(bucket: torch.Tensor, entries: list[BucketEntry]) -> list[tuple[str, torch.Tensor]]:
    """(name, tensor) views into one flat uint8 bucket."""
    out = []
    for e in entries:
        dtype = getattr(torch, e.dtype)
        out.append((e.name, bucket[e.offset:e.offset + e.nbytes].view(dtype).view(e.shape)))
    return out


def open_ipc_bucket(payload: bytes, device_index: int) -> tuple[torch.Tensor, list[BucketEntry]]:
    """The sender's bucket, mapped into this process's memory on `device_index` (no copy)."""
    rebuild, args, entries = pickle.loads(payload)
    args = list(args)
    args[_IPC_DEVICE_ARG] = device_index
    return rebuild(*args), entries


class WeightSyncExtension:
    """Methods vLLM adds to its GPU worker (`self` is the worker: model_runner, model_config, device)."""

    def _sync_model(self):
        # get_model() unwraps the CUDA-graph wrapper around the torch model
        return self.model_runner.get_model()

    def load_weight_bucket(self, payload: bytes) -> int:
        """Load one bucket of weights into the model; returns how many tensors it held."""
        bucket, entries = open_ipc_bucket(payload, self.device.index)
        weights = bucket_tensors(bucket, entries)
        self._sync_model().load_weights(weights=weights)
        if bucket.is_cuda:
            torch.cuda.synchronize(bucket.device)  # the sender may free the bucket once this returns
        del weights, bucket
        return len(entries)

    def finish_weight_sync(self) -> None:
        """vLLM's post-load step (quantised layouts, attention scales); a no-op for plain bf16 layers."""
        from vllm.model_executor.model_loader.utils import process_weights_after_loading

        process_weights_after_loading(self._sync_model(), self.model_config, self.device)

    def weight_checksum(self, names: list[str]) -> list[float]:
        """Sum of each named parameter (float64), for tests and the device run's sync check."""
        params = dict(self._sync_model().named_parameters())
        return [float(params[n].double().sum()) for n in names]
