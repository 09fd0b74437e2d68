"""StaticRollout (static KV cache, graph-ready decode step) against HFRollout and the model's distribution.

On CPU the decode step runs eagerly; the CUDA-graph replay of the same step is checked on
the GPU by tools/bench/bench_rollout.py (log-probs against a teacher-forced forward).
"""
import pytest
import torch

from test_rollout_hf import _chi_square_ok, eos_and_stop, naive_greedy, prompts_of
from tiny import tiny_model
from verl.workers.rollout import SamplingParams, build_rollout
from verl.workers.rollout.hf_rollout import HFRollout
from verl.workers.rollout.static_rollout import StaticRollout, sample_and_logprob, sample_from_uniform


pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.mark.parametrize("kind,extra", [("llama", {}), ("qwen2", {}),
                                        ("llama", {"mlp_bias": True, "attention_bias": True})])
def test_greedy_tokens_and_logprobs_match_hf_rollout(tok, kind, extra):
    model = tiny_model(len(tok), kind=kind, seed=11, **extra)
    if extra:  # random init leaves biases at zero: make them matter (gate|up, down, q|k|v, o)
        with torch.no_grad():
            for name, p in model.named_parameters():
                if name.endswith("bias"):
                    p.normal_(0, 0.5, generator=torch.Generator().manual_seed(len(name)))
    prompts = prompts_of(tok)
    sp = SamplingParams(greedy=True, max_new_tokens=40, return_logprobs=True)
    ref = HFRollout(model, tok, eos_token_ids=[]).generate(prompts, sp)
    # chunk 3 and bucket 16: several chunks and several attention spans in one call
    fast = StaticRollout(model, tok, eos_token_ids=[], max_model_len=128, chunk=3)
    fast.bucket = 16
    out = fast.generate(prompts, sp)
    for r, o in zip(ref, out):
        assert o.token_ids == r.token_ids
        assert o.finish_reason == r.finish_reason == "length"
        assert o.logprobs == pytest.approx(r.logprobs, abs=1e-4)


def test_stops_eos_and_reuse_of_the_cache_match_hf_rollout(tok):
    model = tiny_model(len(tok), seed=12)
    prompts = prompts_of(tok)
    eos, sp = eos_and_stop(model, tok, prompts, 20)
    ref = HFRollout(model, tok, eos_token_ids=[eos]).generate(prompts, sp)
    fast = StaticRollout(model, tok, eos_token_ids=[eos], max_batch_size=2, max_model_len=64, chunk=4)
    first = fast.generate(prompts, sp)  # 3 chunks of rows through the same cache
    assert first == ref
    assert {"stop", "eos"} <= {o.finish_reason for o in first}
    assert fast.generate(prompts[::-1], sp) == ref[::-1]  # a stale cache from the last call changes nothing


def test_seeded_sampling_is_reproducible_and_rows_are_independent(tok):
    model = tiny_model(len(tok), seed=13)
    fast = StaticRollout(model, tok, eos_token_ids=[], max_model_len=64)
    prompts = prompts_of(tok)[:1] * 6
    sp = SamplingParams(max_new_tokens=10, seed=5)
    a, b = fast.generate(prompts, sp), fast.generate(prompts, sp)
    assert a == b
    assert a != fast.generate(prompts, SamplingParams(max_new_tokens=10, seed=6))
    assert len({tuple(o.token_ids) for o in a}) > 1


@pytest.mark.parametrize("temperature,top_k,top_p", [(1.0, -1, 1.0), (0.7, 5, 1.0), (1.0, -1, 0.6)])
def test_inverse_cdf_sampling_matches_the_distribution(temperature, top_k, top_p):
    gen = torch.Generator().manual_seed(0)
    logits = torch.randn(40, generator=gen) * 2  # (vocab,)
    sp = SamplingParams(temperature=temperature, top_k=top_k, top_p=top_p)
    from verl.workers.rollout.hf_rollout import filter_logits
    target = filter_logits(logits[None] / temperature, top_k, top_p).softmax(-1)[0]
    n = 20000
    u = torch.rand(n, generator=gen)
    sampled = sample_from_uniform(logits.expand(n, -1), u, sp)  # (n,)
    assert (target[sampled] > 0).all(), "sampled a filtered-out token"
    stat, crit = _chi_square_ok(torch.bincount(sampled, minlength=40).float(), target, n)
    assert stat < crit, f"chi-square {stat:.1f} >= {crit:.1f}"


