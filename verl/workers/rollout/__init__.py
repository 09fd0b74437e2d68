"""Rollout backends: `build_rollout(cfg)` picks transformers ("hf"), transformers weights with a
static KV cache and CUDA-graph decode ("hf_static", Llama, Qwen2 and Gemma 3 shapes; also continuous batching
over cache slots for the async `generate_one`) or vLLM ("vllm")."""
from __future__ import annotations

from typing import Any

import torch

from .base import GenOutput, RolloutBackend, SamplingParams

__all__ = ["GenOutput", "RolloutBackend", "SamplingParams", "HFRollout", "StaticRollout", "SlotRollout", "VLLMRollout",
           "build_rollout"]

_DTYPES = {"float32": torch.float32, "fp32": torch.float32, "bfloat16": torch.bfloat16,
           "bf16": torch.bfloat16, "float16": torch.float16, "fp16": torch.float16}


def __getattr__(name: str):
    # backends import transformers / vllm: load them only when asked for
    if name == "HFRollout":
        from .hf_rollout import HFRollout
        return HFRollout
    if name == "SlotRollout":
        from .slot_rollout import SlotRollout
        return SlotRollout
    if name == "StaticRollout":
        from .static_rollout import StaticRollout
        return StaticRollout
    if name == "VLLMRollout":
        from .vllm_rollout import VLLMRollout
        return VLLMRollout
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def _get(cfg: Any, key: str, default: Any = None) -> Any:
    """Read a key from a dict, an omegaconf DictConfig or an attribute object."""
    if isinstance(cfg, dict) or hasattr(cfg, "get"):
        value = cfg.get(key, default)
    else:
        value = getattr(cfg, key, default)
    return default if value is None else value


def _torch_dtype(value: Any) -> torch.dtype | None:
    if value is None or isinstance(value, torch.dtype):
        return value
    if value not in _DTYPES:
        raise ValueError(f"rollout.dtype must be one of {sorted(_DTYPES)} or null, got {value!r}")
    return _DTYPES[value]


def build_rollout(cfg: Any, model: Any = None, tokenizer: Any = None) -> RolloutBackend:
    """Build the backend named by cfg.name ("hf" needs model+tokenizer or cfg.model_path; "vllm" needs cfg.model_path)."""
    name = _get(cfg, "name")
    if name in ("hf", "hf_static"):
        if model is None or tokenizer is None:
            path = _get(cfg, "model_path")
            if path is None:
                raise ValueError(f"rollout.name={name!r} needs a model and tokenizer, or rollout.model_path")
            from transformers import AutoModelForCausalLM, AutoTokenizer
            model = model if model is not None else AutoModelForCausalLM.from_pretrained(path)
            tokenizer = tokenizer if tokenizer is not None else AutoTokenizer.from_pretrained(path)
        common = dict(device=_get(cfg, "device", "cpu"), dtype=_torch_dtype(_get(cfg, "dtype")),
                      max_batch_size=int(_get(cfg, "max_batch_size", 64)))
        if name == "hf":
            from .hf_rollout import HFRollout
            return HFRollout(model, tokenizer, **common)
        from .slot_rollout import SlotRollout  # StaticRollout's batch path plus continuous generate_one
        return SlotRollout(model, tokenizer, max_model_len=int(_get(cfg, "max_model_len", 4096)),
                             cuda_graph=bool(_get(cfg, "cuda_graph", True)),
                             compile=bool(_get(cfg, "compile", False)),
                             compile_mode=str(_get(cfg, "compile_mode", "default")),
                             decode_linear=str(_get(cfg, "decode_linear", "torch")),
                             decode_attention=str(_get(cfg, "decode_attention", "auto")), **common)
    if name == "vllm":
        from .vllm_rollout import VLLMRollout
        path = _get(cfg, "model_path")
        if path is None:
            raise ValueError("rollout.name='vllm' needs rollout.model_path (an HF model directory)")
        return VLLMRollout(
            model_path=path,
            device=_get(cfg, "device", "cuda:0"),
            tensor_parallel_size=int(_get(cfg, "tensor_parallel_size", 1)),
            gpu_memory_utilization=float(_get(cfg, "gpu_memory_utilization", 0.5)),
            dtype=str(_get(cfg, "dtype", "bfloat16")),
            seed=int(_get(cfg, "seed", 0)),
            enable_sleep_mode=bool(_get(cfg, "enable_sleep_mode", True)),
            sleep_level=int(_get(cfg, "sleep_level", 1)),
            max_model_len=_get(cfg, "max_model_len"),
            enforce_eager=bool(_get(cfg, "enforce_eager", False)),
        )
    raise ValueError(f"rollout.name must be 'hf', 'hf_static' or 'vllm', got {name!r}")
