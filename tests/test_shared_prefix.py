"""actor.share_prompt_prefix: the prompt prefix a micro-batch shares runs once and each row's rest attends to its
KV cache; log-probs, entropies, values, losses and gradients must equal every row computing its own."""
import pytest
import torch

from ragged import ragged_batch
from tools.bench import bench_shared_prefix
from verl.workers.actor import ActorWorker
from verl.workers.config import worker_config
from verl.workers.critic import CriticWorker
from verl.workers.micro_batch import response_logit_index, split_shared_prefix

V = 80
LLAMA = dict(model_type="llama", vocab_size=V, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
             num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64, tie_word_embeddings=True)
PROMPT, RESP, SHARED = 12, 9, 5

pytestmark = pytest.mark.usefixtures("one_thread")


def shared_batch(seed: int, shared: int = SHARED):
    """Ragged rows (prompts of 7-12 tokens, responses with environment gaps) whose prompts open on `shared` equal
    tokens; the next prompt token differs between rows 0 and 1, so the shared run is exactly `shared` long."""
    data = ragged_batch(6, PROMPT, RESP, seed, vocab=(3, V), min_response=1)
    ids, attn = data.batch["input_ids"], data.batch["attention_mask"]
    attn[:, PROMPT - 7 : PROMPT] = 1
    for i in range(len(ids)):
        start = int((attn[i, :PROMPT] == 0).sum())
        ids[i, start : start + shared] = torch.arange(10, 10 + shared)
        ids[i, start + shared] = 20 + i
    data.batch["position_ids"] = (attn.cumsum(-1) - 1).clamp(min=0)
    data.batch["responses"] = ids[:, PROMPT:]
    return data


def workers(cls, role, **kw):
    out = []
    for share in (False, True):
        w = cls(worker_config(role, model=LLAMA, device="cpu", lr=1e-3, grad_clip=1e9, ppo_mini_batch_size=6,
                              ppo_micro_batch_size=3, share_prompt_prefix=share, **kw))
        w.init_model()
        out.append(w)
    return out


def grads(worker):
    return {n: p.grad.clone() for n, p in worker.model.named_parameters() if p.grad is not None}


def assert_same_grads(a, b):
    ga, gb = grads(a), grads(b)
    assert ga.keys() == gb.keys() and ga
    for name in ga:
        torch.testing.assert_close(gb[name], ga[name], atol=1e-6, rtol=1e-4, msg=lambda m: f"{name}: {m}")


def test_split_finds_the_shared_run_and_each_scoring_output():
    data = shared_batch(seed=0)
    ids, attn, pos = (data.batch[k] for k in ("input_ids", "attention_mask", "position_ids"))
    # every token but the shared run gets a code naming its row and column, to follow it through the split
    codes = torch.arange(ids.numel()).view(ids.shape) + 1000
    start = (attn[:, :PROMPT] == 0).sum(-1)
    shared = torch.arange(ids.shape[1])[None] - start[:, None]
    codes = torch.where((shared >= 0) & (shared < SHARED), ids, codes)
    split = split_shared_prefix(codes, attn, pos, RESP)
    assert split.prefix_ids.tolist() == [list(range(10, 10 + SHARED))]
    assert split.prefix_position_ids.tolist() == [list(range(SHARED))]
    for i in range(len(ids)):  # prefix + the row's real rest = the row's real tokens, at their positions
        rest = split.attention_mask[i, SHARED:].bool()
        assert split.attention_mask[i, :SHARED].all()
        assert codes[i][attn[i].bool()].tolist() == split.prefix_ids[0].tolist() + split.input_ids[i][rest].tolist()
        assert pos[i][attn[i].bool()][SHARED:].tolist() == split.position_ids[i][rest].tolist()
    index, real = response_logit_index(attn, RESP, packed=False)
    assert torch.equal(split.real, real)
    assert torch.equal(split.input_ids.flatten()[split.index], codes.flatten()[index])


def test_split_stops_at_the_first_difference_in_tokens_or_positions():
    data = shared_batch(seed=1)
    ids, attn, pos = (data.batch[k] for k in ("input_ids", "attention_mask", "position_ids"))
    assert split_shared_prefix(ids, attn, pos, RESP).prefix_ids.shape == (1, SHARED)
    start = int((attn[2, :PROMPT] == 0).sum())
    moved = pos.clone()
    moved[2, start + 3 :] += 1  # row 2's positions part from the others' after 3 tokens
    assert split_shared_prefix(ids, attn, moved, RESP).prefix_ids.shape == (1, 3)
    other = ids.clone()
    other[4, int((attn[4, :PROMPT] == 0).sum())] = 70  # row 4 opens differently: nothing is shared
    assert split_shared_prefix(other, attn, pos, RESP) is None


