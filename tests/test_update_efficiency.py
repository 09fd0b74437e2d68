"""Efficient updates: chunked log-probs, packing (padding removal), the no-grad budget, and
that tools/bench/bench_update.py runs; every fast path is checked against the plain one."""
import json
import os
import subprocess
import sys

import pytest
import torch
from transformers import AutoModelForCausalLM, Qwen2Config

from ragged import ragged_batch
from verl.algos.logprob import chunked_logprobs
from verl.workers.actor import ActorWorker
from verl.workers.config import worker_config
from verl.workers.critic import CriticWorker
from verl.workers.micro_batch import pack_rows, response_logit_index
from verl.workers.model_loader import _varlen_flash, compile_decoder_layers, packed_attention_forward

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
V = 80
QWEN = dict(model_type="qwen2", vocab_size=V, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
            num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64, tie_word_embeddings=True)


pytestmark = pytest.mark.usefixtures("one_thread")


def make_batch(n=6, prompt_len=7, resp_len=9, seed=0):
    """Left-padded prompts and right-padded responses of different lengths (our DataProto layout)."""
    return ragged_batch(n, prompt_len, resp_len, seed, vocab=(3, V), min_response=1)


def actor(**kw):
    base = dict(model=QWEN, device="cpu", lr=1e-3, grad_clip=1e9, ppo_mini_batch_size=6, ppo_micro_batch_size=6)
    w = ActorWorker(worker_config(**{**base, **kw}))
    w.init_model()
    return w


def grads(worker):
    return {n: p.grad.clone() for n, p in worker.model.named_parameters() if p.grad is not None}


