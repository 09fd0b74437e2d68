"""Build the policy (causal LM) or the critic (one value per token) from a model spec.

A spec is one of:
  - a dict config `{"model_type": "llama", "hidden_size": 64, ...}`: random init, seeded;
  - a path ending in ".gguf": transformers dequantizes it (needs the `gguf` package);
  - anything else: an HF directory or hub id for `from_pretrained`.
The critic is `AutoModelForTokenClassification(num_labels=1)` when the model type has
that class; otherwise (e.g. opt, gemma3_text) the backbone gets a linear value head.
"""
from __future__ import annotations

import os

import torch
from torch import nn
from transformers import AutoConfig, AutoModel, AutoModelForCausalLM, AutoModelForTokenClassification
from transformers.modeling_outputs import TokenClassifierOutput
from transformers.models.auto.modeling_auto import MODEL_FOR_TOKEN_CLASSIFICATION_MAPPING_NAMES

DTYPES = {"float32": torch.float32, "fp32": torch.float32, "bfloat16": torch.bfloat16, "bf16": torch.bfloat16,
          "float16": torch.float16, "fp16": torch.float16}


def to_dtype(dtype: str | torch.dtype) -> torch.dtype:
    if isinstance(dtype, torch.dtype):
        return dtype
    if dtype not in DTYPES:
        raise ValueError(f"dtype {dtype!r} is not one of {sorted(DTYPES)}")
    return DTYPES[dtype]


class ValueHeadModel(nn.Module):
    """Backbone + linear value head, for model types without a *ForTokenClassification class."""

    def __init__(self, backbone: nn.Module):
        super().__init__()
        self.model = backbone
        self.config = backbone.config
        self.score = nn.Linear(backbone.config.get_text_config().hidden_size, 1)
        self._no_split_modules = getattr(backbone, "_no_split_modules", None)

    def forward(self, input_ids, attention_mask=None, position_ids=None, **kwargs) -> TokenClassifierOutput:
        hidden = self.model(input_ids=input_ids, attention_mask=attention_mask, position_ids=position_ids,
                            use_cache=False, **kwargs).last_hidden_state  # (batch, seq, hidden)
        return TokenClassifierOutput(logits=self.score(hidden))  # (batch, seq, 1)


def _config_and_source(spec) -> tuple:
    """(config, pretrained source kwargs or None for a random init)."""
    if isinstance(spec, dict):
        if "model_type" not in spec:
            raise ValueError(f"model spec dict needs a 'model_type' field; got keys {sorted(spec)}")
        fields = {k: v for k, v in spec.items() if k != "model_type"}
        return AutoConfig.for_model(spec["model_type"], **fields), None
    if not isinstance(spec, (str, os.PathLike)) or not str(spec):
        raise ValueError(f"model spec must be a dict config, a directory, a .gguf file or a hub id; got {spec!r}")
    spec = str(spec)
    if spec.endswith(".gguf"):
        if not os.path.isfile(spec):
            raise FileNotFoundError(f"GGUF model file not found: {spec}")
        src = {"pretrained_model_name_or_path": os.path.dirname(os.path.abspath(spec)),
               "gguf_file": os.path.basename(spec)}
    else:
        src = {"pretrained_model_name_or_path": spec}
    return AutoConfig.from_pretrained(**src), src


def load_model(spec, dtype: str | torch.dtype = torch.float32, role: str = "actor", seed: int = 0,
               gradient_checkpointing: bool = False) -> nn.Module:
    """Load a causal LM (role actor/ref/rollout) or a one-output critic (role critic) on CPU."""
    dtype = to_dtype(dtype)
    config, src = _config_and_source(spec)
    critic = role == "critic"
    if critic:
        config.use_cache = False  # a critic never decodes; its forward must not build a KV cache
        config.num_labels = 1
        config.classifier_dropout = 0.0  # dropout on the value head only adds noise to the targets
    if critic and config.model_type in MODEL_FOR_TOKEN_CLASSIFICATION_MAPPING_NAMES:
        auto = AutoModelForTokenClassification
    else:
        auto = AutoModel if critic else AutoModelForCausalLM
    with torch.random.fork_rng(devices=[]):  # seeded init that leaves the caller's RNG alone
        torch.manual_seed(seed)
        if src is None:
            model = auto.from_config(config, dtype=dtype)
        else:
            model = auto.from_pretrained(config=config, dtype=dtype, **src)
        if critic and auto is AutoModel:
            model = ValueHeadModel(model).to(dtype)
    if getattr(model, "hf_quantizer", None) is not None:  # GGUF weights arrive dequantized
        model.hf_quantizer = None  # else save_pretrained refuses to write them back
        if hasattr(model.config, "quantization_config"):
            del model.config.quantization_config
    if gradient_checkpointing:
        _enable_checkpointing(model.model if isinstance(model, ValueHeadModel) else model)
    return model


def _enable_checkpointing(model: nn.Module) -> None:
    # Non-reentrant checkpointing works with FSDP2 and with inputs that need no grad.
    kwargs = {"use_reentrant": False}
    if hasattr(model, "activation_checkpointing_enable"):  # transformers >= 5
        model.activation_checkpointing_enable(activation_checkpointing_kwargs=kwargs)
    else:
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs=kwargs)


def spec_for_tokenizer(spec, tokenizer):
    """A config dict gets the tokenizer's vocabulary size and special ids where it has none."""
    if not isinstance(spec, dict):
        return spec
    spec = dict(spec)
    if spec.get("vocab_size") is None:
        spec["vocab_size"] = len(tokenizer)
    elif spec["vocab_size"] < len(tokenizer):
        raise ValueError(f"model spec: vocab_size {spec['vocab_size']} < the tokenizer's {len(tokenizer)} tokens")
    for key in ("pad_token_id", "bos_token_id", "eos_token_id"):
        if spec.get(key) is None:
            spec[key] = getattr(tokenizer, key)
    return spec
