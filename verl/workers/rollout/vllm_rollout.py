"""Rollout with vLLM's async engine (`vllm.v1.engine.async_llm.AsyncLLM`), for speed on GPUs.

Supported vLLM: SUPPORTED_VLLM (0.23 ran on the H200; 0.33's pure-Python classes are tested on
CPU by tests/test_rollout_vllm_real.py). vLLM is imported inside the class only, so this module
imports without it; the glue (sampling params, request outputs, weight buckets) is plain functions.

Shape of the backend:
- one AsyncLLM per rank, in its own engine process, on this rank's GPU (the spawned engine is given
  CUDA_VISIBLE_DEVICES of that one GPU, so under torchrun rank r's engine is not on cuda:0);
- `generate_one(prompt_ids, sampling)` is one request into vLLM's continuous batching (each episode
  submits its next turn when its pool call returns); `generate(prompts, sampling)` submits a batch
  of them. The engine's event loop runs in a private thread, so callers from any loop or thread work;
- weight sync: the actor's tensors are packed into flat GPU buckets; each bucket's CUDA IPC handle
  goes to the engine through `collective_rpc("load_weight_bucket", bytes)` (a method of the worker
  extension `vllm_worker_ext.WeightSyncExtension`, registered by import path), which calls the
  model's `load_weights` on views of it; then the post-load step and a prefix-cache reset;
- sleep/wake: `sleep()` releases weights (to CPU at level 1) and the KV cache during training;
  a sync wakes the weights first, loads, then wakes the KV cache.
Token ids come back exactly as sampled: a stop string cuts vLLM's text, never its token ids, so the
last token may carry characters past the stop tag (the episode code cuts the text it reads).
"""
from __future__ import annotations

import asyncio
import itertools
import os
import pickle
import threading
from contextlib import contextmanager
from typing import Any, Iterable, Iterator, Mapping

import torch

from .base import GenOutput, SamplingParams, clean_state_dict_items, refuse_constraint, validate_prompts
from .vllm_worker_ext import ALIGN, BucketEntry

SUPPORTED_VLLM = (">=0.23", "<0.34")  # keep equal to pyproject's [vllm] extra
WORKER_EXTENSION = "verl.workers.rollout.vllm_worker_ext.WeightSyncExtension"


def check_vllm_version(version: str) -> None:
    """Raise ImportError naming the installed version when it is outside SUPPORTED_VLLM."""
    from packaging.version import Version

    v = Version(version).release[:2]
    if not (0, 23) <= v < (0, 34):
        raise ImportError(f"vLLM {version} is installed; this backend supports vllm{','.join(SUPPORTED_VLLM)} "
                          f"(pip install 'router-r1[vllm]')")


def to_vllm_sampling_kwargs(sampling: SamplingParams) -> dict[str, Any]:
    """Keyword arguments for `vllm.SamplingParams` equivalent to ours (validated as vLLM would)."""
    sampling.validate()
    refuse_constraint(sampling, "vllm")
    greedy = sampling.is_greedy
    return dict(
        n=1,
        temperature=0.0 if greedy else float(sampling.temperature),
        top_p=1.0 if greedy else float(sampling.top_p),
        top_k=-1 if greedy or sampling.top_k <= 0 else int(sampling.top_k),
        max_tokens=int(sampling.max_new_tokens),
        stop=list(sampling.stop) or None,
        include_stop_str_in_output=True,  # the policy wrote the stop tag: it is part of the action
        seed=sampling.seed,
        logprobs=0 if sampling.return_logprobs else None,  # 0: only the sampled token's logprob
        detokenize=bool(sampling.stop),  # stop strings are matched on detokenized text; we read token ids only
    )


def per_request_sampling_kwargs(sampling: SamplingParams, n: int, first: int = 0) -> list[dict[str, Any]]:
    """One kwargs dict per request. vLLM seeds each request separately, so a shared seed would give
    identical samples for identical prompts (a GRPO group would collapse): request i gets seed + first + i."""
    base = to_vllm_sampling_kwargs(sampling)
    if base["seed"] is None or base["temperature"] == 0.0:
        return [base] * n
    return [{**base, "seed": base["seed"] + first + i} for i in range(n)]


