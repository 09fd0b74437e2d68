"""The Triton decode attention (rollout.decode_attention=triton) against the matmul path, on CPU.

The kernels run in Triton's interpreter (TRITON_INTERPRET=1, set by conftest.py before triton is imported):
the same program, indexing and masks as on the GPU, executed with numpy. The GPU figures and the
log-prob check against a teacher-forced forward are tools/bench/bench_rollout.py's.
"""
import asyncio

import pytest
import torch

from conftest import interpreted_kernel, require_triton
from test_rollout_hf import naive_greedy, prompts_of
from tiny import tiny_model
from verl.workers.rollout import SamplingParams, build_rollout
from verl.workers.rollout.slot_rollout import SlotRollout
from verl.workers.rollout.static_rollout import StaticRollout, matmul_decode_attention, resolve_decode_attention

triton = require_triton()

pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.fixture(scope="module")
def kernel():
    return interpreted_kernel("verl.workers.rollout.triton_decode_attention")


def _reference(q, kc, vc, lengths, pos, width, col, span, scaling, window):
    """The matmul path with the -inf bias StaticRollout builds for it."""
    cols = torch.arange(span)
    allowed = (cols[None] < lengths[:, None]) | ((cols >= width) & (cols <= col))[None]  # (rows, span)
    if window is not None:
        col_pos = torch.where(cols < width, cols, lengths[:, None] + cols - width)
        allowed &= pos[:, None] - col_pos < window
    bias = torch.where(allowed, 0.0, float("-inf"))[:, None, None, :]
    return matmul_decode_attention(q, kc[:, :, :span], vc[:, :, :span], bias, scaling)


# (rows, query heads, kv heads, head dim, window): Qwen2.5-0.5B's 7 heads per kv head (padded to 16),
# 3B's 8, Gemma's 4 with one kv head and a sliding window, plain multi-head
@pytest.mark.parametrize("rows,heads,kv,D,window", [(3, 14, 2, 64, None), (2, 16, 2, 128, None),
                                                    (4, 4, 1, 64, 5), (2, 8, 8, 32, None)])
def test_kernel_equals_the_masked_matmul(kernel, rows, heads, kv, D, window):
    gen = torch.Generator().manual_seed(rows * heads)
    width, span, max_len = 37, 192, 200
    col = width + 100
    lengths = torch.randint(1, width + 1, (rows,), generator=gen)  # right-padded prompts of unequal length
    pos = lengths + (col - width)
    q = torch.randn(rows, heads, 1, D, generator=gen)
    kc, vc = torch.randn(2, rows, kv, max_len, D, generator=gen)
    ref = _reference(q, kc, vc, lengths, pos, width, col, span, 0.125, window)
    # NaN in the columns no row may attend (the padding after each prompt, the columns after `col`): the
    # kernel must not read them (the matmul path would: 0 x NaN)
    for r in range(rows):
        kc[r, :, lengths[r]:width] = vc[r, :, lengths[r]:width] = float("nan")
    kc[:, :, col + 1:] = vc[:, :, col + 1:] = float("nan")
    out = kernel.triton_decode_attention(q, kc, vc, lengths, pos, torch.tensor([width]), torch.tensor([col]), span,
                                         0.125, window)
    assert out.shape == (rows, heads, 1, D)
    torch.testing.assert_close(out, ref, atol=1e-5, rtol=1e-5)


def test_split_sizes_cover_the_span_and_spread_small_batches(kernel):
    for rows, kv, span in [(1, 1, 64), (2, 2, 1536), (128, 2, 1536), (256, 8, 4096), (8, 2, 130)]:
        split, n = kernel.splits_for(rows, kv, span)
        assert split % kernel.BLOCK_N == 0 and split * n >= span > split * (n - 1)
    assert kernel.splits_for(2, 2, 1536)[1] > kernel.splits_for(128, 2, 1536)[1]  # fewer rows: more splits


@pytest.mark.parametrize("kind", ["qwen2", "gemma3"])  # gemma3: sliding-window layers (window 6)
def test_static_rollout_decodes_the_same_tokens_with_the_kernel(kernel, tok, kind):
    model = tiny_model(len(tok), kind=kind, seed=21)
    prompts = prompts_of(tok)  # unequal lengths: padding columns between a prompt and the generated ones
    sp = SamplingParams(greedy=True, max_new_tokens=14, return_logprobs=True)
    opts = dict(eos_token_ids=[], max_model_len=64, chunk=4)
    ref = StaticRollout(model, tok, decode_attention="matmul", **opts).generate(prompts, sp)
    fast = StaticRollout(model, tok, decode_attention="triton", **opts)
    fast.bucket = 16  # several spans in one call
    for r, o in zip(ref, fast.generate(prompts, sp)):
        assert o.token_ids == r.token_ids
        assert o.logprobs == pytest.approx(r.logprobs, abs=1e-4)
    if kind == "gemma3":  # and the window matters here: the full forward with a window agrees too
        p = max(prompts, key=len)
        assert fast.generate([p], sp)[0].token_ids == naive_greedy(model, p, 14)[0]


def test_slot_rollout_decodes_the_same_tokens_with_the_kernel(kernel, tok):
    model = tiny_model(len(tok), kind="gemma3", seed=22)
    prompts = prompts_of(tok)[:3]
    sp = SamplingParams(greedy=True, max_new_tokens=10, return_logprobs=True)

    def run(choice):
        roll = SlotRollout(model, tok, eos_token_ids=[], max_model_len=64, max_batch_size=2, slot_chunk=3,
                           decode_attention=choice)
        roll.bucket = 16

        async def main():
            return await asyncio.gather(*(roll.engine.generate_one(p, sp) for p in prompts))
        return asyncio.run(main())

    for r, o in zip(run("matmul"), run("triton")):
        assert o.token_ids == r.token_ids
        assert o.logprobs == pytest.approx(r.logprobs, abs=1e-4)


def test_choice_of_decode_attention(tok):
    assert resolve_decode_attention("auto", torch.device("cpu")) == "matmul"
    assert resolve_decode_attention("auto", torch.device("cuda")) == "triton"  # triton imports here
    with pytest.raises(ValueError, match="rollout.decode_attention"):
        resolve_decode_attention("flash", torch.device("cpu"))
    roll = build_rollout({"name": "hf_static", "decode_attention": "triton"}, tiny_model(len(tok), seed=1), tok)
    assert roll.decode_attention == "triton"
