"""Tiny real parts: a byte-level BPE tokenizer trained on the spot and a random-init LM.

Nothing is downloaded: the tokenizer is trained on a corpus (the strings below by
default), the model is built from a config. The tests, the engine's smoke default and
the embedded router all use these.
"""
from __future__ import annotations

import torch
from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers, trainers
from transformers import (
    LlamaConfig,
    LlamaForCausalLM,
    PreTrainedTokenizerFast,
    Qwen2Config,
    Qwen2ForCausalLM,
)

PAD, BOS, EOS = "<|pad|>", "<|endoftext|>", "<|im_end|>"
IM_START = "<|im_start|>"
SPECIAL_TOKENS = (PAD, BOS, EOS, IM_START)
# Our protocol tags: single tokens, but NOT special, so decode(skip_special_tokens=True) keeps them.
TAGS = ("<think>", "</think>", "<search>", "</search>", "<answer>", "</answer>",
        "<information>", "</information>")

CHAT_TEMPLATE = (
    "{% for m in messages %}"
    "<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n"
    "{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)

CORPUS = [
    "<think>I need the capital of France.</think><answer>Paris</answer>",
    "<think>Ask a bigger model.</think><search>LLaMA-3.1-70B-Instruct: Who wrote Hamlet?</search>",
    "<information>William Shakespeare wrote Hamlet around 1600.</information>",
    "<search>Qwen2.5-7B-Instruct: When does the train leave? At 10:30 in the morning.</search>",
    "<answer>William Shakespeare</answer>",
    "The quick brown fox jumps over the lazy dog. 0123456789",
    "Mistral-7B-Instruct, Mixtral-8x22B-Instruct, Gemma-2-27B-Instruct, LLaMA-3.1-8B-Instruct",
    "Question: which river is the longest in Europe? Answer: the Volga.",
    "system user assistant: you are a helpful router over a pool of language models.",
    "How many moons does Mars have? Two: Phobos and Deimos.",
    "café naïve 東京 — unicode text must round-trip through byte-level BPE.",
]

_TRAINED_JSON: str | None = None  # the default tokenizer, trained once per process


def train_bpe_json(corpus: list[str], vocab_size: int = 400, tags: tuple[str, ...] = TAGS) -> str:
    """Train a byte-level BPE on `corpus`; our tags are added as single, non-special tokens."""
    tok = Tokenizer(models.BPE(unk_token=None))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=list(SPECIAL_TOKENS),
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),  # every byte is encodable
        show_progress=False,
    )
    tok.train_from_iterator(corpus, trainer=trainer)
    tok.add_tokens([AddedToken(t, special=False, normalized=False) for t in tags])
    return tok.to_str()


def wrap_tokenizer(tokenizer_json: str) -> PreTrainedTokenizerFast:
    """A transformers tokenizer (pad/bos/eos, ChatML template, left padding) around a trained BPE."""
    tok = PreTrainedTokenizerFast(
        tokenizer_object=Tokenizer.from_str(tokenizer_json),
        pad_token=PAD, bos_token=BOS, eos_token=EOS,
        additional_special_tokens=[IM_START],
        clean_up_tokenization_spaces=False,
    )
    tok.chat_template = CHAT_TEMPLATE
    tok.padding_side = "left"
    return tok


def tiny_tokenizer(extra_tokens: tuple[str, ...] | list[str] = ()) -> PreTrainedTokenizerFast:
    """A fresh ~400-token byte-level BPE tokenizer with our tags, pad/bos/eos and a ChatML template.

    `extra_tokens` are added as plain (non-special) added tokens.
    """
    global _TRAINED_JSON
    if _TRAINED_JSON is None:
        _TRAINED_JSON = train_bpe_json(CORPUS * 4)
    # A new wrapper per call so one test's added tokens never leak into another's.
    tok = wrap_tokenizer(_TRAINED_JSON)
    if extra_tokens:
        tok.add_tokens([AddedToken(t, special=False, normalized=False) for t in extra_tokens])
    return tok


def tiny_model(vocab_size: int, kind: str = "llama", seed: int = 0, hidden: int = 64,
               layers: int = 2, heads: int = 4, **config_overrides) -> torch.nn.Module:
    """A random-init fp32 causal LM (Llama, Qwen2 or Gemma 3 architecture) built from a config."""
    common = dict(
        vocab_size=vocab_size, hidden_size=hidden, intermediate_size=2 * hidden,
        num_hidden_layers=layers, num_attention_heads=heads,
        num_key_value_heads=max(1, heads // 2),  # grouped-query attention, as the real models use
        max_position_embeddings=1024, tie_word_embeddings=False,
        # ids fixed by tiny_tokenizer's special-token order (pad, bos, eos first)
        pad_token_id=0, bos_token_id=1, eos_token_id=2,
    )
    common.update(config_overrides)
    if kind == "llama":
        config, cls = LlamaConfig(**common), LlamaForCausalLM
    elif kind == "qwen2":
        config, cls = Qwen2Config(use_sliding_window=False, **common), Qwen2ForCausalLM
    elif kind == "gemma3":  # sliding-window layers (window 6 unless overridden) between full ones
        from transformers import Gemma3ForCausalLM, Gemma3TextConfig

        common.setdefault("sliding_window", 6)
        common.setdefault("layer_types", (["sliding_attention", "full_attention"] * layers)[:layers])
        config, cls = Gemma3TextConfig(head_dim=hidden // heads, **common), Gemma3ForCausalLM
    else:
        raise ValueError(f"tiny_model: kind must be 'llama', 'qwen2' or 'gemma3', got {kind!r}")
    with torch.random.fork_rng(devices=[]):  # seed the init without touching the caller's RNG
        torch.manual_seed(seed)
        model = cls(config)
    return model.float().eval()
