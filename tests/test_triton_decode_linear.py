"""The split-K decode GEMM (rollout.decode_linear=triton) against F.linear, on CPU in Triton's interpreter
(TRITON_INTERPRET=1, set by conftest.py): the same program, slices, masks and partial sums as on the GPU.
Its speed is tools/bench/bench_decode_gemm.py's, on a GPU."""
import pytest
import torch
import torch.nn.functional as F

from conftest import interpreted_kernel, require_triton
from test_rollout_hf import prompts_of
from tiny import tiny_model
from verl.workers.rollout import SamplingParams, build_rollout

triton = require_triton()

pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.fixture(scope="module")
def kernel():
    return interpreted_kernel("verl.workers.rollout.triton_decode_linear")


# (rows, in, out, bias, target programs): several slices with a ragged last one, one slice (the direct path),
# rows that are not a power of two, out features not a multiple of the column block
@pytest.mark.parametrize("M,K,N,bias,target", [(8, 320, 96, True, 64), (5, 200, 70, False, 64),
                                               (3, 128, 32, True, 1), (16, 64, 160, False, 8)])
def test_equals_f_linear(kernel, M, K, N, bias, target):
    gen = torch.Generator().manual_seed(M * K + N)
    x, w = torch.randn(M, K, generator=gen), torch.randn(N, K, generator=gen)
    b = torch.randn(N, generator=gen) if bias else None
    out = kernel.linear(x, w, b, block_n=32, block_k=64, target=target)
    torch.testing.assert_close(out, F.linear(x, w, b), atol=1e-4, rtol=1e-4)


def test_the_plan_reaches_its_target_and_covers_k(kernel):
    for M, N, K in [(128, 2560, 2048), (128, 2048, 11008), (128, 22016, 2048), (4, 1152, 896)]:
        block_m, k_split = kernel.plan(M, N, K)
        splits = -(-K // k_split)
        assert k_split % kernel.BLOCK_K == 0 and k_split * splits >= K > k_split * (splits - 1)
        programs = -(-N // kernel.BLOCK_N) * splits * -(-M // block_m)
        assert programs >= min(kernel.TARGET_PROGRAMS // 2, -(-N // kernel.BLOCK_N) * -(-K // kernel.BLOCK_K))
    assert kernel.plan(128, 2560, 2048)[1] < kernel.plan(128, 22016, 2048)[1]  # fewer columns: more slices


def test_the_custom_op_keeps_leading_dims_and_hands_long_inputs_to_f_linear(kernel):
    gen = torch.Generator().manual_seed(3)
    w, b = torch.randn(48, 64, generator=gen), torch.randn(48, generator=gen)
    x = torch.randn(4, 1, 64, generator=gen)                      # a decode step: (rows, 1, hidden)
    out = torch.ops.verl.decode_linear(x, w, b)
    assert out.shape == (4, 1, 48)
    torch.testing.assert_close(out, F.linear(x, w, b), atol=1e-4, rtol=1e-4)
    long = torch.randn(2, kernel.MAX_ROWS, 64, generator=gen)    # a prefill chunk
    torch.testing.assert_close(torch.ops.verl.decode_linear(long, w, None), F.linear(long, w), atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("kind", ["qwen2", "gemma3"])
def test_static_rollout_decodes_the_same_tokens_with_the_kernel(kernel, tok, kind, monkeypatch):
    model = tiny_model(len(tok), kind=kind, seed=22)
    prompts = prompts_of(tok)
    sp = SamplingParams(greedy=True, max_new_tokens=12, return_logprobs=True)
    opts = {"name": "hf_static", "max_model_len": 64, "decode_attention": "matmul"}
    ref = build_rollout(opts, model, tok).generate(prompts, sp)
    fast = build_rollout({**opts, "decode_linear": "triton"}, model, tok)
    calls = []
    real = kernel.linear
    monkeypatch.setattr(kernel, "linear", lambda *a, **k: calls.append(1) or real(*a, **k))
    outs = fast.generate(prompts, sp)
    assert len(calls) >= 4 * model.config.num_hidden_layers  # q|k|v, o, gate|up, down of every layer, each step
    for r, o in zip(ref, outs):
        assert o.token_ids == r.token_ids
        assert o.logprobs == pytest.approx(r.logprobs, abs=1e-4)
    with pytest.raises(ValueError, match="rollout.decode_linear"):
        build_rollout({**opts, "decode_linear": "cublas"}, model, tok)
