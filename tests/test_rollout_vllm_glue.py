"""The vLLM backend's glue, tested without vLLM: sampling-param mapping, output conversion, weight
names and buckets, and VLLMRollout against a stand-in engine that obeys vLLM V1's rules (methods
called by name through collective_rpc, arguments msgpack-encoded: a function or a tensor is
refused; the worker extension mixed into the worker only without name clashes).
tests/test_rollout_vllm_real.py runs the same glue against the real `vllm` package where installed."""
import asyncio
import importlib.util
import socket
import sys
import types
from types import SimpleNamespace as NS

import pytest
import torch
import torch.distributed as dist

from verl.workers.rollout import SamplingParams, build_rollout
from verl.workers.rollout import vllm_rollout
from verl.workers.rollout.vllm_rollout import (
    WORKER_EXTENSION,
    VLLMRollout,
    check_vllm_version,
    from_vllm_output,
    pack_bucket,
    per_request_sampling_kwargs,
    plan_buckets,
    state_dict_items_for_vllm,
    to_vllm_sampling_kwargs,
)
from verl.workers.rollout.vllm_worker_ext import WeightSyncExtension, bucket_tensors, open_ipc_bucket


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
    assert kw["detokenize"] is True  # stop strings are matched on text
    assert to_vllm_sampling_kwargs(SamplingParams())["detokenize"] is False  # token ids only: no text work
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
    # vLLM 0.23+ stops a looping sequence with "repetition": an unfinished turn, as at the length limit
    rep = from_vllm_output(_request([4, 4, 4], "repetition"))
    assert rep.finish_reason == "length" and rep.token_ids == [4, 4, 4]
    with pytest.raises(RuntimeError, match="failed inside the engine"):
        from_vllm_output(_request([4], "error"))
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


def test_sampling_validation_matches_vllm_bounds():
    # vLLM 0.33 rejects these (tests/test_rollout_vllm_real.py checks the two agree on the real class)
    for bad in (dict(temperature=2.5), dict(temperature=float("nan")), dict(temperature=-0.1),
                dict(top_k=-2), dict(top_p=0.0), dict(max_new_tokens=0)):
        with pytest.raises(ValueError, match=next(iter(bad)).replace("max_new_tokens", "max_new")):
            SamplingParams(**bad).validate()
    for ok in (dict(temperature=2.0), dict(top_k=0), dict(top_k=-1), dict(temperature=0.0)):
        SamplingParams(**ok).validate()


def test_check_vllm_version():
    for ok in ("0.23.0", "0.27.1", "0.33.0"):
        check_vllm_version(ok)
    for bad in ("0.8.5", "0.22.1", "0.34.0", "1.0.0"):
        with pytest.raises(ImportError, match=bad.replace(".", r"\.")):
            check_vllm_version(bad)


def test_buckets_round_trip_mixed_dtypes():
    torch.manual_seed(0)
    items = [("a", torch.randn(3, 5)), ("b", torch.randn(7).to(torch.bfloat16)), ("c", torch.randn(2, 2, 3)),
             ("d", torch.randint(0, 9, (5,)))]
    buckets = list(plan_buckets(items, bucket_bytes=512))
    assert [[n for n, _ in b] for b in buckets] == [["a", "b"], ["c", "d"]]  # each entry aligned to 256 B
    for bucket in buckets:
        buf, entries = pack_bucket(bucket, torch.device("cpu"))
        assert buf.dtype == torch.uint8 and all(e.offset % 256 == 0 for e in entries)
        for (name, t), (name2, view) in zip(bucket, bucket_tensors(buf, entries)):
            assert name == name2 and view.dtype == t.dtype and torch.equal(view, t)
    # one tensor larger than the bucket size still goes, alone
    assert [len(b) for b in plan_buckets([("x", torch.zeros(100)), ("y", torch.zeros(1))], 64)] == [1, 1]


_SHARED: dict[int, torch.Tensor] = {}  # stands in for GPU memory shared between the two processes


def _rebuild_shared(key, *args):
    """Stands in for torch's rebuild_cuda_tensor: records the device index it was given."""
    _rebuild_shared.device_seen = args[5]
    return _SHARED[key]


def _fake_ipc_payload(buf, entries):
    import pickle
    _SHARED[id(buf)] = buf
    # same layout as reduce_tensor's: args[6] is the sender's device index
    return pickle.dumps((_rebuild_shared, (id(buf), 0, 0, 0, 0, 0, 3, b"handle"), entries))


