"""Qwen3 (per-head q/k norms, head_dim apart from hidden / heads) and Llama 3.2 (tied embeddings, llama3
rope scaling) on tiny configs: hf_static decodes as transformers' own forward, the actor's packed
fast path scores as its padded full-vocab path, and each shape's feature is shown to matter."""
import pytest
import torch
from transformers import AutoConfig, AutoModelForCausalLM

from test_rollout_hf import naive_greedy, prompts_of
from verl.workers.rollout import SamplingParams
from verl.workers.rollout.static_rollout import StaticRollout

COMMON = dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
              max_position_embeddings=256, pad_token_id=0, bos_token_id=1, eos_token_id=2)
# Qwen3-4B's layout in miniature: head_dim 32 with hidden 64 and 4 heads (q_proj widens to 128), no biases
QWEN3 = dict(COMMON, model_type="qwen3", head_dim=32, rope_theta=1e6, tie_word_embeddings=False)
# Llama 3.2-1B's: tied embeddings, llama3 rope scaling (an original context of 16 so that short
# sequences already fall into the scaled band)
# (a wide init: with tied embeddings and a small one, a random model just repeats its input token)
LLAMA32 = dict(COMMON, model_type="llama", head_dim=16, tie_word_embeddings=True, initializer_range=0.2,
               rope_parameters=dict(rope_type="llama3", rope_theta=500000.0, factor=8.0, low_freq_factor=1.0,
                                    high_freq_factor=4.0, original_max_position_embeddings=16))
FAMILIES = {"qwen3": QWEN3, "llama3.2": LLAMA32}


pytestmark = pytest.mark.usefixtures("one_thread")


def build(spec: dict, vocab: int, seed: int = 0):
    fields = {k: v for k, v in spec.items() if k != "model_type"}
    config = AutoConfig.for_model(spec["model_type"], vocab_size=vocab, **fields)
    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(config).float().eval()
    with torch.no_grad():  # random init leaves norm weights at 1: make the q/k (and layer) norms matter
        for name, p in model.named_parameters():
            if "norm" in name:
                p.normal_(1.0, 0.3, generator=torch.Generator().manual_seed(len(name)))
    return model


@pytest.mark.parametrize("family", sorted(FAMILIES))
def test_static_rollout_decodes_as_the_transformers_forward(tok, family):
    model = build(FAMILIES[family], len(tok), seed=3)
    if family == "llama3.2":
        assert model.lm_head.weight is model.model.embed_tokens.weight
    prompts = prompts_of(tok)[:3]
    sp = SamplingParams(greedy=True, max_new_tokens=16, return_logprobs=True)
    fast = StaticRollout(model, tok, eos_token_ids=[], max_model_len=64, chunk=4)
    fast.bucket = 16
    out = fast.generate(prompts, sp)
    for p, o in zip(prompts, out):
        want, lps = naive_greedy(model, p, 16)
        assert o.token_ids == want
        assert o.logprobs == pytest.approx(lps, abs=1e-4)

    # the family's feature matters: without it the decode differs (a static path that ignored it would fail)
    other = dict(FAMILIES[family])
    if family == "qwen3":
        plain = build(other, len(tok), seed=3)
        with torch.no_grad():
            for layer in plain.model.layers:
                layer.self_attn.q_norm.weight.fill_(1.0)
                layer.self_attn.k_norm.weight.fill_(5.0)
    else:
        other["rope_parameters"] = dict(rope_type="default", rope_theta=500000.0)
        plain = build(other, len(tok), seed=3)
    assert [naive_greedy(plain, p, 16)[0] for p in prompts] != [o.token_ids for o in out]


@pytest.mark.parametrize("family", sorted(FAMILIES))
def test_update_weights_reaches_the_fused_matrices_and_the_tied_head(tok, family):
    old, new = build(FAMILIES[family], len(tok), seed=4), build(FAMILIES[family], len(tok), seed=5)
    prompts = prompts_of(tok)[:2]
    sp = SamplingParams(greedy=True, max_new_tokens=10)
    fast = StaticRollout(old, tok, eos_token_ids=[], max_model_len=64)
    before = fast.generate(prompts, sp)
    fast.update_weights(new.state_dict())
    after = fast.generate(prompts, sp)
    assert [o.token_ids for o in after] == [naive_greedy(new, p, 10)[0] for p in prompts]
    assert after != before


@pytest.mark.parametrize("family", sorted(FAMILIES))
def test_actor_packed_log_probs_equal_the_padded_path(family):
    """The actor's packed rows + chunked head (use_remove_padding) against its padded full-vocab path,
    log-probs and entropies, and one LoRA-adapted update step on top (the q/k norms stay frozen)."""
    from ragged import packed_matches_padded
    from test_update_efficiency import make_batch
    from verl.workers.lora import LoraConfig

    data = make_batch(seed=7)
    data.meta["temperature"] = 0.9
    ref, fast, data = packed_matches_padded(dict(FAMILIES[family], vocab_size=80), data, lora=LoraConfig(rank=4))
    a, b = ref.update_actor(data), fast.update_actor(data)
    assert a["actor/grad_norm"] == pytest.approx(b["actor/grad_norm"], rel=1e-4)