def _token_logprob(entry: Any, token_id: int) -> float:
    # entry: {token_id: Logprob(logprob=...)} per position (a float is accepted too)
    try:
        value = entry[token_id]
    except (KeyError, IndexError, TypeError):
        raise ValueError(f"vLLM logprobs hold no entry for sampled token {token_id}") from None
    return float(getattr(value, "logprob", value))


def from_vllm_output(request_output: Any) -> GenOutput:
    """Our GenOutput from a vLLM RequestOutput. Finish reasons: stop (a stop string, or EOS -> "eos"),
    length, repetition (vLLM stopped a looping sequence: an unfinished turn, like "length"); abort and
    error raise, naming the request (vLLM returns no usable tokens for them)."""
    rid = getattr(request_output, "request_id", "?")
    if not getattr(request_output, "outputs", None):
        raise ValueError(f"vLLM request {rid} has no outputs")
    out = request_output.outputs[0]
    token_ids = [int(t) for t in out.token_ids]
    reason, stop_reason = out.finish_reason, getattr(out, "stop_reason", None)
    if reason in ("length", "repetition"):
        finish = "length"
    elif reason == "stop":
        # stop_reason: the matched stop string, or None (EOS), or an id from stop_token_ids
        # (we pass none of those; vLLM adds a model's extra EOS ids there)
        finish = "stop" if isinstance(stop_reason, str) else "eos"
    elif reason == "error":
        raise RuntimeError(f"vLLM request {rid} failed inside the engine (finish_reason='error', "
                           f"{len(token_ids)} tokens); see the engine's log")
    else:
        raise RuntimeError(f"vLLM request {rid} ended with finish_reason={reason!r} (aborted or unfinished)")
    logprobs = None
    if getattr(out, "logprobs", None) is not None:
        steps = out.logprobs
        if len(steps) != len(token_ids):
            raise ValueError(f"vLLM returned {len(steps)} logprob entries for {len(token_ids)} tokens")
        logprobs = [_token_logprob(steps[i], t) for i, t in enumerate(token_ids)]
    return GenOutput(token_ids=token_ids, finish_reason=finish, logprobs=logprobs)


def state_dict_items_for_vllm(state_dict: Mapping[str, torch.Tensor]) -> Iterator[tuple[str, torch.Tensor]]:
    """(name, tensor) pairs for vLLM's `load_weights`: wrapper prefixes stripped, DTensors made whole."""
    return clean_state_dict_items(state_dict)


def _aligned(n: int) -> int:
    return (n + ALIGN - 1) // ALIGN * ALIGN


def plan_buckets(items: Iterable[tuple[str, torch.Tensor]], bucket_bytes: int
                 ) -> Iterator[list[tuple[str, torch.Tensor]]]:
    """Group (name, tensor) pairs into buckets of at most bucket_bytes (a bigger tensor is a bucket alone)."""
    bucket, size = [], 0
    for name, t in items:
        n = _aligned(t.numel() * t.element_size())
        if bucket and size + n > bucket_bytes:
            yield bucket
            bucket, size = [], 0
        bucket.append((name, t))
        size += n
    if bucket:
        yield bucket


def pack_bucket(items: list[tuple[str, torch.Tensor]], device: torch.device
                ) -> tuple[torch.Tensor, list[BucketEntry]]:
    """Copy tensors into one flat uint8 buffer on `device`; entries say where each one lies."""
    entries, offset = [], 0
    for name, t in items:
        nbytes = t.numel() * t.element_size()
        entries.append(BucketEntry(name, str(t.dtype).removeprefix("torch."), tuple(t.shape), offset, nbytes))
        offset += _aligned(nbytes)
    buf = torch.empty(offset, dtype=torch.uint8, device=device)  # (total bytes,)
    for e, (_, t) in zip(entries, items):
        buf[e.offset:e.offset + e.nbytes].copy_(t.detach().contiguous().reshape(-1).view(torch.uint8))
    return buf, entries