def test_actor_log_probs_update_and_gradients_equal_every_row_computing_its_own():
    data = shared_batch(seed=2)
    data.meta.update(temperature=0.8, calculate_entropy=True)
    plain, shared = workers(ActorWorker, "actor", use_kl_loss=True, kl_loss_coef=0.1, entropy_coef=0.01)
    out = [w.compute_log_prob(data) for w in (plain, shared)]
    for key in ("old_log_probs", "entropys"):
        torch.testing.assert_close(out[1].batch[key], out[0].batch[key], atol=1e-5, rtol=1e-5)
    data = data.union(out[0])
    data.batch["ref_log_prob"] = data.batch["old_log_probs"] + 0.05
    metrics = [w.update_actor(data) for w in (plain, shared)]
    for key in ("actor/pg_loss", "actor/entropy", "actor/kl_loss", "actor/grad_norm"):
        assert metrics[1][key] == pytest.approx(metrics[0][key], rel=1e-4, abs=1e-6), key
    assert_same_grads(plain, shared)


def test_critic_values_update_and_gradients_equal_every_row_computing_its_own():
    data = shared_batch(seed=3)
    data.batch["returns"] = torch.randn(6, RESP)
    plain, shared = workers(CriticWorker, "critic")
    values = [w.compute_values(data).batch["values"] for w in (plain, shared)]
    torch.testing.assert_close(values[1], values[0], atol=1e-5, rtol=1e-5)
    data.batch["values"] = values[0]
    losses = [w.update_critic(data)["critic/vf_loss"] for w in (plain, shared)]
    assert losses[1] == pytest.approx(losses[0], rel=1e-5)
    assert_same_grads(plain, shared)


@pytest.mark.parametrize("clash", [dict(use_remove_padding=True), dict(gradient_checkpointing=True),
                                   dict(logprob_chunk_size=None)])
def test_auto_turns_it_off_where_it_does_not_apply_and_true_says_why(clash):
    assert ActorWorker(worker_config(model=LLAMA, device="cpu")).config.actor.share_prompt_prefix == "auto"
    on = ActorWorker(worker_config(model=LLAMA, device="cpu"))
    on.init_model()
    assert on.share_prefix
    on.device = torch.device("cuda")  # auto stays off on a GPU (the small policy is launch-bound there)
    assert not on._share_prefix(on.model)
    auto = ActorWorker(worker_config(model=LLAMA, device="cpu", **clash))
    auto.init_model()
    assert not auto.share_prefix
    forced = ActorWorker(worker_config(model=LLAMA, device="cpu", share_prompt_prefix=True, **clash))
    with pytest.raises(ValueError, match="share_prompt_prefix=true does not combine with"):
        forced.init_model()


def test_a_sliding_window_model_is_left_alone_or_refused_by_name():
    spec = dict(LLAMA, model_type="qwen2", use_sliding_window=True, sliding_window=4, max_window_layers=0)
    auto = ActorWorker(worker_config(model=spec, device="cpu"))
    auto.init_model()
    assert not auto.share_prefix
    auto.compute_log_prob(shared_batch(seed=4))
    forced = ActorWorker(worker_config(model=spec, device="cpu", share_prompt_prefix=True))
    with pytest.raises(ValueError, match=r"qwen2's \['sliding_attention'\] layers"):
        forced.init_model()
    with pytest.raises(ValueError, match="must be auto | true | false"):
        ActorWorker(worker_config(model=LLAMA, device="cpu", share_prompt_prefix="yes")).init_model()


def test_benchmark_prints_both_ways_and_agrees(capsys, tmp_path):
    out = tmp_path / "b.json"
    bench_shared_prefix.main(["--batch", "4", "--micro", "2", "--prefix", "12", "--question", "4", "--response", "6",
                              "--reps", "1", "--out", str(out)])
    text = capsys.readouterr().out
    for name in ("log_prob", "values", "update_actor", "update_critic"):
        assert name in text
    import json

    figures = json.loads(out.read_text())
    assert figures["max_logprob_diff"] < 1e-4 and figures["max_value_diff"] < 1e-4
    assert all(p["every_row_s"] > 0 and p["shared_s"] > 0 for p in figures["passes"].values())
