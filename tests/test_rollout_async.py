"""The async rollout interface: as_async over a batch backend (HFRollout on a tiny model)."""
import asyncio
import threading

import pytest

from test_rollout_hf import prompts_of
from tiny import tiny_model
from verl.workers.rollout.base import AsyncRolloutBackend, BatchedAsync, GenOutput, SamplingParams, as_async
from verl.workers.rollout.hf_rollout import HFRollout


pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.fixture(scope="module")
def hf(tok):
    return HFRollout(tiny_model(len(tok), seed=3), tok, eos_token_ids=[])


def test_as_async_gathers_waiting_requests_into_one_batch_call(tok, hf):
    prompts = prompts_of(tok)
    sp = SamplingParams(greedy=True, max_new_tokens=8, return_logprobs=True)
    ref = hf.generate(prompts, sp)
    engine = as_async(hf)
    assert isinstance(engine, AsyncRolloutBackend) and not isinstance(hf, AsyncRolloutBackend)

    async def main():
        return await asyncio.gather(*(engine.generate_one(p, sp) for p in prompts))

    outs = asyncio.run(main())
    assert engine.batch_sizes == [len(prompts)]  # all were waiting: one call
    for r, o in zip(ref, outs):
        assert o.token_ids == r.token_ids and o.logprobs == pytest.approx(r.logprobs, abs=1e-5)
    assert as_async(engine) is engine  # an async backend is used as it is


def test_a_request_arriving_mid_batch_goes_in_the_next_call_without_waiting():
    started, release = threading.Event(), threading.Event()
    seen = []

    def generate(prompts, sampling):  # a batch engine that holds its first call until told
        seen.append([p[0] for p in prompts])
        if len(seen) == 1:
            started.set()
            release.wait(5)

        return [GenOutput([p[0] + 100], "length") for p in prompts]

    engine = BatchedAsync(generate)
    sp = SamplingParams(max_new_tokens=1)
    other = SamplingParams(max_new_tokens=2)

    async def main():
        first = [asyncio.create_task(engine.generate_one([i], sp)) for i in (1, 2)]
        await asyncio.to_thread(started.wait, 5)
        late = [asyncio.create_task(engine.generate_one([3], sp)),
                asyncio.create_task(engine.generate_one([4], other)),
                asyncio.create_task(engine.generate_one([5], sp))]
        await asyncio.sleep(0.05)
        release.set()
        return [(await t).token_ids for t in first + late]

    outs = asyncio.run(main())
    assert outs == [[101], [102], [103], [104], [105]]
    # the two late requests with equal sampling share a call; the other sampling gets its own
    assert seen == [[1, 2], [3, 5], [4]]


def test_a_failing_batch_call_reaches_every_waiting_episode_and_the_next_call_runs():
    calls = []

    def generate(prompts, sampling):
        calls.append(len(prompts))
        if len(calls) == 1:
            raise RuntimeError("engine died")

        return [GenOutput([7], "length") for _ in prompts]

    engine = as_async(generate)
    sp = SamplingParams(max_new_tokens=1)

    async def main():
        res = await asyncio.gather(*(engine.generate_one([1], sp) for _ in range(3)), return_exceptions=True)
        again = await engine.generate_one([1], sp)
        return res, again

    res, again = asyncio.run(main())
    assert all(isinstance(r, RuntimeError) and "engine died" in str(r) for r in res)
    assert again.token_ids == [7] and calls == [3, 1]


def test_as_async_refuses_what_cannot_generate():
    with pytest.raises(TypeError, match="generate"):
        as_async(object())
    with pytest.raises(ValueError, match="max_batch"):
        BatchedAsync(lambda p, s: [], max_batch=0)
