"""LoRA in the actor (verl/workers/lora.py): gradients only in the adapters, the reference is the
base model, merged weights equal the adapter forward, rollouts after a sync decode the adapted model,
checkpoints hold the adapters only, the export is a merged HF model; packed, compiled and 2-process
FSDP2 paths agree with the plain one."""
import os

import pytest
import torch
from torch.distributed.checkpoint import FileSystemReader
from torch.distributed.tensor import DTensor
from transformers import AutoModelForCausalLM

from test_fsdp_workers import SPEC, make_batch
from test_rollout_hf import naive_greedy
from tiny import tiny_tokenizer
from verl.workers.actor import ActorWorker
from verl.workers.config import worker_config
from verl.workers.critic import CriticWorker
from verl.workers.fsdp import CheckpointError
from verl.workers.lora import LoraConfig, LoraLinear, adapters_disabled, apply_lora
from verl.workers.model_loader import load_model

LORA = LoraConfig(rank=4, alpha=8.0)


pytestmark = pytest.mark.usefixtures("one_thread")


def make_actor(lora=LORA, cls=ActorWorker, **kw):
    base = dict(model=SPEC, device="cpu", lr=1e-2, grad_clip=1e9, ppo_mini_batch_size=8, ppo_micro_batch_size=8,
                lora=lora if lora is not None else LoraConfig())
    w = cls(worker_config(**{**base, **kw}))
    w.init_model()
    return w


def trained_batch(worker, seed=0):
    data = make_batch(seed=seed)
    return data.union(worker.compute_log_prob(data))


