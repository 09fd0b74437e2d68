"""Build the policy (causal LM) or the critic (one value per token) from a model spec.

A spec is one of:
  - a dict config `{"model_type": "llama", "hidden_size": 64, ...}`: random init, seeded;
  - a path ending in ".gguf": transformers dequantizes it (needs the `gguf` package);
  - anything else: an HF directory or hub id for `from_pretrained`.
The critic is `AutoModelForTokenClassification(num_labels=1)` when the model type has
that class; otherwise (e.g. opt, gemma3_text) the backbone gets a linear value head.

`attn_implementation=PACKED_ATTENTION` selects an attention that is sdpa for ordinary
padded batches and, for a packed row (see micro_batch.pack_rows, forward kwargs
`cu_seq_lens_q` / `max_length_q`), causal attention inside each sequence only: flash
varlen (torch.nn.attention.varlen) on CUDA, one sdpa call per sequence elsewhere.
"""
from __future__ import annotations

import inspect
import json
import logging
import os
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn
from transformers import AttentionInterface, AutoConfig, AutoModel, AutoModelForCausalLM, AutoModelForTokenClassification
from transformers.integrations.sdpa_attention import sdpa_attention_forward
from transformers.masking_utils import AttentionMaskInterface, sdpa_mask
from transformers.modeling_outputs import TokenClassifierOutput
from transformers.models.auto.modeling_auto import MODEL_FOR_TOKEN_CLASSIFICATION_MAPPING_NAMES

PACKED_ATTENTION = "verl_packed"

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


