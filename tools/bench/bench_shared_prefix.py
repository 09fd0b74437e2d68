"""The prompt prefix computed once per micro-batch (actor.share_prompt_prefix) against every row computing its own,
side by side in one run: the actor's log-prob pass and update, the critic's values and update, on one model and
one batch whose prompts open with the same text (the instruction and pool listing of the card recipe).

    python -m tools.bench.bench_shared_prefix                     # the embedded policy's shape, random weights
    python -m tools.bench.bench_shared_prefix --model OUT/sft     # a trained checkpoint (train.sh's SFT stage)
    python -m tools.bench.bench_shared_prefix --device cuda --model '{"model_type": "qwen2", "hidden_size": 896, ...}'

Prints each pass's seconds both ways, their ratio, and the largest difference of the log-probs and values.
"""
from __future__ import annotations

import argparse
import json
import time

import torch

from verl.protocol import DataProto
from verl.workers.actor import ActorWorker
from verl.workers.config import worker_config
from verl.workers.critic import CriticWorker

# The embedded policy (train.sh's stage 3 builds it at this shape)
EMBEDDED = dict(model_type="llama", vocab_size=4214, hidden_size=128, intermediate_size=384, num_hidden_layers=2,
                num_attention_heads=4, num_key_value_heads=4, head_dim=32, max_position_embeddings=1024,
                tie_word_embeddings=True)


def make_batch(n: int, prefix: int, question: int, response: int, vocab: int, seed: int) -> DataProto:
    """n rows: one shared prefix of `prefix` tokens, then question / response lengths drawn from [half, full]."""
    g = torch.Generator().manual_seed(seed)
    shared = torch.randint(3, vocab, (prefix,), generator=g)
    prompt_len, ids = prefix + question, torch.zeros(n, prefix + question + response, dtype=torch.long)
    attn = torch.zeros_like(ids)
    for i in range(n):
        q = int(torch.randint(question // 2, question + 1, (1,), generator=g))
        r = int(torch.randint(response // 2, response + 1, (1,), generator=g))
        row = torch.cat([shared, torch.randint(3, vocab, (q,), generator=g)])
        ids[i, prompt_len - len(row) : prompt_len] = row
        ids[i, prompt_len : prompt_len + r] = torch.randint(3, vocab, (r,), generator=g)
        attn[i, prompt_len - len(row) : prompt_len + r] = 1
    response_mask = attn[:, prompt_len:].clone()
    return DataProto.from_dict({
        "input_ids": ids, "attention_mask": attn, "position_ids": (attn.cumsum(-1) - 1).clamp(min=0),
        "responses": ids[:, prompt_len:], "response_mask": response_mask,
        "advantages": torch.randn(n, response, generator=g) * response_mask,
        "returns": torch.randn(n, response, generator=g) * response_mask,
    }, meta={"temperature": 0.7})


def timed(fn, reps: int) -> tuple[float, object]:
    best, out = float("inf"), None
    for _ in range(reps):
        t = time.perf_counter()
        out = fn()
        best = min(best, time.perf_counter() - t)
    return best, out


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default=None, help="an HF directory or a JSON model config (random weights); default: "
                    "the embedded policy's shape, random")
    ap.add_argument("--batch", type=int, default=32, help="rows (episodes) of the step")
    ap.add_argument("--micro", type=int, default=16, help="rows per micro-batch (actor and critic)")
    ap.add_argument("--prefix", type=int, default=250, help="tokens every prompt shares (card listing: ~250)")
    ap.add_argument("--question", type=int, default=24, help="longest per-row prompt tail")
    ap.add_argument("--response", type=int, default=96, help="longest response (policy + environment tokens)")
    ap.add_argument("--reps", type=int, default=3, help="timed repeats of each pass; the fastest is reported")
    ap.add_argument("--device", default="cpu", help="cpu | cuda (on a GPU the shared path is slower: docs/training.md)")
    ap.add_argument("--out", default=None, help="write the figures as JSON")
    args = ap.parse_args(argv)

    spec = args.model or EMBEDDED
    vocab = EMBEDDED["vocab_size"] if args.model is None else None
    rows = {}
    for share in (False, True):
        kw = dict(model=spec, device=args.device, lr=1e-6, ppo_mini_batch_size=args.batch,
                  ppo_micro_batch_size=args.micro, share_prompt_prefix=share)
        actor, critic = ActorWorker(worker_config(**kw)), CriticWorker(worker_config("critic", **kw))
        actor.init_model()
        critic.init_model()
        if vocab is None:
            vocab = actor.model.config.get_text_config().vocab_size
        data = make_batch(args.batch, args.prefix, args.question, args.response, vocab, seed=0)
        t_lp, lp = timed(lambda: actor.compute_log_prob(data), args.reps)
        t_val, val = timed(lambda: critic.compute_values(data), args.reps)
        batch = data.union(lp).union(val)
        t_up, _ = timed(lambda: actor.update_actor(batch), args.reps)
        t_cu, _ = timed(lambda: critic.update_critic(batch), args.reps)
        rows[share] = dict(log_prob=t_lp, values=t_val, update_actor=t_up, update_critic=t_cu,
                           old_log_probs=lp.batch["old_log_probs"], value_out=val.batch["values"])
    tokens = int(data.batch["attention_mask"].sum())
    print(f"{args.batch} rows, {tokens} real tokens ({args.prefix} shared a row), micro-batches of {args.micro}, "
          f"{args.device}, {torch.get_num_threads()} threads")
    print(f"{'pass':<14}{'every row s':>12}{'shared s':>10}{'ratio':>8}")
    figures = {}
    for name in ("log_prob", "values", "update_actor", "update_critic"):
        a, b = rows[False][name], rows[True][name]
        figures[name] = dict(every_row_s=a, shared_s=b, ratio=a / b)
        print(f"{name:<14}{a:>12.3f}{b:>10.3f}{a / b:>7.2f}x")
    diff_lp = float((rows[False]["old_log_probs"] - rows[True]["old_log_probs"]).abs().max())
    diff_v = float((rows[False]["value_out"] - rows[True]["value_out"]).abs().max())
    print(f"largest difference: log-prob {diff_lp:.2e}, value {diff_v:.2e} (both computed in the same dtype)")
    if args.out:
        with open(args.out, "w") as f:
            json.dump(dict(args=vars(args), tokens=tokens, passes=figures, max_logprob_diff=diff_lp,
                           max_value_diff=diff_v), f, indent=1)


if __name__ == "__main__":
    main()
