"""FSDP2 actor / critic workers: 2-process equivalence, log-probs, masking, PPO direction,
micro-batching, checkpoints and HF export, on a tiny random Llama on CPU."""
import os
import socket
import time

import pytest
import torch
import torch.multiprocessing as mp
from torch.distributed.tensor import DTensor
from transformers import AutoModelForCausalLM, AutoTokenizer

from ragged import ragged_batch
from tiny import tiny_tokenizer
from verl.protocol import DataProto
from verl.single_controller.base import collect, split_args
from verl.workers.actor import ActorWorker
from verl.workers.config import worker_config
from verl.workers.critic import CriticWorker
from verl.workers.fsdp import CheckpointError, full_state_dict
from verl.workers.micro_batch import make_micro_batches, trim_padding
from verl.workers.model_loader import ValueHeadModel, load_model

V = 96
SPEC = dict(model_type="llama", vocab_size=V, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
            num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=128)


pytestmark = pytest.mark.usefixtures("one_thread")


def make_batch(n=8, prompt_len=6, resp_len=8, seed=0, vocab=(3, V)):
    """Left-padded prompts, right-padded responses of 3 or more tokens with an <information> gap (response_mask 0)."""
    return ragged_batch(n, prompt_len, resp_len, seed, vocab, min_response=3)


def actor_config(**kw):
    base = dict(model=SPEC, device="cpu", lr=1e-3, weight_decay=0.01, grad_clip=1e9, ppo_mini_batch_size=8, ppo_micro_batch_size=8)
    base.update(kw)
    return worker_config(**base)


def make_actor(**kw):
    w = ActorWorker(actor_config(**kw))
    w.init_model()
    return w


def with_old_log_probs(worker, data):
    return data.union(worker.compute_log_prob(data))


def grads_of(worker):
    out = {}
    for name, p in worker.model.named_parameters():
        g = p.grad.full_tensor() if isinstance(p.grad, DTensor) else p.grad
        out[name] = g.detach().clone()
    return out


def flat(tensors: dict) -> torch.Tensor:
    return torch.cat([tensors[k].flatten() for k in sorted(tensors)])


def assert_same_weights(a: dict, b: dict, atol=1e-6):
    assert a.keys() == b.keys()
    for k in a:
        torch.testing.assert_close(a[k], b[k], atol=atol, rtol=1e-5, msg=lambda m: f"{k}: {m}")


# ---------------------------------------------------------------- (1) 2 processes
# Packed rows and small log-prob chunks, so the sharded run also covers padding removal and
# the head running inside the root module's forward (where FSDP2 gathers its weight).
DIST_CFG = dict(ppo_epochs=2, entropy_coef=0.01, use_kl_loss=True, kl_loss_coef=0.1, max_tokens_per_micro_batch=16,
                log_prob_max_tokens_per_micro_batch=40, use_remove_padding=True, logprob_chunk_size=5)


def dist_batch(seed=3):
    data = make_batch(n=8, seed=seed)
    attn = data.batch["attention_mask"]
    attn[4:, :4] = 0  # rank 1's rows are short: fewer micro-batches there
    data.batch["position_ids"] = (attn.cumsum(-1) - 1).clamp(min=0)
    g = torch.Generator().manual_seed(seed)
    data.batch["old_log_probs"] = torch.randn(8, 8, generator=g) * 0.1 - 4.0
    data.batch["ref_log_prob"] = data.batch["old_log_probs"] + 0.05 * torch.randn(8, 8, generator=g)
    return data


