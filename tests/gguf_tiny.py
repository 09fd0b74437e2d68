"""Write a small Llama as a GGUF file the way llama.cpp's converter lays it out (test helper).

Tensor names `blk.N.*`, q/k rows permuted for llama.cpp's rotary layout, the config as
`llama.*` keys and our BPE tokenizer as a "gpt2" (byte-level BPE) vocabulary with merges;
added tokens such as `<think>` are USER_DEFINED so they stay whole. Weights are stored as F32,
so loading them back through transformers must give the same model exactly.
"""
from __future__ import annotations

import json

import gguf
import numpy as np
import torch


def _rope_rows(w: np.ndarray, n_head: int) -> np.ndarray:
    """llama.cpp keeps each head's rotary halves interleaved: (head, 2, d/2) rows -> (head, d/2, 2)."""
    return w.reshape(n_head, 2, w.shape[0] // n_head // 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def write_llama_gguf(path, model, tokenizer) -> None:
    """Save an HF LlamaForCausalLM (untied output layer) and its tokenizer as one GGUF file."""
    cfg = model.config
    w = gguf.GGUFWriter(str(path), "llama")
    w.add_context_length(cfg.max_position_embeddings)
    w.add_embedding_length(cfg.hidden_size)
    w.add_block_count(cfg.num_hidden_layers)
    w.add_feed_forward_length(cfg.intermediate_size)
    w.add_head_count(cfg.num_attention_heads)
    w.add_head_count_kv(cfg.num_key_value_heads)
    w.add_layer_norm_rms_eps(cfg.rms_norm_eps)
    w.add_rope_freq_base(float(cfg.rope_parameters["rope_theta"]))
    w.add_rope_dimension_count(cfg.hidden_size // cfg.num_attention_heads)

    vocab = tokenizer.get_vocab()
    tokens = [t for t, _ in sorted(vocab.items(), key=lambda kv: kv[1])]
    added, special = tokenizer.get_added_vocab(), set(tokenizer.all_special_tokens)
    w.add_tokenizer_model("gpt2")
    w.add_token_list(tokens)
    w.add_token_types([gguf.TokenType.CONTROL if t in special else gguf.TokenType.USER_DEFINED if t in added
                       else gguf.TokenType.NORMAL for t in tokens])
    merges = json.loads(tokenizer.backend_tokenizer.to_str())["model"]["merges"]
    w.add_token_merges([" ".join(m) if isinstance(m, list) else m for m in merges])
    for name, value in (("eos", tokenizer.eos_token_id), ("bos", tokenizer.bos_token_id),
                        ("pad", tokenizer.pad_token_id)):
        if value is not None:
            getattr(w, f"add_{name}_token_id")(value)
    if tokenizer.chat_template:
        w.add_chat_template(tokenizer.chat_template)

    sd = {k: v.detach().float().numpy() for k, v in model.state_dict().items()}
    w.add_tensor("token_embd.weight", sd["model.embed_tokens.weight"])
    w.add_tensor("output_norm.weight", sd["model.norm.weight"])
    w.add_tensor("output.weight", sd["lm_head.weight"])
    names = {"attn_norm": "input_layernorm", "attn_v": "self_attn.v_proj", "attn_output": "self_attn.o_proj",
             "ffn_norm": "post_attention_layernorm", "ffn_gate": "mlp.gate_proj", "ffn_up": "mlp.up_proj",
             "ffn_down": "mlp.down_proj"}
    for i in range(cfg.num_hidden_layers):
        p = f"model.layers.{i}."
        w.add_tensor(f"blk.{i}.attn_q.weight", _rope_rows(sd[p + "self_attn.q_proj.weight"], cfg.num_attention_heads))
        w.add_tensor(f"blk.{i}.attn_k.weight", _rope_rows(sd[p + "self_attn.k_proj.weight"], cfg.num_key_value_heads))
        for ours, theirs in names.items():
            w.add_tensor(f"blk.{i}.{ours}.weight", sd[p + theirs + ".weight"])
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


def tiny_llama(vocab_size: int, seed: int = 0):
    """A random 2-layer Llama with an untied output layer (GGUF stores `output.weight` apart)."""
    from transformers import LlamaConfig, LlamaForCausalLM

    cfg = LlamaConfig(vocab_size=vocab_size, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=512,
                      tie_word_embeddings=False)
    torch.manual_seed(seed)
    return LlamaForCausalLM(cfg).eval()