def test_open_ipc_bucket_puts_the_receivers_device_index():
    buf, entries = pack_bucket([("w", torch.arange(4.0))], torch.device("cpu"))
    got, got_entries = open_ipc_bucket(_fake_ipc_payload(buf, entries), device_index=0)
    assert got is buf and got_entries == entries and _rebuild_shared.device_seen == 0  # not the sender's 3


# ---- VLLMRollout against a stand-in AsyncLLM that obeys vLLM V1's rules ----------------------

class _Worker:
    """The parts of vLLM's GPU worker the extension uses."""
    def __init__(self):
        self.loaded: dict[str, torch.Tensor] = {}
        model = NS(load_weights=lambda weights: self.loaded.update({n: t.clone() for n, t in weights}),
                   named_parameters=lambda: iter(self.loaded.items()))
        self.model_runner, self.model_config, self.device = NS(get_model=lambda: model), None, torch.device("cpu")

    def sleep(self, level=1): ...
    def wake_up(self, tags=None): ...


class _StandInAsyncLLM:
    def __init__(self, args):
        msgpack = pytest.importorskip("msgpack")
        self.args, self.calls, self._msgpack = args, [], msgpack
        ext = sys.modules[args.worker_extension_cls.rsplit(".", 1)[0]]
        ext_cls = getattr(ext, args.worker_extension_cls.rsplit(".", 1)[1])  # vLLM resolves the import path
        clash = [a for a in dir(ext_cls) if not a.startswith("__") and hasattr(_Worker, a)]
        assert not clash, f"worker extension clashes with the worker: {clash}"
        self.worker = type("ExtendedWorker", (_Worker, ext_cls), {})()
        self.finished_syncs = 0

    @classmethod
    def from_engine_args(cls, args):
        asyncio.get_running_loop()  # vLLM binds its output handler to the running loop
        return cls(args)

    def _encode(self, obj):
        def refuse(o):  # vLLM's enc_hook without VLLM_ALLOW_INSECURE_SERIALIZATION
            raise TypeError(f"Object of type {type(o)} is not serializable")
        return self._msgpack.unpackb(self._msgpack.packb(obj, default=refuse), raw=False)

    async def collective_rpc(self, method, timeout=None, args=(), kwargs=None):
        if not isinstance(method, str):
            raise TypeError("collective_rpc: a method name is required (a function cannot be encoded)")
        args = self._encode(list(args))
        self.calls.append(("rpc", method))
        if method == "finish_weight_sync":
            self.finished_syncs += 1
            return [None]
        return [getattr(self.worker, method)(*args, **(kwargs or {}))]

    async def generate(self, prompt, params, request_id):
        self.calls.append(("generate", request_id, tuple(prompt["prompt_token_ids"]), params.seed))
        await asyncio.sleep(0)
        out = NS(token_ids=[prompt["prompt_token_ids"][-1], 7], finish_reason="stop", stop_reason="</a>",
                 logprobs=[{prompt["prompt_token_ids"][-1]: NS(logprob=-0.5)}, {7: NS(logprob=-0.25)}]
                 if params.logprobs is not None else None)
        yield NS(request_id=request_id, outputs=[out], finished=True)

    async def sleep(self, level=1):
        self.calls.append(("sleep", level))

    async def wake_up(self, tags=None):
        self.calls.append(("wake_up", tags))

    async def reset_prefix_cache(self):
        self.calls.append(("reset_prefix_cache",))
        return True

    def shutdown(self):
        self.calls.append(("shutdown",))


@pytest.fixture
def fake_vllm(monkeypatch):
    vllm = types.ModuleType("vllm")
    vllm.__version__ = "0.23.0"
    vllm.SamplingParams = lambda **kw: NS(**kw)
    arg_utils = types.ModuleType("vllm.engine.arg_utils")
    arg_utils.AsyncEngineArgs = lambda **kw: NS(**kw)
    sp = types.ModuleType("vllm.sampling_params")
    sp.RequestOutputKind = NS(FINAL_ONLY="final_only")
    async_llm = types.ModuleType("vllm.v1.engine.async_llm")
    async_llm.AsyncLLM = _StandInAsyncLLM
    for name, mod in {"vllm": vllm, "vllm.engine": types.ModuleType("vllm.engine"), "vllm.engine.arg_utils": arg_utils,
                      "vllm.sampling_params": sp, "vllm.v1": types.ModuleType("vllm.v1"),
                      "vllm.v1.engine": types.ModuleType("vllm.v1.engine"), "vllm.v1.engine.async_llm": async_llm}.items():
        monkeypatch.setitem(sys.modules, name, mod)
    monkeypatch.setattr(vllm_rollout, "ipc_payload", _fake_ipc_payload)
    return vllm