def _dist_main(rank, port, out_dir):
    from verl.single_controller.spmd import SPMDWorkerGroup
    import torch.distributed as dist

    os.environ.update(RANK=str(rank), WORLD_SIZE="2", LOCAL_RANK=str(rank), MASTER_ADDR="127.0.0.1",
                      MASTER_PORT=str(port))
    torch.set_num_threads(1)
    group = SPMDWorkerGroup(make_actor(**DIST_CFG))
    data = dist_batch()
    log_probs = group.compute_log_prob(data)
    metrics = group.update_actor(data)
    grads = grads_of(group.worker)
    state = group.get_full_state_dict()
    group.save_checkpoint(os.path.join(out_dir, "ckpt"))
    group.export_hf(os.path.join(out_dir, "hf"))
    next_metrics = group.update_actor(dist_batch(seed=12))
    if rank == 0:
        torch.save({"log_probs": log_probs.batch["old_log_probs"], "metrics": metrics, "grads": grads,
                    "state": state, "next_metrics": next_metrics}, os.path.join(out_dir, "rank0.pt"))
    from test_lora import lora_dist_steps  # in the same processes: a second spawn costs more than the steps

    lora_dist_steps(rank, out_dir)
    dist.destroy_process_group()


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_two_gloo_processes_match_one_process(tmp_path):
    """Also runs the LoRA actor's 2-process steps (tests/test_lora.py checks them against one process)."""
    shards = dist_batch().chunk(2)  # the ranks need different micro-batch counts: they must agree on one
    assert len(make_micro_batches(shards[0], 16)) != len(make_micro_batches(shards[1], 16))
    ranks = mp.spawn(_dist_main, args=(free_port(), str(tmp_path)), nprocs=2, join=False)
    deadline = time.monotonic() + 180
    while not ranks.join(timeout=2):  # raises if a rank failed
        if time.monotonic() > deadline:  # ranks whose collectives fall out of step wait forever
            for proc in ranks.processes:
                proc.kill()
            pytest.fail("the 2-process run hung")
    two = torch.load(str(tmp_path / "rank0.pt"), weights_only=False)

    one = make_actor(**DIST_CFG)
    data = dist_batch()
    log_probs = one.compute_log_prob(data).batch["old_log_probs"]
    metrics = one.update_actor(data)
    torch.testing.assert_close(two["log_probs"], log_probs, atol=1e-5, rtol=1e-5)
    for key in ("actor/pg_loss", "actor/entropy", "actor/kl_loss", "actor/grad_norm"):
        assert two["metrics"][key] == pytest.approx(metrics[key], rel=1e-4, abs=1e-6), key
    grads = grads_of(one)
    assert flat(two["grads"]).norm().item() == pytest.approx(flat(grads).norm().item(), rel=1e-5)
    for name in ("model.embed_tokens.weight", "model.layers.1.self_attn.q_proj.weight", "lm_head.weight"):
        torch.testing.assert_close(two["grads"][name], grads[name], atol=1e-6, rtol=1e-4)
    assert_same_weights(two["state"], full_state_dict(one.model), atol=1e-5)

    exported = AutoModelForCausalLM.from_pretrained(str(tmp_path / "hf"))
    assert_same_weights(exported.state_dict(), two["state"], atol=0)
    # A 2-rank checkpoint resumes in 1 process (resharded) and continues like the 2-rank run.
    resumed = make_actor(**DIST_CFG, seed=7)
    resumed.load_checkpoint(str(tmp_path / "ckpt"))
    next_metrics = resumed.update_actor(dist_batch(seed=12))
    for key in ("actor/pg_loss", "actor/grad_norm", "actor/lr"):
        assert two["next_metrics"][key] == pytest.approx(next_metrics[key], rel=1e-4, abs=1e-6), key
    from test_lora import check_lora_dist_steps

    check_lora_dist_steps(tmp_path)


