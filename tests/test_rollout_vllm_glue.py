"""The vLLM backend's glue, tested without vLLM (not installable here): sampling-param mapping,
output conversion, weight names, and VLLMRollout's call sequence against a recording stand-in
for the `vllm` module. No real vLLM engine runs in these tests."""
import importlib.util
import socket
import sys
import types
from types import SimpleNamespace as NS

import pytest
import torch
import torch.distributed as dist

from verl.workers.rollout import SamplingParams, build_rollout
from verl.workers.rollout.vllm_rollout import (
    VLLMRollout,
    find_inprocess_model,
    from_vllm_output,
    per_request_sampling_kwargs,
    state_dict_items_for_vllm,
    to_vllm_sampling_kwargs,
)


def test_sampling_kwargs_greedy_is_really_greedy():
    kw = to_vllm_sampling_kwargs(SamplingParams(greedy=True, temperature=1.0, top_p=0.9, top_k=20, seed=3))
    assert (kw["temperature"], kw["top_p"], kw["top_k"]) == (0.0, 1.0, -1)
    assert to_vllm_sampling_kwargs(SamplingParams(temperature=0.0))["temperature"] == 0.0


def test_sampling_kwargs_sampling_fields():
    kw = to_vllm_sampling_kwargs(SamplingParams(temperature=0.7, top_p=0.9, top_k=0, max_new_tokens=33,
                                                stop=("</search>", "</answer>"), seed=5, return_logprobs=True))
    assert kw["temperature"] == 0.7 and kw["top_p"] == 0.9
    assert kw["top_k"] == -1  # 0 and -1 both mean "off"; vLLM accepts -1 in every version
    assert kw["max_tokens"] == 33
    assert kw["stop"] == ["</search>", "</answer>"]
    assert kw["include_stop_str_in_output"] is True
    assert kw["logprobs"] == 0 and kw["seed"] == 5 and kw["n"] == 1
    plain = to_vllm_sampling_kwargs(SamplingParams(top_k=40, stop="</answer>"))
    assert plain["top_k"] == 40 and plain["logprobs"] is None and plain["stop"] == ["</answer>"]
    assert to_vllm_sampling_kwargs(SamplingParams())["stop"] is None
    with pytest.raises(ValueError, match="top_p"):
        to_vllm_sampling_kwargs(SamplingParams(top_p=1.5))


def test_per_request_seeds_differ_so_groups_do_not_collapse():
    kws = per_request_sampling_kwargs(SamplingParams(seed=100), 4)
    assert [k["seed"] for k in kws] == [100, 101, 102, 103]
    assert {k["temperature"] for k in kws} == {1.0}
    assert [k["seed"] for k in per_request_sampling_kwargs(SamplingParams(), 3)] == [None] * 3


def _request(token_ids, finish_reason, stop_reason=None, logprobs=None):
    out = NS(token_ids=token_ids, finish_reason=finish_reason, stop_reason=stop_reason, logprobs=logprobs, text="")
    return NS(request_id="r0", outputs=[out])


def test_from_vllm_output_finish_reasons():
    assert from_vllm_output(_request((4, 5), "length")).finish_reason == "length"
    stop = from_vllm_output(_request([4, 5, 9], "stop", "</search>"))
    assert stop.token_ids == [4, 5, 9] and stop.finish_reason == "stop" and stop.logprobs is None
    assert from_vllm_output(_request([4, 2], "stop", None)).finish_reason == "eos"
    assert from_vllm_output(_request([4, 7], "stop", 7)).finish_reason == "eos"  # an extra eos id
    with pytest.raises(RuntimeError, match="abort"):
        from_vllm_output(_request([4], "abort"))
    with pytest.raises(ValueError, match="no outputs"):
        from_vllm_output(NS(request_id="r1", outputs=[]))


def test_from_vllm_output_logprobs():
    lp = [{4: NS(logprob=-0.5, rank=1)}, {5: NS(logprob=-1.25, rank=3), 6: NS(logprob=-0.1, rank=1)}]
    out = from_vllm_output(_request([4, 5], "length", logprobs=lp))
    assert out.logprobs == [-0.5, -1.25]  # the sampled token's, not the top-ranked one's
    with pytest.raises(ValueError, match="2 tokens"):
        from_vllm_output(_request([4, 5], "length", logprobs=lp[:1]))
    with pytest.raises(ValueError, match="token 9"):
        from_vllm_output(_request([4, 9], "length", logprobs=lp))


