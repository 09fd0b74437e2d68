"""Ragged batches for the workers' tests (left-padded prompts, right-padded responses, an environment
gap in every other row), and the check that the actor's packed path matches its padded one on them."""
import torch

from verl.protocol import DataProto
from verl.workers.actor import ActorWorker
from verl.workers.config import worker_config


def ragged_batch(n: int, prompt_len: int, resp_len: int, seed: int, vocab: tuple[int, int],
                 min_response: int) -> DataProto:
    """Rows of random tokens in [vocab): prompts of 2..prompt_len, responses of min_response..resp_len tokens."""
    g = torch.Generator().manual_seed(seed)
    attn = torch.ones(n, prompt_len + resp_len, dtype=torch.long)
    for i in range(n):
        attn[i, : int(torch.randint(0, prompt_len - 1, (1,), generator=g))] = 0
        attn[i, prompt_len + int(torch.randint(min_response, resp_len + 1, (1,), generator=g)) :] = 0
    ids = torch.randint(vocab[0], vocab[1], attn.shape, generator=g) * attn
    response_mask = attn[:, prompt_len:].clone()
    response_mask[::2, 1:3] = 0  # environment tokens: attended, not trained
    return DataProto.from_dict({
        "input_ids": ids, "attention_mask": attn, "position_ids": (attn.cumsum(-1) - 1).clamp(min=0),
        "responses": ids[:, prompt_len:], "response_mask": response_mask,
        "advantages": torch.randn(n, resp_len, generator=g) * response_mask,
    }, meta={"temperature": 1.0})


def packed_matches_padded(spec: dict, data: DataProto, **cfg) -> tuple[ActorWorker, ActorWorker, DataProto]:
    """Two actors on `spec` (vocab 80: the batch's tokens): log-probs and entropies of the packed rows +
    chunked head (use_remove_padding) must equal the padded full-vocab path's; returns the padded
    actor, the packed one, and `data` with the padded path's log-probs."""
    def actor(**kw):
        w = ActorWorker(worker_config(model=spec, device="cpu", lr=1e-3, ppo_mini_batch_size=6, ppo_micro_batch_size=6,
                                      **cfg, **kw))
        w.init_model()
        return w

    data.meta["calculate_entropy"] = True
    ref = actor(logprob_chunk_size=None)
    fast = actor(logprob_chunk_size=4, use_remove_padding=True, log_prob_max_tokens_per_micro_batch=200)
    out_ref, out_fast = ref.compute_log_prob(data), fast.compute_log_prob(data)
    for key in ("old_log_probs", "entropys"):
        torch.testing.assert_close(out_fast.batch[key], out_ref.batch[key], atol=1e-5, rtol=1e-5)
    return ref, fast, data.union(out_ref)