def perturb_adapters(model, scale=0.3, seed=0):
    """Adapters as after a long run: B away from 0, so the adapted model decodes differently."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for m in model.modules():
            if isinstance(m, LoraLinear):
                m.lora_B.copy_(torch.randn(m.lora_B.shape, generator=g) * scale)


def test_gradients_and_optimizer_only_in_the_adapters():
    worker = make_actor()
    base = {k: v.clone() for k, v in worker.get_full_state_dict().items()}  # B = 0: merged == base
    worker.update_actor(trained_batch(worker))
    with_grad = {n for n, p in worker.model.named_parameters() if p.grad is not None}
    lora = {n for n, _ in worker.model.named_parameters() if ".lora_" in n}
    assert lora and with_grad == lora
    assert len(lora) == 2 * 7 * SPEC["num_hidden_layers"]  # all-linear: q k v o gate up down
    assert {id(p) for g in worker.optimizer.param_groups for p in g["params"]} == \
        {id(p) for n, p in worker.model.named_parameters() if n in lora}
    for name, p in worker.model.named_parameters():
        if ".lora_" not in name:
            assert torch.equal(p.detach(), base[name]), f"{name} moved"
    assert any(m.lora_B.abs().max() > 0 for m in worker.model.modules() if isinstance(m, LoraLinear))


def test_reference_is_the_base_model_and_merge_equals_the_adapter_forward():
    worker = make_actor(lora=LoraConfig(rank=4, alpha=8.0, target_modules=["q_proj", "v_proj", "down_proj"]))
    worker.update_actor(trained_batch(worker))
    perturb_adapters(worker.model)
    plain = make_actor(lora=None)  # same spec, same seed: the base weights
    data = make_batch(seed=4)
    ref = worker.compute_ref_log_prob(data).batch["ref_log_prob"]
    torch.testing.assert_close(ref, plain.compute_log_prob(data).batch["old_log_probs"], atol=1e-6, rtol=1e-6)
    adapted = worker.compute_log_prob(data).batch["old_log_probs"]
    assert (adapted - ref).abs().max() > 1e-2, "the adapters changed nothing: the test could not fail"

    merged = worker.get_full_state_dict()
    assert merged.keys() == plain.model.state_dict().keys()  # base names, no lora keys
    model = load_model(SPEC, role="actor")
    model.load_state_dict(merged)
    ids = data.batch["input_ids"]
    with torch.no_grad():
        want = worker.model(input_ids=ids).logits
        torch.testing.assert_close(model(input_ids=ids).logits, want, atol=1e-5, rtol=1e-5)
        with adapters_disabled(worker.model):
            torch.testing.assert_close(worker.model(input_ids=ids).logits, plain.model(input_ids=ids).logits)


@pytest.mark.parametrize("backend", ["hf", "hf_static"])
def test_rollout_after_sync_decodes_the_adapted_model(backend):
    """The failure veRL users hit: after a sync the rollout must sample from base + adapters."""
    from verl.protocol import DataProto
    from verl.workers.actor_rollout import ActorRolloutWorker
    from verl.workers.rollout import SamplingParams

    tok = tiny_tokenizer()
    spec = dict(SPEC, vocab_size=len(tok), hidden_size=64, num_attention_heads=4)
    worker = ActorRolloutWorker(worker_config(model=spec, device="cpu", lr=1e-2, tokenizer=tok, lora=LORA),
                                rollout={"name": backend, "max_batch_size": 4, "max_model_len": 64})
    worker.init_model()
    perturb_adapters(worker.model, scale=0.5)
    worker._stale = True
    worker.sync_rollout()
    prompts = [tok.encode(t, add_special_tokens=False) for t in ("Who discovered Bririum?", "10:30 in Gordesh")]
    request = DataProto(batch={}, non_tensor={"prompt_ids": _objects(prompts)},
                        meta={"sampling": SamplingParams(greedy=True, max_new_tokens=12)})
    out = [o.token_ids for o in worker.generate(request).non_tensor["gen_outputs"]]
    merged = load_model(spec, role="actor").eval()
    merged.load_state_dict(worker.get_full_state_dict())
    assert out == [naive_greedy(merged, p, 12)[0] for p in prompts]
    base = load_model(spec, role="actor").eval()
    assert out != [naive_greedy(base, p, 12)[0] for p in prompts], "adapters did not change the decode"


def _objects(items):
    import numpy as np

    arr = np.empty(len(items), dtype=object)
    arr[:] = items
    return arr


def test_checkpoint_holds_the_adapters_and_resumes(tmp_path):
    worker = make_actor()
    worker.update_actor(trained_batch(worker))
    worker.save_checkpoint(str(tmp_path / "ckpt"))
    full = make_actor(lora=None)
    full.save_checkpoint(str(tmp_path / "full"))
    saved = FileSystemReader(str(tmp_path / "ckpt" / "state")).read_metadata().state_dict_metadata
    weights = {k for k in saved if k.startswith("model.")}
    assert weights == {f"model.{n}" for n, p in worker.model.named_parameters() if ".lora_" in n}

    resumed = make_actor()
    perturb_adapters(resumed.model, seed=5)  # other adapters: the load must overwrite them
    resumed.load_checkpoint(str(tmp_path / "ckpt"))
    data = trained_batch(worker, seed=6)
    a, b = worker.update_actor(data), resumed.update_actor(data)
    assert a["actor/pg_loss"] == pytest.approx(b["actor/pg_loss"], rel=1e-5)
    assert a["actor/grad_norm"] == pytest.approx(b["actor/grad_norm"], rel=1e-4)  # optimizer state came back
    with pytest.raises(CheckpointError, match="LoRA adapters only"):
        full.load_checkpoint(str(tmp_path / "ckpt"))
    with pytest.raises(CheckpointError, match="full weights"):
        resumed.load_checkpoint(str(tmp_path / "full"))


def test_export_hf_merges_the_adapters(tmp_path):
    worker = make_actor()
    perturb_adapters(worker.model)
    worker.export_hf(str(tmp_path / "hf"))
    exported = AutoModelForCausalLM.from_pretrained(str(tmp_path / "hf"))
    ids = make_batch(seed=1).batch["input_ids"]
    with torch.no_grad():
        torch.testing.assert_close(exported(input_ids=ids).logits, worker.model(input_ids=ids).logits,
                                   atol=1e-5, rtol=1e-5)


def test_packed_path_with_adapters_equals_the_padded_path():
    """LoRA composes with use_remove_padding (packed rows, chunked head) and activation checkpointing (a
    frozen embedding feeds it inputs that need no grad): same log-probs, reference log-probs and adapter
    updates as the padded full-vocab path."""
    ref = make_actor(logprob_chunk_size=None)
    fast = make_actor(use_remove_padding=True, logprob_chunk_size=5, max_tokens_per_micro_batch=40,
                      gradient_checkpointing=True)
    for w in (ref, fast):
        perturb_adapters(w.model)
    data = make_batch(seed=2)
    lp_ref, lp_fast = (w.compute_log_prob(data).batch["old_log_probs"] for w in (ref, fast))
    torch.testing.assert_close(lp_fast, lp_ref, atol=1e-5, rtol=1e-5)
    ref_lp = fast.compute_ref_log_prob(data).batch["ref_log_prob"]
    torch.testing.assert_close(ref_lp, ref.compute_ref_log_prob(data).batch["ref_log_prob"], atol=1e-5, rtol=1e-5)
    data = data.union(ref.compute_log_prob(data))
    ref.update_actor(data)
    fast.update_actor(data)
    for (n, p), (_, q) in zip(ref.model.named_parameters(), fast.model.named_parameters()):
        if ".lora_" in n:
            torch.testing.assert_close(q.detach(), p.detach(), atol=1e-5, rtol=1e-4, msg=lambda m: f"{n}: {m}")


def test_adapter_layer_compiles_in_one_graph_and_the_switch_recompiles():
    """model.compile wraps decoder layers holding LoraLinear: dynamo must trace it without a graph break
    (fullgraph) and must not reuse the adapted graph once the adapters are switched off (the reference)."""
    torch._dynamo.reset()
    layer = LoraLinear.wrap(torch.nn.Linear(16, 8), rank=2, alpha=4.0, dropout=0.0)
    torch.nn.init.normal_(layer.lora_B)
    x = torch.randn(3, 5, 16, requires_grad=True)
    compiled = torch.compile(layer, backend="eager", fullgraph=True, dynamic=True)
    torch.testing.assert_close(compiled(x), layer(x))
    compiled(x).sum().backward()
    assert layer.lora_A.grad is not None and layer.lora_B.grad is not None
    with adapters_disabled(torch.nn.Sequential(layer)):
        torch.testing.assert_close(compiled(x), torch.nn.functional.linear(x, layer.weight, layer.bias))
    torch.testing.assert_close(compiled(x), layer(x))


def test_critic_with_adapters_trains_its_value_head_too():
    critic = CriticWorker(worker_config("critic", model=SPEC, device="cpu", lr=1e-2, grad_clip=1e9,
                                        ppo_mini_batch_size=8, ppo_micro_batch_size=8, lora=LORA))
    critic.init_model()
    trainable = {n for n, p in critic.model.named_parameters() if p.requires_grad}
    assert trainable and all(".lora_" in n or n.startswith("score.") for n in trainable)
    assert any(n.startswith("score.") for n in trainable)
    data = make_batch(seed=3)
    data = data.union(critic.compute_values(data))
    data.batch["returns"] = torch.randn(data.batch["values"].shape)
    critic.update_critic(data)
    assert all(p.grad is None for n, p in critic.model.named_parameters() if n not in trainable)


def test_bad_lora_config_names_the_field():
    with pytest.raises(ValueError, match="lora.rank"):
        LoraConfig(rank=-1)
    with pytest.raises(ValueError, match="qkv_proj"):
        apply_lora(load_model(SPEC), LoraConfig(rank=2, target_modules=["qkv_proj"]))


# ------------------------------------------------------------------ 2 processes (FSDP2 + gloo)
# Run inside tests/test_fsdp_workers.py's 2-process test (one spawn for both).
def lora_dist_steps(rank, out_dir):
    """On each of 2 ranks: a sharded LoRA actor's log-probs, update, reference, merged weights, checkpoint."""
    from verl.single_controller.spmd import SPMDWorkerGroup

    group = SPMDWorkerGroup(make_actor(use_remove_padding=True, logprob_chunk_size=5))
    assert any(isinstance(p, DTensor) for p in group.worker.model.parameters())  # really sharded
    data = make_batch(seed=8)
    data = data.union(group.compute_log_prob(data))
    metrics = group.update_actor(data)
    ref = group.compute_ref_log_prob(data)
    state = group.get_full_state_dict()
    group.save_checkpoint(os.path.join(out_dir, "lora_ckpt"))
    if rank == 0:
        torch.save({"metrics": metrics, "state": state, "ref": ref.batch["ref_log_prob"]},
                   os.path.join(out_dir, "lora_rank0.pt"))