def test_vllm_rollout_engine_args_and_version(fake_vllm):
    roll = VLLMRollout("/models/policy", device="cpu", gpu_memory_utilization=0.4, seed=1)
    a = roll.engine.args
    assert a.worker_extension_cls == WORKER_EXTENSION and a.enable_sleep_mode is True and a.model == "/models/policy"
    roll.shutdown()
    fake_vllm.__version__ = "0.8.5"
    with pytest.raises(ImportError, match="0.8.5"):
        VLLMRollout("/models/policy", device="cpu")


def test_vllm_rollout_generate_and_generate_one(fake_vllm):
    roll = VLLMRollout("/models/policy", device="cpu")
    outs = roll.generate([[1, 2], [3]], SamplingParams(temperature=1.0, seed=10, max_new_tokens=4, stop="</a>",
                                                        return_logprobs=True))
    assert [o.token_ids for o in outs] == [[2, 7], [3, 7]] and outs[0].finish_reason == "stop"
    assert outs[1].logprobs == [-0.5, -0.25]
    gens = [c for c in roll.engine.calls if c[0] == "generate"]
    assert sorted(c[3] for c in gens) == [10, 11]  # one seed per request: a group does not collapse

    async def episodes():  # called from another loop than the engine's, many in flight
        return await asyncio.gather(*(roll.generate_one([5, i], SamplingParams(seed=0, max_new_tokens=2))
                                      for i in range(4)))
    many = asyncio.run(episodes())
    assert [o.token_ids for o in many] == [[i, 7] for i in range(4)]
    seeds = [c[3] for c in roll.engine.calls if c[0] == "generate"][2:]
    assert len(set(seeds)) == 4
    roll.shutdown()


def test_vllm_rollout_sleep_sync_wake_order(fake_vllm):
    roll = VLLMRollout("/models/policy", device="cpu", bucket_mb=1)
    eng = roll.engine
    roll.sleep()
    assert roll.asleep and eng.calls[-1] == ("sleep", 1)
    with pytest.raises(RuntimeError, match="wake"):
        roll.generate([[1]], SamplingParams())
    sd = {"_orig_mod.model.embed.weight": torch.randn(300, 1024),  # 1.2 MB: a bucket alone
          "module.model.norm.weight": torch.randn(16).to(torch.bfloat16), "lm_head.weight": torch.randn(4, 4)}
    roll.update_weights(sd)
    assert not roll.asleep
    names = [c for c in eng.calls if c[0] != "generate"]
    assert names[1] == ("wake_up", ["weights"])  # weights first ...
    assert names[2:4] == [("rpc", "load_weight_bucket")] * 2 and names[4] == ("rpc", "finish_weight_sync")
    assert names[5:] == [("reset_prefix_cache",), ("wake_up", ["kv_cache"])]  # ... then the KV cache
    loaded = eng.worker.loaded
    assert sorted(loaded) == ["lm_head.weight", "model.embed.weight", "model.norm.weight"]
    assert torch.equal(loaded["model.norm.weight"], sd["module.model.norm.weight"])
    assert eng.finished_syncs == 1
    assert roll.weight_checksums(["lm_head.weight"]) == [[pytest.approx(float(sd["lm_head.weight"].double().sum()))]]
    roll.shutdown()


def test_stand_in_refuses_what_vllm_refuses(fake_vllm):
    # the old glue sent a Python function and CPU tensors: vLLM V1's encoder refuses both
    roll = VLLMRollout("/models/policy", device="cpu")
    with pytest.raises(TypeError):
        roll._run(roll.engine.collective_rpc(lambda worker: None))
    with pytest.raises(TypeError, match="not serializable"):
        roll._run(roll.engine.collective_rpc("load_weight_bucket", args=(torch.ones(2),)))
    roll.shutdown()


def test_sleep_level_2_needs_a_sync_to_wake(fake_vllm):
    roll = VLLMRollout("/models/policy", device="cpu", sleep_level=2)
    roll.sleep()
    with pytest.raises(RuntimeError, match="update_weights"):
        roll.wake()
    roll.update_weights({"w": torch.ones(2)})
    assert not roll.asleep
    roll.shutdown()


def test_build_rollout_vllm_errors():
    with pytest.raises(ValueError, match="model_path"):
        build_rollout({"name": "vllm"})
    if importlib.util.find_spec("vllm") is None:
        with pytest.raises(ImportError, match="rollout.name=hf"):
            build_rollout({"name": "vllm", "model_path": "/nonexistent"})
