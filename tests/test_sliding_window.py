"""Sliding-window layers (Gemma 3) in the packed attention: a packed row gives the logits of the
sequences run one by one through transformers' own sliding-window masks, on the CPU path and
through the CUDA path's varlen glue (a fake varlen_attn that honours window_size)."""
import pytest
import torch
import torch.nn.functional as F
from transformers import AutoConfig, AutoModelForCausalLM

from verl.workers.model_loader import PACKED_ATTENTION, _varlen_flash, packed_attention_forward

WINDOW = 4


def tiny_gemma3(attn: str):
    cfg = AutoConfig.for_model("gemma3_text", vocab_size=64, hidden_size=32, intermediate_size=64,
                               num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2, head_dim=8,
                               sliding_window=WINDOW, layer_types=["sliding_attention", "full_attention"],
                               max_position_embeddings=64)
    torch.manual_seed(0)
    return AutoModelForCausalLM.from_config(cfg, attn_implementation=attn).eval()


def test_packed_row_equals_separate_sequences_on_a_sliding_window_model():
    lens = [9, 12]  # both longer than the window: the window must cut
    ids = [torch.randint(3, 64, (1, n), generator=torch.Generator().manual_seed(n)) for n in lens]
    ref = tiny_gemma3("sdpa")
    packed_model = tiny_gemma3(PACKED_ATTENTION)
    cu = torch.tensor([0, 9, 21], dtype=torch.int32)
    with torch.no_grad():
        separate = torch.cat([ref(input_ids=x).logits for x in ids], 1)  # (1, 21, vocab)
        packed = packed_model(input_ids=torch.cat(ids, 1), position_ids=torch.cat([torch.arange(n) for n in lens])[None],
                              cu_seq_lens_q=cu, cu_seq_lens_k=cu, max_length_q=12, max_length_k=12,
                              use_cache=False).logits
        ref.config.sliding_window = 64  # the same weights without the window: the window mattered
        unwindowed = torch.cat([ref(input_ids=x).logits for x in ids], 1)
    torch.testing.assert_close(packed, separate, atol=1e-5, rtol=1e-5)
    assert (unwindowed - separate).abs().max() > 1e-3


def fake_varlen(query, key, value, cu_seq_q, cu_seq_k, max_q, max_k, *, return_aux=None, scale=None,
                window_size=(-1, -1), enable_gqa=False):
    """torch's varlen_attn semantics on CPU: key j is visible to query i when i - left <= j <= i + right."""
    left, right = window_size
    g = query.shape[1] // key.shape[1]
    out = []
    bounds = cu_seq_q.tolist()
    for s, e in zip(bounds[:-1], bounds[1:]):
        pos = torch.arange(e - s)
        back = pos[:, None] - pos[None, :]
        ok = (back >= (-right if right >= 0 else -10**9)) & (back <= (left if left >= 0 else 10**9))
        q, k, v = (x[s:e].transpose(0, 1) for x in (query, key.repeat_interleave(g, 1), value.repeat_interleave(g, 1)))
        out.append(F.scaled_dot_product_attention(q, k, v, attn_mask=ok, scale=scale).transpose(0, 1))
    return torch.cat(out)


def test_varlen_glue_passes_the_window(monkeypatch):
    import torch.nn.attention.varlen as varlen

    monkeypatch.setattr(varlen, "varlen_attn", fake_varlen)
    g = torch.Generator().manual_seed(1)
    query, key, value = (torch.randn(1, h, 12, 8, generator=g) for h in (4, 2, 2))
    cu = torch.tensor([0, 5, 12], dtype=torch.int32)
    q, k, v = (x[0].transpose(0, 1) for x in (query, key, value))
    for window in (None, 3):
        expected, _ = packed_attention_forward(torch.nn.Module(), query, key, value, None, scaling=0.3,
                                               cu_seq_lens_q=cu, max_length_q=7, sliding_window=window)
        torch.testing.assert_close(_varlen_flash(q, k, v, cu, 7, 0.3, window)[None], expected, atol=1e-6, rtol=1e-5)
    windowed = _varlen_flash(q, k, v, cu, 7, 0.3, 3)
    assert (windowed - _varlen_flash(q, k, v, cu, 7, 0.3)).abs().max() > 1e-3


def test_old_varlen_without_window_size_refuses_a_window(monkeypatch):
    import torch.nn.attention.varlen as varlen

    def old(query, key, value, cu_seq_q, cu_seq_k, max_q, max_k, is_causal=False, return_aux=None):
        raise AssertionError("must not be called with a window it cannot apply")

    monkeypatch.setattr(varlen, "varlen_attn", old)
    x = torch.zeros(5, 2, 8)
    with pytest.raises(RuntimeError, match="window_size"):
        _varlen_flash(x, x, x, torch.tensor([0, 5], dtype=torch.int32), 5, None, 3)


GEMMA3 = dict(model_type="gemma3_text", vocab_size=80, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
              num_attention_heads=4, num_key_value_heads=2, head_dim=8, sliding_window=WINDOW,
              layer_types=["sliding_attention", "full_attention"], max_position_embeddings=64)
GEMMA2 = dict(model_type="gemma2", vocab_size=80, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
              num_attention_heads=4, num_key_value_heads=2, head_dim=8, sliding_window=WINDOW,
              attn_logit_softcapping=None, final_logit_softcapping=2.0, max_position_embeddings=64)


@pytest.mark.parametrize("spec", [GEMMA3, GEMMA2], ids=["gemma3-window", "gemma2-final-softcap"])
def test_actor_fast_log_probs_equal_the_reference_path_on_gemma_shapes(spec):
    """The packed rows + chunked-head log-probs of the actor against its padded full-vocab path
    (the model's own forward) on 16-token rows: the window (4) and the final soft-cap must hold."""
    from ragged import packed_matches_padded
    from test_update_efficiency import make_batch

    data = make_batch(seed=5)
    data.meta["temperature"] = 0.8
    packed_matches_padded(spec, data)


def test_packed_attention_refuses_attention_softcapping():
    x = torch.zeros(1, 2, 5, 8)
    with pytest.raises(ValueError, match="soft-capping"):
        packed_attention_forward(torch.nn.Module(), x, x, x, None, cu_seq_lens_q=torch.tensor([0, 5]), max_length_q=5,
                                 softcap=50.0)