def check_lora_dist_steps(tmp_path):
    """FSDP2 shards frozen base weights and trainable adapters in one unit: the 2-rank run equals one process."""
    two = torch.load(str(tmp_path / "lora_rank0.pt"), weights_only=False)
    one = make_actor(use_remove_padding=True, logprob_chunk_size=5)
    data = make_batch(seed=8)
    data = data.union(one.compute_log_prob(data))
    metrics = one.update_actor(data)
    for key in ("actor/pg_loss", "actor/grad_norm"):
        assert two["metrics"][key] == pytest.approx(metrics[key], rel=1e-4), key
    torch.testing.assert_close(two["ref"], one.compute_ref_log_prob(data).batch["ref_log_prob"], atol=1e-5, rtol=1e-5)
    state = one.get_full_state_dict()
    assert two["state"].keys() == state.keys()
    for k in state:
        torch.testing.assert_close(two["state"][k], state[k], atol=1e-5, rtol=1e-5)
    resumed = make_actor(use_remove_padding=True, logprob_chunk_size=5)  # 2-rank adapters into 1 process
    perturb_adapters(resumed.model, seed=3)
    resumed.load_checkpoint(str(tmp_path / "lora_ckpt"))
    for k, v in resumed.get_full_state_dict().items():
        torch.testing.assert_close(v, state[k], atol=1e-5, rtol=1e-5)


def test_bench_update_compares_lora_with_full_fine_tuning(tmp_path, capsys):
    """tools/bench/bench_update.py --lora-rank on the tiny Qwen3 shape: both runs finish on the same tokens;
    LoRA trains a fraction of the parameters and holds less training state (no base grads or Adam moments)."""
    import json

    from tools.bench import bench_update as bench

    result = bench.main(["--tiny", "--shape", "tiny-qwen3", "--lora-rank", "4", "--out", str(tmp_path / "b.json")])
    full, lora = result["runs"]
    assert (full["name"], lora["name"]) == ("full", "lora r4")
    assert "error" not in full and "error" not in lora
    assert lora["trainable_params"] < full["trainable_params"] / 4 and full["trainable_params"] == full["params"]
    assert result["ratio_train_state_gib"] < 0.6
    assert full["update_tokens_per_s"] > 0 and lora["update_tokens_per_s"] > 0
    assert json.loads((tmp_path / "b.json").read_text())["lora_rank"] == 4
    assert "train state GiB" in capsys.readouterr().out