@pytest.mark.parametrize("temperature", [1.0, 0.7])
def test_two_level_sampler_picks_the_flat_inverse_cdf_token(temperature):
    """Unfiltered sampling goes through blocks of the vocabulary (no vocabulary-wide cumsum): same
    uniform, same token as the flat inverse CDF; log-probs are the full log-softmax of logits / T."""
    gen = torch.Generator().manual_seed(1)
    logits = (torch.randn(64, 5000, generator=gen) * 3).to(torch.bfloat16)  # 5 blocks, the last padded
    u = torch.rand(64, generator=gen)
    sp = SamplingParams(temperature=temperature, return_logprobs=True)
    tok, lp = sample_and_logprob(logits, u, sp)
    flat = sample_from_uniform(logits, u, sp)
    assert (tok == flat).float().mean() >= 0.98, "blocks changed which token u falls on"
    assert len(set(tok.tolist())) > 40  # really sampled, not a constant
    expected = torch.log_softmax(logits.float() / temperature, -1).gather(1, tok[:, None])[:, 0]
    torch.testing.assert_close(lp[:, 0], expected,
                               atol=1e-4, rtol=1e-5)


def test_two_level_sampler_matches_the_distribution():
    gen = torch.Generator().manual_seed(2)
    logits = torch.randn(2500, generator=gen) * 2  # three blocks of 1024
    target = (logits / 0.8).softmax(-1)
    n = 40000
    tok, _ = sample_and_logprob(logits.expand(n, -1), torch.rand(n, generator=gen), SamplingParams(temperature=0.8))
    stat, crit = _chi_square_ok(torch.bincount(tok, minlength=2500).float(), target, n)
    assert stat < crit, f"chi-square {stat:.1f} >= {crit:.1f}"


@pytest.mark.parametrize("two_level", [False, True])
def test_edges_of_the_uniform_never_pick_a_zero_probability_token(two_level):
    logits = torch.tensor([[0.0, float("-inf"), 0.0, float("-inf")]]).expand(3, -1)
    u = torch.tensor([0.0, 0.5, 1.0 - 1e-7])
    tok = sample_and_logprob(logits, u, SamplingParams())[0] if two_level else sample_from_uniform(logits, u, SamplingParams())
    assert tok.tolist() == [0, 2, 2]


def test_clear_errors(tok):
    model = tiny_model(len(tok))
    fast = StaticRollout(model, tok, max_model_len=16)
    with pytest.raises(ValueError, match="max_model_len=16"):
        fast.generate(prompts_of(tok)[:2], SamplingParams(max_new_tokens=15))
    from transformers import GPT2Config, GPT2LMHeadModel
    gpt2 = GPT2LMHeadModel(GPT2Config(n_layer=1, n_embd=32, n_head=2, vocab_size=len(tok)))
    with pytest.raises(ValueError, match="use rollout.name=hf"):
        StaticRollout(gpt2, tok)


def test_build_rollout_by_name(tok):
    model = tiny_model(len(tok))
    roll = build_rollout({"name": "hf_static", "max_batch_size": 8, "max_model_len": 256}, model, tok)
    assert isinstance(roll, StaticRollout) and roll.max_model_len == 256 and roll.max_batch_size == 8
    roll.sleep()  # frees the cache; generating again reallocates it
    roll.wake()
    assert len(roll.generate(prompts_of(tok)[:2], SamplingParams(max_new_tokens=3, seed=0))[1].token_ids) == 3


def test_update_weights_reaches_the_fused_matrices(tok):
    """The q|k|v and gate|up matrices are views' bases: an in-place weight update must change the decode."""
    old, new = tiny_model(len(tok), kind="qwen2", seed=21), tiny_model(len(tok), kind="qwen2", seed=22)
    prompts = prompts_of(tok)
    sp = SamplingParams(greedy=True, max_new_tokens=12)
    fast = StaticRollout(old, tok, eos_token_ids=[], max_model_len=64)
    before = fast.generate(prompts, sp)
    fast.update_weights(new.state_dict())
    after = fast.generate(prompts, sp)
    assert after == HFRollout(new, tok, eos_token_ids=[]).generate(prompts, sp)
    assert after != before


