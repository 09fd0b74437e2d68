"""Rollout with vLLM's offline engine (`vllm.LLM`), for speed on GPUs.

vLLM is imported inside the class only, so this module imports without it. The glue
between our types and vLLM's (sampling params, request outputs, weight names) is kept in
plain functions that are tested without vLLM.

Weight sync: vLLM models take weights through `model.load_weights(iterable of (name,
tensor))`, which also handles the fused qkv / gate_up layouts and tensor-parallel sharding.
We reach the model in-process when the engine runs in this process (V1 with
VLLM_ENABLE_V1_MULTIPROCESSING=0, or the old V0 engine): no copy. Otherwise the weights go
to every worker through `LLM.collective_rpc` as CPU tensors, which needs
VLLM_ALLOW_INSECURE_SERIALIZATION=1 so the function we send can be pickled.
"""
from __future__ import annotations

from typing import Any, Iterator, Mapping

import torch

from .base import GenOutput, SamplingParams, clean_state_dict_items, validate_prompts


def to_vllm_sampling_kwargs(sampling: SamplingParams) -> dict[str, Any]:
    """Keyword arguments for `vllm.SamplingParams` equivalent to ours."""
    sampling.validate()
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
        detokenize=True,  # stop strings are matched on detokenized text
    )


def per_request_sampling_kwargs(sampling: SamplingParams, n: int) -> list[dict[str, Any]]:
    """One kwargs dict per prompt. vLLM seeds each request separately, so a shared seed would give
    identical samples for identical prompts (a GRPO group would collapse): request i gets seed + i."""
    base = to_vllm_sampling_kwargs(sampling)
    if base["seed"] is None or base["temperature"] == 0.0:
        return [base] * n
    return [{**base, "seed": base["seed"] + i} for i in range(n)]


def _token_logprob(entry: Any, token_id: int) -> float:
    # entry: {token_id: Logprob(logprob=...)} per position (a float is accepted too)
    try:
        value = entry[token_id]
    except (KeyError, IndexError, TypeError):
        raise ValueError(f"vLLM logprobs hold no entry for sampled token {token_id}") from None
    return float(getattr(value, "logprob", value))


def from_vllm_output(request_output: Any) -> GenOutput:
    """Our GenOutput from a vLLM RequestOutput (anything with outputs[0].token_ids/finish_reason/...)."""
    if not getattr(request_output, "outputs", None):
        raise ValueError(f"vLLM request {getattr(request_output, 'request_id', '?')} has no outputs")
    out = request_output.outputs[0]
    token_ids = [int(t) for t in out.token_ids]
    reason, stop_reason = out.finish_reason, getattr(out, "stop_reason", None)
    if reason == "length":
        finish = "length"
    elif reason == "stop":
        # stop_reason: the matched stop string, or None (EOS), or an id from stop_token_ids
        # (we pass none of those; vLLM adds a model's extra EOS ids there)
        finish = "stop" if isinstance(stop_reason, str) else "eos"
    else:
        raise RuntimeError(f"vLLM request {getattr(request_output, 'request_id', '?')} "
                           f"ended with finish_reason={reason!r} (aborted or unfinished)")
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


def _load_weights_on_worker(worker, weights: list[tuple[str, torch.Tensor]]) -> int:
    """Runs inside each vLLM worker (through collective_rpc); returns how many tensors it got."""
    worker.model_runner.model.load_weights(weights=weights)
    return len(weights)


# Where an in-process vLLM engine keeps its model (V1 in-process first, then V0).
_INPROCESS_MODEL_PATHS = (
    "llm_engine.model_executor.driver_worker.worker.model_runner.model",
    "llm_engine.engine_core.engine_core.model_executor.driver_worker.worker.model_runner.model",
    "llm_engine.model_executor.driver_worker.model_runner.model",
)


def find_inprocess_model(llm: Any) -> Any | None:
    """The engine's torch model if it lives in this process, else None."""
    for path in _INPROCESS_MODEL_PATHS:
        obj = llm
        try:
            for attr in path.split("."):
                obj = getattr(obj, attr)
        except AttributeError:
            continue
        if hasattr(obj, "load_weights"):
            return obj
    return None