def _varlen_flash(q, k, v, cu, max_len: int, scaling: float | None, window: int | None = None):
    """Causal flash attention over packed sequences; q (total, heads, dim), k/v (total, kv_heads, dim).
    `window`: a query sees only the last `window` positions, itself included (sliding-window layers)."""
    from torch.nn.attention.varlen import varlen_attn

    params = inspect.signature(varlen_attn).parameters  # the signature changed between torch 2.10 and 2.12
    if "window_size" in params:
        kwargs = {"window_size": (-1 if window is None else window - 1, 0)}
    elif window is None:
        kwargs = {"is_causal": True}
    else:
        raise RuntimeError("this torch's varlen_attn has no window_size: sliding-window layers need torch >= 2.11 "
                           "or actor.use_remove_padding=false")
    if "scale" in params:
        kwargs["scale"] = scaling
    elif scaling is not None and abs(scaling - q.shape[-1] ** -0.5) > 1e-9:
        raise RuntimeError(f"this torch's varlen_attn has no scale argument; the model needs scale {scaling}")
    if k.shape[1] != q.shape[1]:
        if "enable_gqa" in params:
            kwargs["enable_gqa"] = True
        else:
            k = k.repeat_interleave(q.shape[1] // k.shape[1], dim=1)
            v = v.repeat_interleave(q.shape[1] // v.shape[1], dim=1)
    return varlen_attn(q, k, v, cu, cu, max_len, max_len, **kwargs)


def packed_attention_forward(module, query, key, value, attention_mask, dropout: float = 0.0,
                             scaling: float | None = None, cu_seq_lens_q=None, max_length_q=None,
                             sliding_window: int | None = None, **kwargs):
    """sdpa for padded batches; for one packed row, causal attention that stays inside each sequence
    (and inside the last `sliding_window` positions on a sliding-window layer, as transformers' masks).

    query (1, heads, total, dim), key/value (1, kv_heads, total, dim) -> (1, total, heads, dim).
    """
    if cu_seq_lens_q is None:  # the mask that transformers built already carries any sliding window
        return sdpa_attention_forward(module, query, key, value, attention_mask, dropout=dropout, scaling=scaling,
                                      **kwargs)
    if query.shape[0] != 1:
        raise ValueError(f"packed attention expects one packed row, got batch {query.shape[0]}")
    if kwargs.get("softcap"):
        raise ValueError("packed attention has no attention-logit soft-capping (Gemma 2); "
                         "set actor.use_remove_padding=false")
    if dropout:
        raise ValueError("packed attention does not implement attention dropout")
    if query.is_cuda:
        # Rotary embeddings in float32 can promote q/k out of autocast's dtype; sdpa would cast back.
        dtype = torch.get_autocast_dtype("cuda") if torch.is_autocast_enabled("cuda") else query.dtype
        if dtype in (torch.bfloat16, torch.float16):
            q, k, v = (x[0].transpose(0, 1).to(dtype) for x in (query, key, value))  # (total, heads, dim)
            out = _varlen_flash(q, k, v, cu_seq_lens_q, int(max_length_q), scaling, sliding_window)
            return out[None], None
    # Reference path (CPU, float32): one causal sdpa call per sequence.
    groups = query.shape[1] // key.shape[1]
    bounds = cu_seq_lens_q.tolist()
    parts = []
    for start, end in zip(bounds[:-1], bounds[1:]):
        qs = query[:, :, start:end]
        ks = key[:, :, start:end].repeat_interleave(groups, dim=1)
        vs = value[:, :, start:end].repeat_interleave(groups, dim=1)
        if sliding_window is None:
            parts.append(F.scaled_dot_product_attention(qs, ks, vs, is_causal=True, scale=scaling))
            continue
        pos = torch.arange(end - start, device=query.device)
        back = pos[:, None] - pos[None, :]  # (len, len): how far back each key is from each query
        allowed = (back >= 0) & (back < sliding_window)
        parts.append(F.scaled_dot_product_attention(qs, ks, vs, attn_mask=allowed, scale=scaling))
    return torch.cat(parts, dim=2).transpose(1, 2).contiguous(), None


AttentionInterface.register(PACKED_ATTENTION, packed_attention_forward)
AttentionMaskInterface.register(PACKED_ATTENTION, sdpa_mask)  # padded batches get sdpa's masks


def attention_layer_types(config) -> set[str]:
    """The kinds of attention layer a model has ("full_attention", "sliding_attention", ...); configs that do not
    say (Llama, OPT) have full attention everywhere."""
    return set(getattr(config.get_text_config(), "layer_types", None) or ["full_attention"])


def cache_keyword(model) -> str:
    """The forward's KV-cache keyword: transformers 5.2x renamed past_key_values to cache. Read on the backbone
    (`model.model` of a causal LM, a token classifier or ValueHeadModel, whose own forward takes **kwargs)."""
    backbone = getattr(model, "model", model)
    return "cache" if "cache" in inspect.signature(backbone.forward).parameters else "past_key_values"


def broadcast_cache(cache, rows: int, model_type: str) -> None:
    """Expand a DynamicCache filled by one row (a shared prompt prefix) to `rows` rows, in place: no copy, and
    autograd sums the rows' gradients back into the one row. Full-attention layers only (a sliding window would
    drop prefix columns the rows attend to)."""
    from transformers.cache_utils import DynamicLayer

    for layer in cache.layers:
        if type(layer) is not DynamicLayer:
            raise ValueError(f"a shared prompt prefix needs full-attention layers; {model_type}'s cache has "
                             f"{type(layer).__name__}")
        layer.keys = layer.keys.expand(rows, -1, -1, -1)
        layer.values = layer.values.expand(rows, -1, -1, -1)


def parse_model_spec(spec):
    """A config mapping from inline JSON or a *.json file; any other spec (a mapping, an HF directory or
    hub id, a GGUF file) comes back as it is. A JSON spec that cannot be read is an error naming it."""
    text = str(spec) if isinstance(spec, (str, os.PathLike)) else ""
    inline = text.lstrip().startswith("{")
    if not inline and not text.endswith(".json"):
        return spec
    try:
        parsed = json.loads(text if inline else Path(text).read_text())
    except (OSError, json.JSONDecodeError) as e:
        raise ValueError(f"model spec {text[:80]!r}: not a readable JSON config ({e})") from e
    if not isinstance(parsed, dict):
        raise ValueError(f"model spec {text[:80]!r}: a JSON config must be a mapping, got {type(parsed).__name__}")
    return parsed


def _config_and_source(spec) -> tuple:
    """(config, pretrained source kwargs or None for a random init); a config may come as JSON (parse_model_spec)."""
    spec = parse_model_spec(spec)
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
               gradient_checkpointing: bool = False, attn_implementation: str | None = None) -> nn.Module:
    """Load a causal LM (role actor/ref/rollout) or a one-output critic (role critic) on CPU.
    `attn_implementation` None keeps transformers' default (sdpa)."""
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
        attn = {} if attn_implementation is None else {"attn_implementation": attn_implementation}
        if src is None:
            model = auto.from_config(config, dtype=dtype, **attn)
        elif critic:
            model = _critic_from_pretrained(auto, config, dtype, attn, src)
        else:
            model = auto.from_pretrained(config=config, dtype=dtype, **attn, **src)
        if critic and auto is AutoModel:
            model = ValueHeadModel(model).to(dtype)
    if getattr(model, "hf_quantizer", None) is not None:  # GGUF weights arrive dequantized
        model.hf_quantizer = None  # else save_pretrained refuses to write them back
        if hasattr(model.config, "quantization_config"):
            del model.config.quantization_config
    if gradient_checkpointing:
        set_checkpointing(model, True)
    return model


def _critic_from_pretrained(auto, config, dtype, attn: dict, src: dict) -> nn.Module:
    """The critic's backbone from a causal LM checkpoint, without transformers' load report: it lists the
    new value head as MISSING and the unused lm_head as UNEXPECTED, both expected here. One line says
    so; a missing backbone weight or another unexpected one is still a warning, named."""
    # where from_pretrained logs the report, and the tensor-parallel plan check (no TP here) that lists
    # the value head and the norms as "not sharded"
    quiet = [logging.getLogger(f"transformers.{name}") for name in ("modeling_utils", "distributed.tensor_parallel")]
    levels = [q.level for q in quiet]
    for q in quiet:
        q.setLevel(logging.ERROR)
    try:
        model, info = auto.from_pretrained(config=config, dtype=dtype, output_loading_info=True, **attn, **src)
    finally:
        for q, level in zip(quiet, levels):
            q.setLevel(level)
    where = src["pretrained_model_name_or_path"] + (f"/{src['gguf_file']}" if "gguf_file" in src else "")
    prefix = model.base_model_prefix + "."
    with_head = auto is AutoModelForTokenClassification  # else the head is added after loading (ValueHeadModel)
    missing = sorted(info["missing_keys"])
    head = [k for k in missing if with_head and not k.startswith(prefix)]
    lost = [k for k in missing if k not in head] + sorted(k for k in info["unexpected_keys"] if not k.startswith("lm_head."))
    print(f"critic: a new value head ({', '.join(head) or 'score'}) on the weights of {where}, as expected for a "
          "causal LM checkpoint (transformers' load report is not shown)", flush=True)
    if lost:
        more = f" and {len(lost) - 5} more" if len(lost) > 5 else ""
        print(f"WARNING: critic: {len(lost)} backbone weights of {where} missing or unused: "
              f"{', '.join(lost[:5])}{more}", flush=True)
    return model


def set_checkpointing(model: nn.Module, enabled: bool) -> None:
    """Turn activation (gradient) checkpointing of the decoder layers on or off."""
    if isinstance(model, ValueHeadModel):
        model = model.model
    new_api = hasattr(model, "activation_checkpointing_enable")  # transformers >= 5
    if not enabled:
        (model.activation_checkpointing_disable if new_api else model.gradient_checkpointing_disable)()
        return
    # Non-reentrant checkpointing works with FSDP2 and with inputs that need no grad.
    kwargs = {"use_reentrant": False}
    if new_api:
        model.activation_checkpointing_enable(activation_checkpointing_kwargs=kwargs)
    else:
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs=kwargs)


def compile_decoder_layers(model: nn.Module, enabled: bool = True, backend: str = "inductor") -> int:
    """torch.compile every decoder layer in place (enabled=False: back to eager); returns how many.

    One compiled graph serves all layers (same code, weights are inputs); dynamic shapes because
    packed micro-batches change their token count every call. Fuses the norms, rotary and SiLU
    work between the matmuls."""
    stacks = [m for name, m in model.named_modules() if name.endswith("layers") and isinstance(m, nn.ModuleList)]
    if not stacks:
        raise ValueError(f"compile: no decoder layer stack (a ModuleList named *layers) in {type(model).__name__}")
    for layer in stacks[0]:
        if enabled:
            layer.compile(dynamic=True, backend=backend)
        else:
            layer._compiled_call_impl = None  # what nn.Module.compile set; None restores the eager call
    return len(stacks[0])


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