def test_state_dict_items_strip_wrappers_and_stay_lazy():
    sd = {"_orig_mod._fsdp_wrapped_module.model.layers.0._checkpoint_wrapped_module.mlp.up_proj.weight": torch.ones(2),
          "module.lm_head.weight": torch.zeros(3, requires_grad=True)}
    items = state_dict_items_for_vllm(sd)
    assert not isinstance(items, (list, dict))  # a generator: tensors are made one at a time
    got = dict(items)
    assert sorted(got) == ["lm_head.weight", "model.layers.0.mlp.up_proj.weight"]
    assert not got["lm_head.weight"].requires_grad
    with pytest.raises(ValueError, match="both map to"):
        dict(state_dict_items_for_vllm({"_orig_mod.a": torch.ones(1), "a": torch.ones(1)}))


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_state_dict_items_materialise_a_real_dtensor():
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import Shard, distribute_tensor

    own_group = not dist.is_initialized()
    if own_group:
        dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{_free_port()}", rank=0, world_size=1)
    try:
        mesh = init_device_mesh("cpu", (dist.get_world_size(),))
        full = torch.arange(12.0).reshape(4, 3)
        sharded = distribute_tensor(full, mesh, [Shard(0)])
        (name, t), = state_dict_items_for_vllm({"_fsdp_wrapped_module.w": sharded})
        assert name == "w" and type(t) is torch.Tensor and torch.equal(t, full)
    finally:
        if own_group:
            dist.destroy_process_group()


def test_find_inprocess_model_paths():
    model = NS(load_weights=lambda weights: None)
    v1 = NS(llm_engine=NS(model_executor=NS(driver_worker=NS(worker=NS(model_runner=NS(model=model))))))
    v0 = NS(llm_engine=NS(model_executor=NS(driver_worker=NS(model_runner=NS(model=model)))))
    assert find_inprocess_model(v1) is model and find_inprocess_model(v0) is model
    assert find_inprocess_model(NS(llm_engine=NS(engine_core=NS()))) is None


# ---- VLLMRollout's call sequence, against a recording stand-in for the vllm module ---------

class _RecordingLLM:
    def __init__(self, inprocess: bool, **kwargs):
        self.kwargs, self.calls, self.loaded = kwargs, [], {}
        if inprocess:
            model = NS(load_weights=lambda weights: self.loaded.update(weights))
            self.llm_engine = NS(model_executor=NS(driver_worker=NS(worker=NS(model_runner=NS(model=model)))))

    def generate(self, requests, params, use_tqdm=True):
        self.calls.append(("generate", requests, params))
        return [_request(r["prompt_token_ids"][-1:] + [7], "stop", None) for r in requests]

    def collective_rpc(self, fn, args=()):
        self.calls.append(("collective_rpc",))
        worker = NS(model_runner=NS(model=NS(load_weights=lambda weights: self.loaded.update(weights))))
        return [fn(worker, *args)]

    def sleep(self, level):
        self.calls.append(("sleep", level))

    def wake_up(self, tags=None):
        self.calls.append(("wake_up", tags))

    def reset_prefix_cache(self):
        self.calls.append(("reset_prefix_cache",))


@pytest.fixture
def fake_vllm(monkeypatch):
    mod = types.ModuleType("vllm")
    mod.SamplingParams = lambda **kw: NS(**kw)
    mod.inprocess = True
    mod.LLM = lambda **kw: _RecordingLLM(mod.inprocess, **kw)
    monkeypatch.setitem(sys.modules, "vllm", mod)
    return mod


def test_vllm_rollout_generate_sleep_wake_and_weights(fake_vllm):
    roll = VLLMRollout("/models/policy", gpu_memory_utilization=0.4, seed=1)
    llm = roll.llm
    assert llm.kwargs["enable_sleep_mode"] is True and llm.kwargs["model"] == "/models/policy"
    outs = roll.generate([[1, 2], [3]], SamplingParams(greedy=True, max_new_tokens=4, stop=("</answer>",)))
    _, requests, params = llm.calls[-1]
    assert requests == [{"prompt_token_ids": [1, 2]}, {"prompt_token_ids": [3]}]
    assert [p.temperature for p in params] == [0.0, 0.0] and params[0].stop == ["</answer>"]
    assert [o.token_ids for o in outs] == [[2, 7], [3, 7]] and outs[0].finish_reason == "eos"
    # sleep -> update weights (wakes the weights only) -> wake (the KV cache) -> generate
    roll.sleep()
    with pytest.raises(RuntimeError, match="wake"):
        roll.generate([[1]], SamplingParams())
    roll.update_weights({"_orig_mod.model.embed.weight": torch.ones(2)})
    roll.wake()
    assert llm.calls[-4:] == [("sleep", 1), ("wake_up", ["weights"]), ("reset_prefix_cache",), ("wake_up", ["kv_cache"])]
    assert list(llm.loaded) == ["model.embed.weight"]
    roll.sleep()
    roll.wake()
    assert llm.calls[-1] == ("wake_up", None)  # both released: one plain wake_up


def test_vllm_rollout_weights_through_collective_rpc(fake_vllm):
    fake_vllm.inprocess = False  # the multiprocess engine: no model in this process
    roll = VLLMRollout("/models/policy", tensor_parallel_size=1)
    roll.update_weights({"module.lm_head.weight": torch.ones(2)})
    assert ("collective_rpc",) in roll.llm.calls and list(roll.llm.loaded) == ["lm_head.weight"]


def test_build_rollout_vllm_errors():
    with pytest.raises(ValueError, match="model_path"):
        build_rollout({"name": "vllm"})
    if importlib.util.find_spec("vllm") is None:
        with pytest.raises(ImportError, match="'hf' rollout backend"):
            build_rollout({"name": "vllm", "model_path": "/nonexistent"})