class VLLMRollout:
    """RolloutBackend over `vllm.LLM`. Weights start from `model_path` (an HF directory)."""

    def __init__(self, model_path: str, tensor_parallel_size: int = 1, gpu_memory_utilization: float = 0.5,
                 dtype: str = "bfloat16", seed: int = 0, enable_sleep_mode: bool = True,
                 max_model_len: int | None = None, enforce_eager: bool = False, **llm_kwargs: Any):
        try:
            import vllm
        except ImportError as e:
            raise ImportError("VLLMRollout needs the `vllm` package (GPU machines only); "
                              "use the 'hf' rollout backend without it") from e
        self._vllm = vllm
        self.tensor_parallel_size = tensor_parallel_size
        self.sleep_enabled = enable_sleep_mode
        kwargs = dict(model=model_path, tensor_parallel_size=tensor_parallel_size,
                      gpu_memory_utilization=gpu_memory_utilization, enable_sleep_mode=enable_sleep_mode,
                      dtype=dtype, seed=seed, enforce_eager=enforce_eager, **llm_kwargs)
        if max_model_len is not None:
            kwargs["max_model_len"] = max_model_len
        self.llm = vllm.LLM(**kwargs)
        self._asleep_tags: set[str] = set()  # which of {"weights", "kv_cache"} are released now

    def generate(self, prompts: list[list[int]], sampling: SamplingParams) -> list[GenOutput]:
        """Generate one continuation per prompt; vLLM returns outputs in input order."""
        if self._asleep_tags:
            raise RuntimeError("VLLMRollout.generate called while asleep: call wake() first")
        validate_prompts(prompts)
        params = [self._vllm.SamplingParams(**kw) for kw in per_request_sampling_kwargs(sampling, len(prompts))]
        requests = [{"prompt_token_ids": list(p)} for p in prompts]
        outputs = self.llm.generate(requests, params, use_tqdm=False)
        return [from_vllm_output(o) for o in outputs]

    def update_weights(self, state_dict: dict[str, torch.Tensor]) -> None:
        """Load new weights into the engine; works while the KV cache sleeps (weights are woken first)."""
        if "weights" in self._asleep_tags:
            self.llm.wake_up(tags=["weights"])
            self._asleep_tags.discard("weights")
        model = find_inprocess_model(self.llm) if self.tensor_parallel_size == 1 else None
        if model is not None:
            model.load_weights(weights=state_dict_items_for_vllm(state_dict))
        elif hasattr(self.llm, "collective_rpc"):
            weights = [(n, t.cpu()) for n, t in state_dict_items_for_vllm(state_dict)]
            try:
                self.llm.collective_rpc(_load_weights_on_worker, args=(weights,))
            except Exception as e:
                raise RuntimeError(
                    "VLLMRollout.update_weights: sending weights through collective_rpc failed. With "
                    "vLLM's multiprocess engine set VLLM_ALLOW_INSECURE_SERIALIZATION=1 (the loader "
                    "function is pickled), or VLLM_ENABLE_V1_MULTIPROCESSING=0 for in-process loading "
                    "with tensor_parallel_size=1") from e
        else:
            raise RuntimeError("VLLMRollout.update_weights: this vLLM version exposes neither an in-process "
                               "model nor LLM.collective_rpc; cannot load weights")
        # cached prefixes were computed with the old weights
        if hasattr(self.llm, "reset_prefix_cache"):
            self.llm.reset_prefix_cache()

    def sleep(self) -> None:
        """Level 1: weights go to CPU memory, the KV cache is dropped."""
        if not self.sleep_enabled or self._asleep_tags:
            return
        self.llm.sleep(level=1)
        self._asleep_tags = {"weights", "kv_cache"}

    def wake(self) -> None:
        if not self._asleep_tags:
            return
        if self._asleep_tags == {"weights", "kv_cache"}:
            self.llm.wake_up()
        else:
            self.llm.wake_up(tags=sorted(self._asleep_tags))
        self._asleep_tags = set()