# ------------------------------------------------------------- (2) log-probs
def test_compute_log_prob_matches_log_softmax():
    worker = make_actor(max_tokens_per_micro_batch=30)
    data = make_batch(n=6, seed=1)
    data.meta.update(temperature=0.7, calculate_entropy=True)
    out = worker.compute_log_prob(data)
    logp, ent = out.batch["old_log_probs"], out.batch["entropys"]
    assert logp.shape == (6, 8) and logp.grad_fn is None and not logp.requires_grad

    with torch.no_grad():
        logits = worker.model(input_ids=data.batch["input_ids"], attention_mask=data.batch["attention_mask"],
                              position_ids=data.batch["position_ids"]).logits
    logits = logits[:, 6 - 1 : -1] / 0.7  # (batch, response_len, vocab): position t predicts t+1
    ref = torch.log_softmax(logits, -1).gather(-1, data.batch["responses"][..., None]).squeeze(-1)
    ref_ent = -(torch.softmax(logits, -1) * torch.log_softmax(logits, -1)).sum(-1)
    real = data.batch["attention_mask"][:, 6:].bool()
    torch.testing.assert_close(logp[real], ref[real], atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(ent[real], ref_ent[real], atol=1e-5, rtol=1e-5)
    assert (logp[~real] == 0).all()


# ------------------------------------------------------ (3) masked positions
def test_update_ignores_masked_positions():
    clean = with_old_log_probs(make_actor(), make_batch(seed=2))
    dirty = DataProto.from_dict({k: v.clone() for k, v in clean.batch.items()}, meta=clean.meta)
    policy = dirty.batch["response_mask"].bool()
    dirty.batch["advantages"][~policy] = float("nan")
    dirty.batch["old_log_probs"][~policy] = float("-inf")
    pad = ~dirty.batch["attention_mask"].bool()
    dirty.batch["input_ids"][pad] = torch.randint(3, V, (int(pad.sum()),))
    dirty.batch["responses"] = dirty.batch["input_ids"][:, 6:]

    a, b = make_actor(), make_actor()
    metrics_a, metrics_b = a.update_actor(clean), b.update_actor(dirty)
    assert all(torch.isfinite(torch.tensor(v)) for v in metrics_b.values())
    assert metrics_a == pytest.approx(metrics_b, rel=1e-6, abs=1e-7)
    assert_same_weights(full_state_dict(a.model), full_state_dict(b.model))


# --------------------------------------------------------- (4) PPO direction
def test_ppo_update_moves_log_probs_with_advantage_sign():
    worker = make_actor(lr=3e-3, ppo_epochs=2)
    good = make_batch(n=4, seed=4, vocab=(3, 50))
    bad = make_batch(n=4, seed=5, vocab=(50, V))  # disjoint tokens, so the two groups do not pull on one row
    data = DataProto.concat([good, bad])
    sign = torch.tensor([1.0] * 4 + [-1.0] * 4)[:, None]
    data.batch["advantages"] = sign * data.batch["response_mask"]
    data = with_old_log_probs(worker, data)
    worker.update_actor(data)
    after = worker.compute_log_prob(data).batch["old_log_probs"]
    mask = data.batch["response_mask"].bool()
    change = ((after - data.batch["old_log_probs"]) * mask).sum(-1) / mask.sum(-1)  # (batch,)
    assert (change[:4] > 0).all() and (change[4:] < 0).all(), change


# -------------------------------------------------------- (5) micro-batching
@pytest.mark.parametrize("agg", ["token-mean", "seq-mean-token-mean"])
def test_dynamic_micro_batches_give_full_batch_gradients(agg):
    data = with_old_log_probs(make_actor(), make_batch(seed=6))
    plan = make_micro_batches(data, 18)
    assert len(plan) > 2 and len({len(p) for p in plan}) > 1  # really split, unevenly
    whole = make_actor(loss_agg_mode=agg)
    split = make_actor(loss_agg_mode=agg, max_tokens_per_micro_batch=18, gradient_checkpointing=True)
    metrics_whole, metrics_split = whole.update_actor(data), split.update_actor(data)
    assert metrics_split["actor/pg_loss"] == pytest.approx(metrics_whole["actor/pg_loss"], rel=1e-5)
    torch.testing.assert_close(flat(grads_of(split)), flat(grads_of(whole)), atol=1e-6, rtol=1e-4)
    assert_same_weights(full_state_dict(split.model), full_state_dict(whole.model), atol=1e-5)


def test_micro_batch_packing_and_trimming():
    data = make_batch(n=9, seed=7)
    lengths = data.batch["attention_mask"].sum(-1)
    plan = make_micro_batches(data, 30, min_num=4)
    assert len(plan) >= 4 and sorted(i for p in plan for i in p.tolist()) == list(range(9))
    assert all(int(lengths[p].sum()) <= 30 for p in plan)
    with pytest.raises(ValueError, match=r"row \d+ has \d+ real tokens"):
        make_micro_batches(data, 5)

    part = data[[1, 3]]
    trimmed, keep = trim_padding(part)
    attn = part.batch["attention_mask"]
    assert keep == int(attn[:, 6:].sum(-1).max())  # response tail of all-padding columns gone
    assert trimmed.batch["responses"].shape == (2, keep) and trimmed.batch["advantages"].shape == (2, keep)
    assert trimmed.batch["attention_mask"].sum() == attn.sum()  # no real token lost
    assert trimmed.batch["attention_mask"][:, 0].any() or trimmed.batch["input_ids"].shape[1] == keep + 1


# ------------------------------------------------------------ (6) checkpoints
def test_checkpoint_round_trip_and_damage(tmp_path):
    b1 = make_batch(seed=8)
    b2 = make_batch(seed=9)
    a = make_actor(warmup_steps=3)
    a.update_actor(with_old_log_probs(a, b1))
    path = str(tmp_path / "ckpt")
    a.save_checkpoint(path)
    expected_rand = torch.rand(3)

    b = make_actor(warmup_steps=3, seed=123)  # different init: everything must come from the checkpoint
    b.load_checkpoint(path)
    assert torch.equal(torch.rand(3), expected_rand)  # RNG restored
    data = with_old_log_probs(a, b2)
    for _ in range(2):  # two updates: the second one's lr comes from the restored scheduler
        metrics_a, metrics_b = a.update_actor(data), b.update_actor(data)
        assert metrics_a == pytest.approx(metrics_b, rel=1e-6, abs=1e-8)
    assert metrics_a["actor/lr"] == pytest.approx(1e-3)  # warmup over: 3rd step
    assert_same_weights(full_state_dict(a.model), full_state_dict(b.model))

    shard = next(os.path.join(r, f) for r, _, fs in os.walk(path) for f in fs if f.endswith(".distcp"))
    with open(shard, "r+b") as f:
        f.truncate(os.path.getsize(shard) // 2)
    with pytest.raises(CheckpointError, match=shard):
        b.load_checkpoint(path)
    os.remove(os.path.join(path, "COMPLETE.json"))
    with pytest.raises(CheckpointError, match=f"{path}.*COMPLETE.json"):
        b.load_checkpoint(path)


# --------------------------------------------------------------- (7) export
def test_export_hf_loads_with_identical_logits(tmp_path):
    tok = tiny_tokenizer()
    spec = dict(SPEC, vocab_size=len(tok))
    worker = make_actor(model=spec, tokenizer=tok)
    data = make_batch(seed=10, vocab=(3, len(tok)))
    worker.update_actor(with_old_log_probs(worker, data))
    worker.export_hf(str(tmp_path / "hf"))

    loaded = AutoModelForCausalLM.from_pretrained(str(tmp_path / "hf")).eval()
    ids = tok("<think>Ask a bigger model.</think>", return_tensors="pt").input_ids
    with torch.no_grad():
        worker.model.eval()
        torch.testing.assert_close(loaded(ids).logits, worker.model(ids).logits, atol=1e-6, rtol=1e-6)
    reloaded = AutoTokenizer.from_pretrained(str(tmp_path / "hf"))
    assert reloaded("10:30 <answer>").input_ids == tok("10:30 <answer>").input_ids
    from verl.utils.export_manifest import verify
    assert {"model.safetensors", "config.json"} <= set(verify(tmp_path / "hf")["files"])  # the manifest, checked


# -------------------------------------------------------------------- critic
def test_critic_values_and_update():
    critic = CriticWorker(worker_config("critic", model=SPEC, device="cpu", lr=3e-3, grad_clip=1e9, ppo_mini_batch_size=8,
                                       max_tokens_per_micro_batch=30))
    critic.init_model()
    data = make_batch(seed=11)
    values = critic.compute_values(data).batch["values"]
    with torch.no_grad():
        direct = critic.model(input_ids=data.batch["input_ids"], attention_mask=data.batch["attention_mask"],
                              position_ids=data.batch["position_ids"]).logits[:, 5:-1, 0]
    real = data.batch["attention_mask"][:, 6:].bool()
    torch.testing.assert_close(values[real], direct[real], atol=1e-5, rtol=1e-5)

    data.batch["returns"] = torch.ones(8, 8)
    losses = []
    for _ in range(4):
        data.batch["values"] = critic.compute_values(data).batch["values"]
        losses.append(critic.update_critic(data)["critic/vf_loss"])
    assert losses[-1] < 0.5 * losses[0], losses


def test_value_head_fallback_for_types_without_token_classification():
    spec = dict(model_type="opt", vocab_size=V, hidden_size=32, ffn_dim=64, num_hidden_layers=2,
                num_attention_heads=4, word_embed_proj_dim=32)
    critic = load_model(spec, role="critic")
    assert isinstance(critic, ValueHeadModel)
    assert critic(torch.randint(3, V, (2, 5))).logits.shape == (2, 5, 1)
    with pytest.raises(ValueError, match="model_type"):
        load_model({"hidden_size": 8})


def test_dispatch_split_and_collect():
    data = make_batch(n=6)
    parts = split_args("dp", 2, (data, 0.5), {})
    assert [len(p[0][0]) for p in parts] == [3, 3] and parts[1][0][1] == 0.5
    with pytest.raises(ValueError, match="7 rows"):
        split_args("dp", 2, (make_batch(n=7),), {})
    assert collect("dp", [{"loss": 1.0}, {"loss": 3.0}]) == {"loss": 2.0}
    # a *_min metric is the lowest rank's; one a rank did not report (no data there) comes from the others
    assert collect("dp", [{"loss": 1.0}, {"loss": 3.0, "p_min": 0.2}, {"loss": 2.0, "p_min": 0.1}]) == \
        {"loss": 2.0, "p_min": 0.1}
    merged = collect("dp", [p[0][0] for p in parts])
    assert torch.equal(merged.batch["input_ids"], data.batch["input_ids"])


def test_a_critic_from_a_causal_lm_says_its_value_head_is_new_in_one_line(tmp_path, capfd):
    """transformers' LOAD REPORT (score.weight MISSING) is expected for a new value head: one line instead;
    a backbone weight the checkpoint lacks is still a warning naming it."""
    lm = AutoModelForCausalLM.from_config(load_model(SPEC).config)
    lm.save_pretrained(tmp_path / "lm")
    critic = load_model(str(tmp_path / "lm"), role="critic")
    out, err = capfd.readouterr()
    assert "LOAD REPORT" not in out + err and "MISSING" not in out + err and "not sharded" not in out + err
    assert f"critic: a new value head (score.bias, score.weight) on the weights of {tmp_path / 'lm'}" in out
    assert "WARNING" not in out
    torch.testing.assert_close(critic.model.norm.weight, lm.model.norm.weight)

    state = {k: v for k, v in lm.state_dict().items() if k != "model.norm.weight"}
    lm.save_pretrained(tmp_path / "cut", state_dict=state)
    load_model(str(tmp_path / "cut"), role="critic")
    assert f"WARNING: critic: 1 backbone weights of {tmp_path / 'cut'} missing or unused: model.norm.weight" in \
        capfd.readouterr().out


def test_frozen_token_rows_hold_through_updates_and_travel_with_the_export(tmp_path):
    """model.config.frozen_token_ids: those embedding rows (tied head included) keep their start values
    through PPO updates with weight decay, the others move, and the exported config still names them."""
    frozen = [5, 6, 7, 40]
    worker = make_actor(model=dict(SPEC, tie_word_embeddings=True, frozen_token_ids=frozen), weight_decay=0.5)
    weight = worker.model.get_input_embeddings().weight
    before = weight.detach().clone()
    for seed in (10, 11):
        worker.update_actor(with_old_log_probs(worker, make_batch(seed=seed)))
    after = weight.detach()
    assert torch.equal(after[frozen], before[frozen])
    others = [i for i in range(V) if i not in frozen]
    assert (after[others] - before[others]).abs().amax(-1).gt(0).float().mean() > 0.9  # decay alone moves them
    worker.export_hf(str(tmp_path / "hf"))
    loaded = AutoModelForCausalLM.from_pretrained(str(tmp_path / "hf"))
    assert loaded.config.frozen_token_ids == frozen


def test_frozen_token_ids_out_of_range_are_named():
    with pytest.raises(ValueError, match="frozen_token_ids"):
        make_actor(model=dict(SPEC, frozen_token_ids=[V + 3]))