def test_rows_rounded_up_to_a_power_of_two_give_the_same_outputs(tok):
    model = tiny_model(len(tok), seed=23)
    prompts = prompts_of(tok)  # 5 rows -> 8 with filler rows
    sp = SamplingParams(greedy=True, max_new_tokens=10, return_logprobs=True)
    plain = StaticRollout(model, tok, eos_token_ids=[], max_model_len=64).generate(prompts, sp)
    padded = StaticRollout(model, tok, eos_token_ids=[], max_model_len=64)
    padded.round_rows = True
    out = padded.generate(prompts, sp)
    assert len(out) == len(prompts)
    assert [o.token_ids for o in out] == [o.token_ids for o in plain]


@pytest.mark.parametrize("kind", ["qwen2", "gemma3"])  # qwen2: q/k/v biases go through the fused path
def test_compiled_layers_give_the_eager_tokens(tok, kind):
    """rollout.compile=true: the torch.compile'd per-layer functions decode as the eager ones."""
    model = tiny_model(len(tok), kind=kind, seed=14)
    prompts = prompts_of(tok)
    sp = SamplingParams(max_new_tokens=12, seed=3, return_logprobs=True)  # one rule: each compiles (CPU: slow)
    eager = StaticRollout(model, tok, eos_token_ids=[], max_model_len=64, chunk=4)
    fused = StaticRollout(model, tok, eos_token_ids=[], max_model_len=64, chunk=4, compile=True)
    assert fused._pre is not eager._pre  # really compiled
    ref, out = eager.generate(prompts, sp), fused.generate(prompts, sp)
    for r, o in zip(ref, out):
        assert o.token_ids == r.token_ids
        assert o.logprobs == pytest.approx(r.logprobs, abs=1e-4)


def test_gemma3_sliding_window_decodes_as_the_full_forward(tok):
    """Gemma 3 (norms scaled by 1 + w, q/k norms, GELU, two rope bases, window 6 on every other layer):
    greedy tokens and log-probs equal a loop that recomputes the whole sequence with transformers'
    own forward, for prompts longer than the window and generations well past it."""
    model = tiny_model(len(tok), kind="gemma3", seed=16)
    with torch.no_grad():  # random init leaves Gemma's norm weights at 0 (scale 1): make them matter
        for name, p in model.named_parameters():
            if "norm" in name:
                p.normal_(0, 0.3, generator=torch.Generator().manual_seed(len(name)))
    prompts = [p for p in prompts_of(tok) if len(p) > 6]
    assert len(prompts) >= 2 and len({len(p) for p in prompts}) > 1  # padding between rows
    sp = SamplingParams(greedy=True, max_new_tokens=20, return_logprobs=True)
    fast = StaticRollout(model, tok, eos_token_ids=[], max_model_len=64, chunk=4)
    fast.bucket = 16
    for p, o in zip(prompts, fast.generate(prompts, sp)):
        want, lps = naive_greedy(model, p, 20)
        assert o.token_ids == want
        assert o.logprobs == pytest.approx(lps, abs=1e-4)
    narrow = tiny_model(len(tok), kind="gemma3", seed=16, sliding_window=64)  # the same model without a window
    narrow.load_state_dict(model.state_dict())
    assert any(naive_greedy(narrow, p, 20)[0] != naive_greedy(model, p, 20)[0] for p in prompts), \
        "the window changed nothing: the test would not see a missing mask"


def test_check_rollout_backends_script(tok, tmp_path, capsys):
    """tools/check/check_rollout_backends.py on a saved tiny Gemma 3 checkpoint: both backends agree."""
    import pandas as pd

    from tools.check import check_rollout_backends as mod

    model = tiny_model(len(tok), kind="gemma3", seed=17)
    model.save_pretrained(tmp_path / "ckpt")
    tok.save_pretrained(tmp_path / "ckpt")
    texts = ("Who discovered Bririum?", "10:30", "Which river runs through the capital of Gordesh?")
    pd.DataFrame({"prompt": [[{"role": "user", "content": t}] for t in texts]}).to_parquet(tmp_path / "data.parquet")
    assert mod.main(["--model", str(tmp_path / "ckpt"), "--data", str(tmp_path / "data.parquet"),
                     "--new-tokens", "12", "--hf-batch", "2"]) == 0
    out = capsys.readouterr().out
    assert "3 of 3 prompts decoded identically" in out
    assert "hf: first tokens equal to hf_static per chunk: 2/2, 1/1" in out
    assert "hf_no_cudnn: first tokens equal to hf_static per chunk: 2/2, 1/1" in out