def ipc_payload(buf: torch.Tensor, entries: list[BucketEntry]) -> bytes:
    """The bytes `WeightSyncExtension.load_weight_bucket` takes: a CUDA IPC handle of buf + entries."""
    from torch.multiprocessing.reductions import reduce_tensor

    rebuild, args = reduce_tensor(buf)
    return pickle.dumps((rebuild, args, entries))


def physical_gpus(device: torch.device, tensor_parallel_size: int) -> str:
    """CUDA_VISIBLE_DEVICES for an engine on `device` (and the next tp-1 GPUs), in physical numbering."""
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    ids = [s.strip() for s in visible.split(",")] if visible else [str(i) for i in range(torch.cuda.device_count())]
    first = device.index or 0
    if first + tensor_parallel_size > len(ids):
        raise ValueError(f"rollout on {device} with tensor_parallel_size={tensor_parallel_size} needs GPUs "
                         f"{first}..{first + tensor_parallel_size - 1}, only {len(ids)} visible")
    return ",".join(ids[first:first + tensor_parallel_size])


@contextmanager
def _env(**values: str) -> Iterator[None]:
    old = {k: os.environ.get(k) for k in values}
    os.environ.update(values)
    try:
        yield
    finally:
        for k, v in old.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


class VLLMRollout:
    """RolloutBackend + AsyncRolloutBackend over vLLM's AsyncLLM. Weights start from `model_path`
    (an HF directory) and are replaced by `update_weights` from the actor."""

    def __init__(self, model_path: str, device: str | torch.device = "cuda:0", tensor_parallel_size: int = 1,
                 gpu_memory_utilization: float = 0.5, dtype: str = "bfloat16", seed: int = 0,
                 enable_sleep_mode: bool = True, sleep_level: int = 1, max_model_len: int | None = None,
                 enforce_eager: bool = False, bucket_mb: int = 512, **engine_kwargs: Any):
        try:
            import vllm
        except ImportError as e:
            raise ImportError("VLLMRollout needs the `vllm` package (GPU machines only; pip install "
                              "'router-r1[vllm]'); use rollout.name=hf or hf_static without it") from e
        check_vllm_version(vllm.__version__)
        if sleep_level not in (1, 2):
            raise ValueError(f"sleep_level must be 1 (weights to CPU) or 2 (weights dropped), got {sleep_level}")
        from vllm.engine.arg_utils import AsyncEngineArgs
        from vllm.sampling_params import RequestOutputKind
        from vllm.v1.engine.async_llm import AsyncLLM

        self._vllm, self._final_only = vllm, RequestOutputKind.FINAL_ONLY
        self.device = torch.device(device)
        self.sleep_enabled, self.sleep_level = enable_sleep_mode, sleep_level
        self.bucket_bytes = bucket_mb << 20
        self._asleep: set[str] = set()  # which of {"weights", "kv_cache"} are released now
        self._ids = itertools.count()   # request ids, and the seed offset of generate_one's requests
        args = AsyncEngineArgs(model=model_path, tensor_parallel_size=tensor_parallel_size,
                               gpu_memory_utilization=gpu_memory_utilization, enable_sleep_mode=enable_sleep_mode,
                               dtype=dtype, seed=seed, enforce_eager=enforce_eager, max_model_len=max_model_len,
                               worker_extension_cls=WORKER_EXTENSION,
                               # log-probs after temperature (and top-k/top-p, off by default), as the actor
                               # recomputes them; vLLM's default reports the raw T=1 softmax
                               logprobs_mode="processed_logprobs", **engine_kwargs)
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name="vllm-engine-loop", daemon=True)
        self._thread.start()

        async def build():  # inside the private loop: AsyncLLM binds its output handler to it
            return AsyncLLM.from_engine_args(args)

        gpus = physical_gpus(self.device, tensor_parallel_size) if self.device.type == "cuda" else None
        with _env(CUDA_VISIBLE_DEVICES=gpus) if gpus else _env():
            self.engine = self._run(build())

    # ----------------------------------------------------------------- plumbing
    def _run(self, coro):
        """Run a coroutine on the engine's loop from a plain thread and wait for it."""
        return asyncio.run_coroutine_threadsafe(coro, self._loop).result()

    async def _request(self, prompt_ids: list[int], kwargs: dict[str, Any]) -> GenOutput:
        params = self._vllm.SamplingParams(**kwargs, output_kind=self._final_only)
        final = None
        async for out in self.engine.generate({"prompt_token_ids": list(prompt_ids)}, params,
                                              request_id=f"r{next(self._ids)}"):
            final = out
        return from_vllm_output(final)

    def _check_awake(self) -> None:
        if self._asleep:
            raise RuntimeError(f"VLLMRollout: generate called while {sorted(self._asleep)} sleep: "
                               "call wake() (or update_weights, which wakes) first")

    # ----------------------------------------------------------------- generation
    async def generate_one(self, prompt_ids: list[int], sampling: SamplingParams) -> GenOutput:
        """One request into vLLM's continuous batching; awaitable from any event loop."""
        self._check_awake()
        validate_prompts([prompt_ids])
        kwargs = per_request_sampling_kwargs(sampling, 1, first=next(self._ids))[0]
        return await asyncio.wrap_future(asyncio.run_coroutine_threadsafe(self._request(prompt_ids, kwargs),
                                                                          self._loop))

    def generate(self, prompts: list[list[int]], sampling: SamplingParams) -> list[GenOutput]:
        """One continuation per prompt, in input order (all submitted at once)."""
        self._check_awake()
        validate_prompts(prompts)
        kwargs = per_request_sampling_kwargs(sampling, len(prompts))

        async def all_of():
            return await asyncio.gather(*(self._request(p, k) for p, k in zip(prompts, kwargs)))

        return list(self._run(all_of()))

    # ----------------------------------------------------------------- weights, sleep
    def update_weights(self, state_dict: Mapping[str, torch.Tensor]) -> None:
        """Stream the actor's weights into the engine in GPU buckets; then post-load step, prefix-cache
        reset, and the KV cache woken: the engine is ready to generate."""
        if "weights" in self._asleep:
            self._run(self.engine.wake_up(tags=["weights"]))
            self._asleep.discard("weights")
        device = self.device  # the actor's GPU (a CPU device only in tests, with a stand-in engine)
        for items in plan_buckets(state_dict_items_for_vllm(state_dict), self.bucket_bytes):
            buf, entries = pack_bucket(items, device)
            if buf.is_cuda:
                torch.cuda.synchronize(device)  # the engine reads buf through IPC: the copies must be done
            loaded = self._run(self.engine.collective_rpc("load_weight_bucket", args=(ipc_payload(buf, entries),)))
            if any(n != len(entries) for n in loaded):
                raise RuntimeError(f"vLLM workers loaded {loaded} tensors of a bucket of {len(entries)}")
            del buf
        self._run(self.engine.collective_rpc("finish_weight_sync"))
        self._run(self.engine.reset_prefix_cache())  # cached prefixes were computed with the old weights
        self.wake()

    def sleep(self) -> None:
        """Release the KV cache and the weights (level 1: to CPU memory; level 2: dropped, so the next
        `update_weights` must send every parameter) while the actor and critic train."""
        if not self.sleep_enabled or self._asleep:
            return
        self._run(self.engine.sleep(level=self.sleep_level))
        self._asleep = {"weights", "kv_cache"}

    def wake(self) -> None:
        """Weights first, then the KV cache (each only if asleep)."""
        for tag in ("weights", "kv_cache"):
            if tag in self._asleep:
                if tag == "weights" and self.sleep_level == 2:
                    raise RuntimeError("VLLMRollout.wake: weights were dropped (sleep_level=2); "
                                       "call update_weights to bring them back")
                self._run(self.engine.wake_up(tags=[tag]))
                self._asleep.discard(tag)

    @property
    def asleep(self) -> bool:
        return bool(self._asleep)

    def weight_checksums(self, names: list[str]) -> list[list[float]]:
        """Per worker, the float64 sum of each named engine parameter (sync checks)."""
        return self._run(self.engine.collective_rpc("weight_checksum", args=(list(names),)))

    def shutdown(self) -> None:
        self.engine.shutdown()
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(timeout=5)