# ------------------------------------------------------------ chunked log-probs
def test_chunked_logprobs_match_full_log_softmax_values_and_gradients():
    g = torch.Generator().manual_seed(0)
    hidden = torch.randn(10, 16, generator=g, requires_grad=True)
    weight = torch.randn(V, 16, generator=g, requires_grad=True)
    bias = torch.randn(V, generator=g)
    labels = torch.randint(0, V, (10,), generator=g)

    logits = (hidden @ weight.T + bias) / 0.7
    ref_lp = torch.log_softmax(logits, -1).gather(-1, labels[:, None]).squeeze(-1)
    ref_ent = -(torch.softmax(logits, -1) * torch.log_softmax(logits, -1)).sum(-1)
    (ref_lp.sum() + 0.3 * ref_ent.sum()).backward()
    ref_grads = hidden.grad.clone(), weight.grad.clone()
    hidden.grad = weight.grad = None

    lp, ent = chunked_logprobs(hidden, weight, labels, bias, 0.7, with_entropy=True, chunk_size=3)  # 3 does not divide 10
    torch.testing.assert_close(lp, ref_lp, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(ent, ref_ent, atol=1e-5, rtol=1e-5)
    (lp.sum() + 0.3 * ent.sum()).backward()  # through the recomputed chunks
    torch.testing.assert_close(hidden.grad, ref_grads[0], atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(weight.grad, ref_grads[1], atol=1e-5, rtol=1e-5)

    with torch.inference_mode():
        lp_inf, ent_inf = chunked_logprobs(hidden, weight, labels, bias, 0.7, with_entropy=False)
    assert ent_inf is None
    torch.testing.assert_close(lp_inf, ref_lp.detach(), atol=1e-5, rtol=1e-5)
    with pytest.raises(ValueError, match="labels"):
        chunked_logprobs(hidden, weight, labels[:5])


def test_chunked_logprobs_gradients_through_gemma_softcap():
    """Gemma 2's final soft cap inside the chunks: values and gradients equal plain autograd's, past the cap too."""
    g = torch.Generator().manual_seed(1)
    hidden = torch.randn(9, 16, generator=g, dtype=torch.float64, requires_grad=True)
    weight = (3 * torch.randn(V, 16, generator=g, dtype=torch.float64)).requires_grad_()  # logits well past 5
    labels = torch.randint(0, V, (9,), generator=g)
    capped = torch.tanh(hidden @ weight.T / 5.0) * 5.0
    logp_all = torch.log_softmax(capped / 0.7, -1)
    ref_lp = logp_all.gather(-1, labels[:, None]).squeeze(-1)
    ref_ent = -(logp_all.exp() * logp_all).sum(-1)
    (ref_lp * torch.arange(9) - 0.5 * ref_ent).sum().backward()
    ref = hidden.grad.clone(), weight.grad.clone()
    hidden.grad = weight.grad = None
    lp, ent = chunked_logprobs(hidden, weight, labels, None, 0.7, with_entropy=True, chunk_size=4, softcap=5.0)
    torch.testing.assert_close(lp, ref_lp.float(), atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(ent, ref_ent.float(), atol=1e-5, rtol=1e-5)
    (lp * torch.arange(9) - 0.5 * ent).sum().backward()
    torch.testing.assert_close(hidden.grad, ref[0], atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(weight.grad, ref[1], atol=1e-5, rtol=1e-5)


# ------------------------------------------------------------------- packing
def test_pack_rows_and_response_index():
    attn = torch.tensor([[0, 1, 1, 1, 1, 1, 0], [1, 1, 1, 1, 1, 0, 0], [0, 0, 1, 1, 1, 1, 1]])
    ids = torch.arange(1, 22).view(3, 7) * attn
    pos = (attn.cumsum(-1) - 1).clamp(min=0)
    p = pack_rows(ids, attn, pos)
    assert p.input_ids.tolist() == [[2, 3, 4, 5, 6, 8, 9, 10, 11, 12, 17, 18, 19, 20, 21]]
    assert p.position_ids.tolist() == [[0, 1, 2, 3, 4, 0, 1, 2, 3, 4, 0, 1, 2, 3, 4]]
    assert p.cu_seqlens.tolist() == [0, 5, 10, 15] and p.max_len == 5

    index, real = response_logit_index(attn, 3, packed=True)
    assert real.tolist() == [[1, 1, 0], [1, 0, 0], [1, 1, 1]]
    # Each response token is scored by the packed position of the token before it.
    assert p.input_ids[0, index].tolist() == [4, 5, 11, 18, 19, 20]
    index, _ = response_logit_index(attn, 3, packed=False)
    assert ids.flatten()[index].tolist() == [4, 5, 11, 18, 19, 20]
    with pytest.raises(ValueError, match=r"rows \[1\]"):
        pack_rows(ids, attn * torch.tensor([[1], [0], [1]]), pos)


def test_transformers_detects_packed_positions_with_sdpa():
    """What transformers 5 does by itself: attention_mask=None and positions restarting per
    sequence give a block-diagonal causal mask (dense (total, total) for sdpa)."""
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(Qwen2Config(**{k: v for k, v in QWEN.items() if k != "model_type"}),
                                             attn_implementation="sdpa").eval()
    a, b = torch.randint(3, V, (1, 5)), torch.randint(3, V, (1, 7))
    with torch.no_grad():
        packed = model(input_ids=torch.cat([a, b], 1), position_ids=torch.cat([torch.arange(5), torch.arange(7)])[None],
                       use_cache=False).logits  # with a cache transformers does not look for packing
        separate = torch.cat([model(input_ids=a).logits, model(input_ids=b).logits], 1)
        crossing = model(input_ids=torch.cat([a, b], 1)).logits  # one long sequence: b attends to a
    torch.testing.assert_close(packed, separate, atol=1e-5, rtol=1e-5)
    assert (crossing[:, 5:] - separate[:, 5:]).abs().max() > 1e-3


@pytest.mark.parametrize("chunk", [4, None])
def test_packed_and_chunked_paths_equal_the_reference_path(chunk):
    """Log-probs, entropies, the update's metrics and gradients: packed / chunked vs padded full-vocab."""
    data = make_batch(seed=2)
    data.meta.update(temperature=0.8, calculate_entropy=True)
    ref = actor(logprob_chunk_size=None, gradient_checkpointing=True)
    fast = actor(logprob_chunk_size=chunk, use_remove_padding=True, max_tokens_per_micro_batch=40,
                 log_prob_max_tokens_per_micro_batch=200)
    out_ref, out_fast = ref.compute_log_prob(data), fast.compute_log_prob(data)
    real = data.batch["attention_mask"][:, 7:].bool()
    for key in ("old_log_probs", "entropys"):
        torch.testing.assert_close(out_fast.batch[key], out_ref.batch[key], atol=1e-5, rtol=1e-5)
        assert (out_fast.batch[key][~real] == 0).all()
    assert not out_fast.batch["old_log_probs"].is_inference()  # usable by the autograd of the update

    data = data.union(out_ref.select(["old_log_probs"]))
    ref.config.actor.entropy_coef = fast.config.actor.entropy_coef = 0.01
    m_ref, m_fast = ref.update_actor(data), fast.update_actor(data)
    for key in ("actor/pg_loss", "actor/entropy", "actor/grad_norm"):
        assert m_fast[key] == pytest.approx(m_ref[key], rel=1e-4, abs=1e-6), key
    g_ref, g_fast = grads(ref), grads(fast)
    assert g_ref.keys() == g_fast.keys()
    for name in g_ref:
        torch.testing.assert_close(g_fast[name], g_ref[name], atol=1e-5, rtol=1e-4, msg=lambda m: f"{name}: {m}")


def test_packed_critic_values_and_update_equal_padded():
    data = make_batch(seed=3)
    data.batch["returns"] = torch.randn(6, 9)
    critics = []
    for packed in (False, True):
        c = CriticWorker(worker_config("critic", model=QWEN, device="cpu", lr=1e-3, grad_clip=1e9, ppo_mini_batch_size=6,
                                      max_tokens_per_micro_batch=40, use_remove_padding=packed))
        c.init_model()
        critics.append(c)
    values = [c.compute_values(data).batch["values"] for c in critics]
    torch.testing.assert_close(values[1], values[0], atol=1e-5, rtol=1e-5)
    data.batch["values"] = values[0]
    losses = [c.update_critic(data)["critic/vf_loss"] for c in critics]
    assert losses[1] == pytest.approx(losses[0], rel=1e-5)
    g0, g1 = grads(critics[0]), grads(critics[1])
    for name in g0:
        torch.testing.assert_close(g1[name], g0[name], atol=1e-5, rtol=1e-4)


def test_log_prob_budget_is_separate_from_the_training_budget():
    data = make_batch(seed=4)
    worker = actor(max_tokens_per_micro_batch=200, log_prob_max_tokens_per_micro_batch=3, use_remove_padding=True)
    with pytest.raises(ValueError, match="max_tokens_per_micro_batch=3"):
        worker.compute_log_prob(data)  # the no-grad pass uses its own (here too small) budget
    worker.config.actor.log_prob_max_tokens_per_micro_batch = None
    data = data.union(worker.compute_log_prob(data))
    worker.config.actor.max_tokens_per_micro_batch = 3
    with pytest.raises(ValueError, match="max_tokens_per_micro_batch=3"):
        worker.update_actor(data)

    plain = actor()  # loaded without the packed attention: switching packing on later must fail loudly
    plain.config.actor.use_remove_padding = True
    with pytest.raises(RuntimeError, match="use_remove_padding"):
        plain.compute_log_prob(data)


def _per_sequence(q, k, v, cu, is_causal, scale=None):
    """What flash varlen computes, (total, heads, dim) layout."""
    out = []
    for s, e in zip(cu[:-1].tolist(), cu[1:].tolist()):
        qs, ks, vs = (x[s:e].transpose(0, 1) for x in (q, k, v))
        out.append(torch.nn.functional.scaled_dot_product_attention(qs, ks, vs, is_causal=is_causal, scale=scale))
    return torch.cat([o.transpose(0, 1) for o in out])


def fake_varlen_2_10(query, key, value, cu_seq_q, cu_seq_k, max_q, max_k, is_causal=False, return_aux=None):
    assert query.shape[1] == key.shape[1], "torch 2.10's varlen_attn has no GQA"
    return _per_sequence(query, key, value, cu_seq_q, is_causal)


def fake_varlen_2_12(query, key, value, cu_seq_q, cu_seq_k, max_q, max_k, *, return_aux=None, scale=None,
                     window_size=(-1, -1), enable_gqa=False):
    assert tuple(window_size) in ((-1, -1), (-1, 0))
    if enable_gqa:
        key = key.repeat_interleave(query.shape[1] // key.shape[1], dim=1)
        value = value.repeat_interleave(query.shape[1] // value.shape[1], dim=1)
    return _per_sequence(query, key, value, cu_seq_q, tuple(window_size) == (-1, 0), scale)


@pytest.mark.parametrize("fake", [fake_varlen_2_10, fake_varlen_2_12])
def test_varlen_glue_matches_the_per_sequence_attention(monkeypatch, fake):
    """The CUDA path's call into torch's varlen_attn (both signatures), checked against the
    CPU path on a packed row: layout, causality, GQA and scale must survive the glue."""
    import torch.nn.attention.varlen as varlen

    monkeypatch.setattr(varlen, "varlen_attn", fake)
    g = torch.Generator().manual_seed(0)
    query, key, value = torch.randn(1, 4, 12, 8, generator=g), torch.randn(1, 2, 12, 8, generator=g), torch.randn(1, 2, 12, 8, generator=g)
    cu = torch.tensor([0, 5, 12], dtype=torch.int32)
    module = torch.nn.Module()
    expected, _ = packed_attention_forward(module, query, key, value, None, scaling=8**-0.5, cu_seq_lens_q=cu, max_length_q=7)
    q, k, v = (x[0].transpose(0, 1) for x in (query, key, value))
    got = _varlen_flash(q, k, v, cu, 7, 8**-0.5)[None]
    torch.testing.assert_close(got, expected, atol=1e-6, rtol=1e-5)
    if fake is fake_varlen_2_10:
        with pytest.raises(RuntimeError, match="no scale argument"):
            _varlen_flash(q, k, v, cu, 7, 0.5)


# --------------------------------------------------------------- the benchmark
def test_bench_update_tiny_runs(tmp_path):
    out = tmp_path / "bench.json"
    proc = subprocess.run([sys.executable, "-m", "tools.bench.bench_update", "--tiny", "--out", str(out)],
                          cwd=ROOT, capture_output=True, text=True, timeout=120,
                          env={**os.environ, "PYTHONPATH": ROOT, "OMP_NUM_THREADS": "1"})
    assert proc.returncode == 0, proc.stderr[-3000:]
    result = json.loads(out.read_text())
    assert {r["name"] for r in result["runs"]} == {"reference", "ours"}
    for run in result["runs"]:
        assert run["update_tokens_per_s"] > 0 and run["real_tokens"] > 0 and "error" not in run
    assert result["max_abs_logprob_diff"] < 1e-4  # both paths score the same tokens alike
    assert result["ratio_update_tokens_per_s"] > 0
    assert "ratio" in proc.stdout


def test_compiled_decoder_layers_give_the_eager_log_probs_and_gradients():
    """model.compile=true: each decoder layer torch.compile'd (packed rows, dynamic shapes) computes
    the eager log-probs and gradients; switching back to eager really restores the plain call.
    Traced through dynamo + AOTAutograd with the aot_eager backend: inductor's CPU code generation
    for forward and backward takes minutes on 2 cores (its forward kernels are checked in
    test_rollout_static; the GPU figures come from tools/bench/bench_update.py)."""
    data = make_batch(seed=5)
    assert all(layer._compiled_call_impl is not None for layer in actor(compile=True).model.model.layers)
    eager, fused = actor(use_remove_padding=True), actor(use_remove_padding=True)
    layers = fused.model.model.layers
    assert compile_decoder_layers(fused.model, backend="aot_eager") == len(layers)
    assert all(layer._compiled_call_impl is not None for layer in layers)
    lp = [w.compute_log_prob(data).batch["old_log_probs"] for w in (eager, fused)]
    torch.testing.assert_close(lp[1], lp[0], atol=1e-5, rtol=1e-5)
    data = data.union(eager.compute_log_prob(data))
    for w in (eager, fused):
        w.update_actor(data)
    g_ref, g_fast = grads(eager), grads(fused)
    assert g_ref.keys() == g_fast.keys()
    for name in g_ref:
        torch.testing.assert_close(g_fast[name], g_ref[name], atol=1e-5, rtol=1e-4, msg=lambda m: f"{name}: {m}")
    compile_decoder_layers(fused.model, False)
    assert all(layer._compiled_call_impl is None for layer in layers)
    with pytest.raises(ValueError, match="no decoder layer stack"):
        compile_decoder_layers(torch.nn.Linear(2, 2))
